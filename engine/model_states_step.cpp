// The optimizer step of one state set (ModelStates::step): the update of elementwise optimizers (Adam,
// AdamW, CAdam, Lion) piece by piece with the memory-reuse modes, and of per-tensor ones (Lamb) in two
// passes (Note [two-pass step]). NVMe streaming is in model_states_nvme.cpp; one-bit Adam and 0/1 Adam
// in compressed_step.cpp.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/errors.h"
#include "engine/detail/model_states.h"

namespace zs::engine {

// Note [reuse_fp32_param]
// MindSpeed's --reuse-fp32-param, re-derived. The fp32 master weight's bits u are stored as
// w = u + 0x8000 (32-bit unsigned arithmetic): the upper 16 bits of w are the bf16 parameter the model
// computes with, the lower 16 bits a residual kept in a separate 2-byte buffer. Decoding subtracts
// 0x8000 again, so the master is recovered exactly and every optimizer update is the update of the
// same fp32 value as without the mode. Adding 0x8000 before truncating rounds the magnitude to
// nearest with ties away from zero; round-to-nearest-even cannot be used, because an even bf16
// value has 2^16 + 1 fp32 values rounding to it (both half-way points) and an odd one 2^16 - 1, so
// 16 bits could not tell them apart. The bf16 parameter therefore differs from the mode-off
// parameter (RNE) exactly when the master's low 16 bits are 0x8000 and its bf16 upper half is even
// (about one element in 2^17 per step); everything else is bit for bit the same. Saving: the bf16
// master buffer (4 bytes per stepped element) becomes a 2-byte residual.
void encode_master(const float* master, uint16_t* param_bf16, uint16_t* residual, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, master + i, sizeof(u));
    const uint32_t w = u + 0x8000u;
    param_bf16[i] = static_cast<uint16_t>(w >> 16);
    residual[i] = static_cast<uint16_t>(w & 0xFFFFu);
  }
}

void decode_master(const uint16_t* param_bf16, const uint16_t* residual, float* master, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t u = ((static_cast<uint32_t>(param_bf16[i]) << 16) | residual[i]) - 0x8000u;
    std::memcpy(master + i, &u, sizeof(u));
  }
}

void ModelStates::step(optim::Optimizer& optimizer, const optim::StepContext& ctx) {
  optim::StepContext c = ctx;
  // Note [expert parameters]: an expert's averaged gradient is E times the model's.
  c.grad_scale = static_cast<float>(ctx.grad_scale * grad_factor());
  if (optimizer.tensor_sums() > 0) {
    step_tensorwise(optimizer, c);
  } else if (nvme_) {
    step_streamed(optimizer, c);
  } else {
    memory::run_kernel(backend(), [&] { step_elementwise(optimizer, c); });
  }
}

void ModelStates::step_piece(optim::Optimizer& optimizer, const optim::StepContext& ctx, size_t at, size_t n,
                             bool decay, int t, float* master, std::span<void* const> states, void* low) const {
  optim::ParamChunk chunk{.master = {master, n}, .grad = grad_f32(at, n, t), .states = states};
  chunk.apply_weight_decay = decay;
  if (low != nullptr && mixed()) {
    chunk.low_precision = low;
    chunk.low_precision_dtype = env_->dtype;
  }
  optimizer.step(chunk, ctx);
  // fp32 with a separate master: the parameters are a plain copy of it.
  if (low != nullptr && !mixed()) std::memcpy(low, master, n * sizeof(float));
}

void ModelStates::step_elementwise(optim::Optimizer& optimizer, const optim::StepContext& ctx) {
  const size_t n_states = states_.size();
  for_each_piece(step_range(), [&](size_t at, size_t n, bool decay, int t) {
    void* states[kMaxStates];
    for (size_t k = 0; k < n_states; ++k) states[k] = state_at(k, at);
    with_master(at, n, t, [&](float* master, void* low) {
      step_piece(optimizer, ctx, at, n, decay, t, master, {states, n_states}, low);
    });
  });
}

