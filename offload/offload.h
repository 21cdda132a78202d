// zs::offload: moving model states between host memory and NVMe (ZeRO-Offload / ZeRO-Infinity).
//
//   aligned_buffer.h  AlignedBuffer: 4096-aligned host memory (RAII, tracked, optionally pinned)
//   aio.h             AioConfig (DeepSpeed's "aio"), AsyncFile: io_uring + O_DIRECT reads and writes,
//                     buffered fallback, short-transfer resubmission, FaultPlan for tests
//   swap_space.h      SwapSpace: a rank's preflighted, preallocated, self-removing swap file; SwapRegion
//   swapper.h         PipelinedSwapper: sub-groups streamed through host buffers, disk overlapped with
//                     compute; host_budget_bytes() states the host memory up front
//
//   zs::offload::SwapSpace swap(nvme_path, rank, "optimizer", bytes, aio, &tracker);
//   zs::offload::PipelinedSwapper swapper(groups, {.buffer_count = 3, .tracker = &tracker});
//   swapper.run([&](size_t g, std::span<std::span<std::byte>> items) { /* step sub-group g */ });
//
// See docs/offload.md for the design and the DeepSpeed keys.
#pragma once

#include "offload/aio.h"
#include "offload/aligned_buffer.h"
#include "offload/swap_space.h"
#include "offload/swapper.h"
