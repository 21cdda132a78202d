// The data-movement operations of backends whose memory is host RAM (cpu, guarded), on plain
// pointers. Large ranges are split over `threads` threads in pieces whose cut does not depend on the
// thread count, so results are the same bits for any thread count. Internal to memory/.
#pragma once

#include <cstddef>

#include "memory/dtype.h"

namespace zs::memory::detail {

// The page the host backends map and guard by.
inline constexpr size_t kPage = 4096;
inline size_t page_round(size_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

void host_copy(void* dst, const void* src, size_t bytes, int threads);
void host_convert(void* dst, DType dst_type, const void* src, DType src_type, size_t n, int threads);
// dst[i] += src[i] in fp32, rounded once to `dtype`.
void host_accumulate(void* dst, const void* src, DType dtype, size_t n, int threads);
void host_fill_zero(void* dst, size_t bytes, int threads);
void host_fill(float* dst, float value, size_t n, int threads);

}  // namespace zs::memory::detail