// Note [two-pass step]
// An optimizer whose update needs sums over each whole parameter tensor (Lamb's trust ratio; Note
// [per-tensor optimizers] in optim/lamb.h) cannot step a shard piece by piece: a ZeRO shard cuts
// parameters across ranks, and pieces cut them within a rank. So its step is two passes over the
// same pieces (for_each_piece's cut: slot by slot, kPieceElements from each slot part's start).
// Pass 1 advances the states and writes each piece's sums into its own row (no thread shares a row;
// the rows of a slot are then added in piece order, so the result does not depend on the thread
// count). The per-slot sums go through fp32, as the gradient norm does, and at stages 1-3 one
// allreduce of slots x tensor_sums() floats over the set's partition group (dp, or edp for experts:
// Note [expert parameters]) makes them the whole tensors'
// sums on every rank (stage 0 steps every element on every rank: its sums are whole already; one
// rank rounds through fp32 too, so every stage of one rank gives the same bits). With tensor
// parallelism a second allreduce over tp adds the TP shards' slices (Note [tensor-parallel parameters]
// in engine/engine.h). Pass 2 applies the
// update with its slot's totals through with_master, like the elementwise step. Over the measuring
// backend both passes are skipped (kernels) and the allreduce moves nothing. NVMe offload streams
// sub-groups once per step, so it is refused for these optimizers (Engine::Impl's constructor).
void ModelStates::step_tensorwise(optim::Optimizer& optimizer, const optim::StepContext& ctx) {
  const size_t k = optimizer.tensor_sums();
  ZS_ASSERT(k <= kMaxStates, "{} needs {} sums per tensor (at most {})", optimizer.name(), k, kMaxStates);
  const size_t n_states = states_.size();
  const memory::ShardRange range = step_range();
  struct Piece {
    size_t slot, at, n;
    bool decay;
  };
  std::vector<Piece> pieces;
  const auto slots = layout.slots();
  for (size_t i = 0; i < slots.size(); ++i) {
    const memory::ShardRange part = slots[i].range().intersect(range);
    const bool decay = !slots[i].param->has_tag(nn::kTagNoWeightDecay);
    for (size_t off = 0; off < part.size; off += kPieceElements) {
      pieces.push_back({i, part.offset + off, std::min(kPieceElements, part.size - off), decay});
    }
  }
  const int threads = env_->threads();
  auto states_at = [&](size_t at, void** out) {
    for (size_t j = 0; j < n_states; ++j) out[j] = state_at(j, at);
  };
  std::vector<double> piece_sums(pieces.size() * k, 0.0);
  memory::run_kernel(backend(), [&] {
    parallel_for_threads(threads, static_cast<int64_t>(pieces.size()), 1, [&](int64_t b, int64_t e, int t) {
      for (int64_t p = b; p < e; ++p) {
        const Piece& pc = pieces[static_cast<size_t>(p)];
        void* states[kMaxStates];
        states_at(pc.at, states);
        // Read only (the optimizer's first pass does not write the master).
        float* master = const_cast<float*>(master_view(pc.at, pc.n, t));
        optim::ParamChunk chunk{.master = {master, pc.n}, .grad = grad_f32(pc.at, pc.n, t), .states = {states, n_states}};
        chunk.apply_weight_decay = pc.decay;
        optimizer.accumulate_tensor_sums(chunk, ctx, std::span<double>(piece_sums).subspan(static_cast<size_t>(p) * k, k));
      }
    });
  });
  std::vector<float> slot_sums(slots.size() * k, 0.0f);
  {
    std::vector<double> exact(slot_sums.size(), 0.0);
    for (size_t p = 0; p < pieces.size(); ++p) {
      for (size_t j = 0; j < k; ++j) exact[pieces[p].slot * k + j] += piece_sums[p * k + j];
    }
    for (size_t i = 0; i < exact.size(); ++i) slot_sums[i] = static_cast<float>(exact[i]);
  }
  if (plan.stage > 0 && group.size() > 1 && !slot_sums.empty()) group.allreduce(memory::Tensor::of(std::span<float>(slot_sums)));
  if (env_->tp != nullptr && !slot_sums.empty()) {
    // A TP shard's sums are its slice's: summed over tp they are the whole tensor's. A replicated
    // parameter's are whole already; tp rank 0's go in, the others add zeros (Note [tensor-parallel
    // parameters] in engine/engine.h), so every tp rank applies the same bits to its replica.
    for (size_t i = 0; i < slots.size(); ++i) {
      if (!env_->counts(*slots[i].param)) std::fill_n(slot_sums.begin() + static_cast<ptrdiff_t>(i * k), k, 0.0f);
    }
    env_->tp->allreduce(memory::Tensor::of(std::span<float>(slot_sums)));
  }
  memory::run_kernel(backend(), [&] {
    parallel_for_threads(threads, static_cast<int64_t>(pieces.size()), 1, [&](int64_t b, int64_t e, int t) {
      for (int64_t p = b; p < e; ++p) {
        const Piece& pc = pieces[static_cast<size_t>(p)];
        void* states[kMaxStates];
        states_at(pc.at, states);
        double totals[kMaxStates] = {};
        for (size_t j = 0; j < k; ++j) totals[j] = slot_sums[pc.slot * k + j];
        with_master(pc.at, pc.n, t, [&](float* master, void* low) {
          optim::ParamChunk chunk{.master = {master, pc.n}, .grad = {}, .states = {states, n_states}};
          chunk.apply_weight_decay = pc.decay;
          if (low != nullptr && mixed()) {
            chunk.low_precision = low;
            chunk.low_precision_dtype = env_->dtype;
          }
          optimizer.apply_tensor_sums(chunk, ctx, std::span<const double>(totals, k));
          if (low != nullptr && !mixed()) std::memcpy(low, master, pc.n * sizeof(float));
        });
      }
    });
  });
}

}  // namespace zs::engine
