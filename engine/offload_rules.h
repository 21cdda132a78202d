// The offload rules the engine follows and the estimator reads, in one place (Note [offload] in
// engine/model_states_nvme.cpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "optim/optimizer.h"

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

// Note [NVMe sub-group items]
// A sub-group of n stepped elements is one buffer per swap item, in this order: the fp32 master (4n
// bytes) and each optimizer state (spec.bytes_for(n)) when offload_optimizer is nvme, then the
// training-dtype parameters (b n) when offload_param is nvme. The engine makes its swap items from
// it, the step and the initialising pass find their buffers by name through it, and the estimator
// sizes the swapper's host buffers from it: the order is written here only.
struct NvmeSubGroupItems {
  bool optimizer = false;                  // the master and the states are on NVMe
  std::vector<optim::StateSpec> states;    // the optimizer's states (with `optimizer`)
  size_t param_bytes = 0;                  // bytes per parameter element on NVMe; 0: not on NVMe

  enum class Kind : uint8_t { kMaster, kState, kParams };
  struct Item {
    Kind kind;
    size_t state = 0;     // kState: the state's index
    uint64_t offset = 0;  // bytes from the region's start of a sub-group at element `from`
    uint64_t bytes = 0;   // of a sub-group of n elements
  };
  // The items of the sub-group of n elements starting at stepped element `from`, in swapper order.
  std::vector<Item> items(uint64_t from, uint64_t n) const {
    std::vector<Item> out;
    if (optimizer) {
      out.push_back({Kind::kMaster, 0, from * sizeof(float), n * sizeof(float)});
      for (size_t k = 0; k < states.size(); ++k) {
        out.push_back({Kind::kState, k, from / states[k].elements_per_value * states[k].value_bytes, states[k].bytes_for(n)});
      }
    }
    if (param_bytes > 0) out.push_back({Kind::kParams, 0, from * param_bytes, n * param_bytes});
    return out;
  }

  // One sub-group's buffers by name (nullptr: not on NVMe).
  struct Buffers {
    float* master = nullptr;
    std::vector<std::byte*> states;
    std::byte* params = nullptr;
  };
  Buffers buffers(std::span<std::span<std::byte>> bufs) const {
    Buffers b;
    size_t item = 0;
    if (optimizer) {
      b.master = reinterpret_cast<float*>(bufs[item++].data());
      for (size_t k = 0; k < states.size(); ++k) b.states.push_back(bufs[item++].data());
    }
    if (param_bytes > 0) b.params = bufs[item++].data();
    return b;
  }
};

}  // namespace zs::engine
