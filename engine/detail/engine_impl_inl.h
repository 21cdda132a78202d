// Template members of Engine::Impl (engine/detail/engine_impl.h). Internal.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/parallel.h"
#include "nn/threads.h"

namespace zs::engine {

// reuse_fp32_param's encoding (Note [reuse_fp32_param] in engine_step.cpp): the master's bits u are
// stored as w = u + 0x8000, upper half in the bf16 parameter, lower half in the residual.
void encode_master(const float* master, uint16_t* param_bf16, uint16_t* residual, size_t n);
void decode_master(const uint16_t* param_bf16, const uint16_t* residual, float* master, size_t n);

template <typename F>
void Engine::Impl::with_master(const StateSet& s, size_t i, size_t n, int t, F&& fn) {
  if (!reuse_) {
    float* master = master_at(s, i);
    if (!mixed() && separate_master_) {
      // fp32 with the master offloaded: the parameters are a plain copy of it.
      fn(master, static_cast<void*>(nullptr));
      backend_->copy(param_at(s, i), s.params.tier(), master, s.master.tier(), n * sizeof(float));
      return;
    }
    if (mixed() && step_on_host() && s.params.tier() == memory::Tier::kDevice) {
      // The host step writes the new parameters beside it, then they cross to the device.
      void* low = low_scratch_[static_cast<size_t>(t)].data();
      fn(master, low);
      backend_->copy(param_at(s, i), memory::Tier::kDevice, low, memory::Tier::kHost, n * elem_);
      return;
    }
    fn(master, mixed() ? static_cast<void*>(param_at(s, i)) : nullptr);
    return;
  }
  float* m = master_scratch_[static_cast<size_t>(t)].data();
  auto* hi = reinterpret_cast<uint16_t*>(param_at(s, i));
  auto* lo = static_cast<uint16_t*>(s.residual.data()) + (i - s.step_range().offset);
  decode_master(hi, lo, m, n);
  fn(m, static_cast<void*>(nullptr));
  encode_master(m, hi, lo, n);
}

template <typename F>
void Engine::Impl::for_each_span(memory::ShardRange range, size_t piece, F&& fn) const {
  const auto pieces = static_cast<int64_t>((range.size + piece - 1) / piece);
  parallel_for_threads(static_cast<int>(grad_scratch_.size()), pieces, 1, [&](int64_t b, int64_t e, int t) {
    for (int64_t p = b; p < e; ++p) {
      const size_t off = static_cast<size_t>(p) * piece;
      fn(range.offset + off, std::min(piece, range.size - off), t);
    }
  });
}

template <typename F>
void Engine::Impl::for_each_piece(const StateSet& s, memory::ShardRange range, F&& fn) {
  for (const ParamSlot& slot : s.layout.slots()) {
    const memory::ShardRange part = slot.range().intersect(range);
    if (part.empty()) continue;
    const bool decay = !slot.param->has_tag(nn::kTagNoWeightDecay);
    for_each_span(part, kPieceElements, [&](size_t at, size_t n, int t) { fn(at, n, decay, t); });
  }
}

}  // namespace zs::engine
