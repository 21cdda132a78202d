// Template members of ModelStates (engine/detail/model_states.h). Internal.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/parallel.h"
#include "nn/threads.h"

namespace zs::engine {

template <typename F>
void ModelStates::with_master(size_t i, size_t n, int t, F&& fn) const {
  StateEnv& env = *env_;
  if (!plan.reuse_fp32_param) {
    float* master = master_at(i);
    if (!mixed() && plan.separate_master) {
      // fp32 with the master offloaded: the parameters are a plain copy of it.
      fn(master, static_cast<void*>(nullptr));
      backend().copy(param_at(i), params_.tier(), master, master_.tier(), n * sizeof(float));
      return;
    }
    if (mixed() && step_on_host() && params_.tier() == memory::Tier::kDevice) {
      // The host step writes the new parameters beside it, then they cross to the device.
      void* low = env.low_scratch[static_cast<size_t>(t)].data();
      fn(master, low);
      backend().copy(param_at(i), memory::Tier::kDevice, low, memory::Tier::kHost, n * env.elem);
      return;
    }
    fn(master, mixed() ? static_cast<void*>(param_at(i)) : nullptr);
    return;
  }
  float* m = env.master_scratch[static_cast<size_t>(t)].data();
  auto* hi = reinterpret_cast<uint16_t*>(param_at(i));
  uint16_t* lo = residual_at(i);
  decode_master(hi, lo, m, n);
  fn(m, static_cast<void*>(nullptr));
  encode_master(m, hi, lo, n);
}

template <typename F>
void ModelStates::for_each_span(memory::ShardRange range, size_t piece, F&& fn) const {
  const auto pieces = static_cast<int64_t>((range.size + piece - 1) / piece);
  parallel_for_threads(env_->threads(), pieces, 1, [&](int64_t b, int64_t e, int t) {
    for (int64_t p = b; p < e; ++p) {
      const size_t off = static_cast<size_t>(p) * piece;
      fn(range.offset + off, std::min(piece, range.size - off), t);
    }
  });
}

template <typename F>
void ModelStates::for_each_piece(memory::ShardRange range, F&& fn) const {
  for (const ParamSlot& slot : layout.slots()) {
    const memory::ShardRange part = slot.range().intersect(range);
    if (part.empty()) continue;
    const bool decay = !slot.param->has_tag(nn::kTagNoWeightDecay);
    for_each_span(part, kPieceElements, [&](size_t at, size_t n, int t) { fn(at, n, decay, t); });
  }
}

}  // namespace zs::engine
