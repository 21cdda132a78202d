// zs::memory: where model states live and how they are typed, sharded, placed and counted.
//
//   dtype.h         DType (fp32/bf16/fp16/int32), scalar and SIMD conversions (RNE, NaN/Inf kept)
//   cpu_features.h  IsaLevel, cpu_has_avx512(), cpu_has_avx2_f16c(), best_isa(): run-time kernel choice
//   tensor.h        Tensor: typed, shaped views of memory
//   shard.h         ShardRange {offset, size} and ZeRO partition math (uneven sizes, alignment)
//   category.h      Category (params, grads, ...) and Tier (device, host, nvme) with JSON names
//   backend.h       Backend interface (segments, counted data movement, kernel scopes) and Segment;
//                   cpu_backend.h, guarded_backend.h (faults on stray access), measuring_backend.h
//   shared_mapping.h  SharedMapping: memfd memory the other ranks of a node can map (shared arena)
//   alloc_policy.h  Lifetime, arena statistics, TwoEndedBestFit / SinglePoolBestFit placement
//   allocator.h     DeviceAllocator (fixed capacity, pools by lifetime) and RAII DeviceBlock
//   tracker.h       MemoryTracker: bytes by category and tier, current and peak; TrackedBytes
//   alloc_trace.h   allocation traces: record, save/load, replay into any policy
//   caching_policy.h  a model of PyTorch's CUDA caching allocator, to replay traces into
//
//   zs::memory::CpuBackend backend(device_bytes);
//   zs::memory::MemoryTracker tracker;
//   zs::memory::DeviceAllocator alloc(backend, device_bytes, &tracker);
//   auto grads = alloc.allocate_tensor({n}, DType::kF32, Category::kGrads, Lifetime::kPersistent);
#pragma once

#include "memory/alloc_policy.h"
#include "memory/alloc_trace.h"
#include "memory/allocator.h"
#include "memory/caching_policy.h"
#include "memory/backend.h"
#include "memory/category.h"
#include "memory/cpu_backend.h"
#include "memory/cpu_features.h"
#include "memory/guarded_backend.h"
#include "memory/measuring_backend.h"
#include "memory/peak_flops.h"
#include "memory/dtype.h"
#include "memory/shard.h"
#include "memory/shared_mapping.h"
#include "memory/tensor.h"
#include "memory/tracker.h"
