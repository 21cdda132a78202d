// The offload rules the engine follows and the estimator reads, in one place (Note [offload] in
// engine/engine_offload.cpp).
#pragma once

#include <algorithm>
#include <cstddef>

namespace zs::engine {

// Sub-group boundaries of offloaded states, in elements from the stepped range's start: every swap
// transfer then starts on a 4096-byte boundary (fp32 master: 1024 elements; bf16: 2048; CAdam's int8
// values: 4096; its fp32 scale per 32 elements: 32768).
inline constexpr size_t kSubGroupAlign = 32768;

// Elements of one sub-group of the NVMe step: sub_group_size rounded up to kSubGroupAlign, capped at
// ceil(stepped / buffer_count) rounded likewise, so the swapper's buffer_count buffers never hold more
// than the states themselves (NVMe offload never needs more host memory than CPU offload).
inline size_t offload_sub_group_elements(size_t stepped, size_t sub_group_size, size_t buffer_count) {
  auto round_up = [](size_t v) { return (v + kSubGroupAlign - 1) / kSubGroupAlign * kSubGroupAlign; };
  const size_t cap = round_up(std::max<size_t>(1, (stepped + buffer_count - 1) / buffer_count));
  return std::min(round_up(sub_group_size), cap);
}

// Stage 3 with parameters on NVMe: the prefetch window in elements. The gathers read ahead into host
// staging buffers, so DeepSpeed's bounds on that host memory cap stage3_prefetch_bucket_size: the
// reads in flight (offload_param buffer_count x buffer_size) and the parameters held in host memory
// (offload_param max_in_cpu). The module being fetched is read whatever the window: it has to run.
inline size_t nvme_prefetch_window(size_t prefetch_elements, size_t buffer_count, size_t buffer_size, size_t max_in_cpu) {
  return std::min({prefetch_elements, buffer_count * buffer_size, max_in_cpu});
}

}  // namespace zs::engine
