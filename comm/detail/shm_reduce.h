// The element-wise sums of the shared-memory collectives (comm/detail/shm.h): dst = the sum of `srcs`
// in source order, accumulated in fp32 (int32 for int32), optionally divided, rounded once to the
// destination type. Per-ISA kernels (zs_isa_sources) chosen at run time like memory's conversions
// (memory/cpu_features.h); every kernel gives the same bits as the scalar one (same order of additions,
// one division, memory/simd_bf16.h's rounding). Internal to comm.
#pragma once

#include <cstddef>
#include <span>

#include "memory/cpu_features.h"
#include "memory/dtype.h"

namespace zs::comm::detail {

// dst[i] = (((srcs[0][i] + srcs[1][i]) + srcs[2][i]) + ...) / divisor, for i < n.
//  - `src_type` is that of every source; `dst_type` is src_type, or kF32 for a bf16/fp16 src_type
//    (partial sums kept in fp32 for a further level), or bf16/fp16 for fp32 sources (those sums
//    rounded back). kI32 only to kI32, with divisor 1 (wrapping sums).
//  - divisor 1 skips the division (a sum); else the fp32 accumulator is divided once (kAverage).
//  - dst may be one of the sources when both have the same type (each element is read before written);
//    otherwise no overlap. srcs.size() >= 1.
void reduce_sum(std::span<const void* const> srcs, memory::DType src_type, void* dst, memory::DType dst_type,
                size_t n, float divisor);
// The same with an explicit kernel (tests, benchmarks); `isa` must be supported here.
void reduce_sum(std::span<const void* const> srcs, memory::DType src_type, void* dst, memory::DType dst_type,
                size_t n, float divisor, memory::IsaLevel isa);

// memcpy of `bytes` to memory nobody reads soon: non-temporal (streaming) stores, which skip the read
// for ownership a normal store makes of each destination line (a third of a copy's memory traffic)
// and keep the destination out of the caches; fenced, so its stores are done when it returns. For
// the shared-memory collectives' final writes of large outputs (comm_bench: the copy bound column).
// No overlap.
void copy_streaming(void* dst, const void* src, size_t bytes);

// One kernel per ISA (raw arguments; float types only: the dispatcher handles int32). The avx2 kernel
// covers whole vectors of 8 elements only (the dispatcher gives the tail to the scalar one).
using ReduceKernel = void (*)(const void* const* srcs, size_t n_src, memory::DType src_type, void* dst,
                              memory::DType dst_type, size_t n, float divisor);
void reduce_sum_scalar(const void* const* srcs, size_t n_src, memory::DType src_type, void* dst,
                       memory::DType dst_type, size_t n, float divisor);
void reduce_sum_avx2(const void* const* srcs, size_t n_src, memory::DType src_type, void* dst,
                     memory::DType dst_type, size_t n, float divisor);
void reduce_sum_avx512(const void* const* srcs, size_t n_src, memory::DType src_type, void* dst,
                       memory::DType dst_type, size_t n, float divisor);

// The (source, destination) float type pairs reduce_sum takes, for the per-ISA kernels:
// calls kernel.template operator()<S, D>() with the pair's types (fp32 -> bf16/fp16/fp32, bf16 -> fp32/bf16,
// fp16 -> fp32/fp16); int32 is the dispatcher's. Each ISA's file passes a lambda over its own templates,
// so every instantiation stays in the file compiled for that ISA.
template <typename Kernel>
void for_float_type_pair(memory::DType src_type, memory::DType dst_type, Kernel&& kernel) {
  using memory::DType;
  switch (src_type) {
    case DType::kF32:
      if (dst_type == DType::kBF16) return kernel.template operator()<DType::kF32, DType::kBF16>();
      if (dst_type == DType::kF16) return kernel.template operator()<DType::kF32, DType::kF16>();
      return kernel.template operator()<DType::kF32, DType::kF32>();
    case DType::kBF16:
      if (dst_type == DType::kF32) return kernel.template operator()<DType::kBF16, DType::kF32>();
      return kernel.template operator()<DType::kBF16, DType::kBF16>();
    case DType::kF16:
      if (dst_type == DType::kF32) return kernel.template operator()<DType::kF16, DType::kF32>();
      return kernel.template operator()<DType::kF16, DType::kF16>();
    case DType::kI32: break;
  }
}

}  // namespace zs::comm::detail
