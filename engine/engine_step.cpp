// Engine::step: finishing the reductions, the gradient norm, clipping, fp16 overflow handling, and
// the update of elementwise optimizers (Adam, AdamW, CAdam, Lion) with the memory-reuse modes, and of
// per-tensor ones (Lamb) in two passes (Note [two-pass step]). One-bit Adam
// and 0/1 Adam are in compressed_step.cpp.
#include <chrono>
#include <cmath>
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/clock.h"
#include "core/errors.h"
#include "engine/detail/engine_impl.h"
#include "optim/clip.h"

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

void Engine::Impl::fill_grad32(StateSet& s) {
  // release_fp32_grad off: one conversion pass into the persistent fp32 copy, before the norm.
  const memory::ShardRange range = s.grad32_range();
  backend_->convert(f32_at(s.grad32.data(), range, range.offset), s.grad32.tier(), memory::DType::kF32,
                    grad_at(s, range.offset), s.grads.tier(), dtype_, range.size);
}

void Engine::Impl::step_piece(const StateSet& s, const optim::StepContext& ctx, size_t at, size_t n, bool decay, int t,
                              float* master, std::span<void* const> states, void* low) {
  optim::ParamChunk chunk{.master = {master, n}, .grad = grad_f32(s, at, n, t), .states = states};
  chunk.apply_weight_decay = decay;
  if (low != nullptr && mixed()) {
    chunk.low_precision = low;
    chunk.low_precision_dtype = dtype_;
  }
  optimizer_->step(chunk, ctx);
  // fp32 with a separate master: the parameters are a plain copy of it.
  if (low != nullptr && !mixed()) std::memcpy(low, master, n * sizeof(float));
}

void Engine::Impl::step_elementwise(StateSet& s, const optim::StepContext& ctx) {
  const size_t n_states = s.states.size();
  for_each_piece(s, s.step_range(), [&](size_t at, size_t n, bool decay, int t) {
    void* states[kMaxStates];
    for (size_t k = 0; k < n_states; ++k) states[k] = state_at(s, k, at);
    with_master(s, at, n, t, [&](float* master, void* low) { step_piece(s, ctx, at, n, decay, t, master, {states, n_states}, low); });
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
// rank rounds through fp32 too, so every stage of one rank gives the same bits). Pass 2 applies the
// update with its slot's totals through with_master, like the elementwise step. Over the measuring
// backend both passes are skipped (kernels) and the allreduce moves nothing. NVMe offload streams
// sub-groups once per step, so it is refused for these optimizers (Engine::Impl's constructor).
void Engine::Impl::step_tensorwise(StateSet& s, const optim::StepContext& ctx) {
  const size_t k = optimizer_->tensor_sums();
  ZS_ASSERT(k <= kMaxStates, "{} needs {} sums per tensor (at most {})", optimizer_->name(), k, kMaxStates);
  const size_t n_states = s.states.size();
  const memory::ShardRange range = s.step_range();
  struct Piece {
    size_t slot, at, n;
    bool decay;
  };
  std::vector<Piece> pieces;
  const auto slots = s.layout.slots();
  for (size_t i = 0; i < slots.size(); ++i) {
    const memory::ShardRange part = slots[i].range().intersect(range);
    const bool decay = !slots[i].param->has_tag(nn::kTagNoWeightDecay);
    for (size_t off = 0; off < part.size; off += kPieceElements) {
      pieces.push_back({i, part.offset + off, std::min(kPieceElements, part.size - off), decay});
    }
  }
  const int threads = static_cast<int>(grad_scratch_.size());
  auto states_at = [&](size_t at, void** out) {
    for (size_t j = 0; j < n_states; ++j) out[j] = state_at(s, j, at);
  };
  std::vector<double> piece_sums(pieces.size() * k, 0.0);
  memory::run_kernel(*backend_, [&] {
    parallel_for_threads(threads, static_cast<int64_t>(pieces.size()), 1, [&](int64_t b, int64_t e, int t) {
      for (int64_t p = b; p < e; ++p) {
        const Piece& pc = pieces[static_cast<size_t>(p)];
        void* states[kMaxStates];
        states_at(pc.at, states);
        float* master = nullptr;
        if (reuse_) {  // read only: decoded into the thread's scratch, nothing to encode back
          master = master_scratch_[static_cast<size_t>(t)].data();
          decode_master(reinterpret_cast<const uint16_t*>(param_at(s, pc.at)),
                        static_cast<const uint16_t*>(s.residual.data()) + (pc.at - range.offset), master, pc.n);
        } else {
          master = master_at(s, pc.at);
        }
        optim::ParamChunk chunk{.master = {master, pc.n}, .grad = grad_f32(s, pc.at, pc.n, t), .states = {states, n_states}};
        chunk.apply_weight_decay = pc.decay;
        optimizer_->accumulate_tensor_sums(chunk, ctx, std::span<double>(piece_sums).subspan(static_cast<size_t>(p) * k, k));
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
  if (stage_ > 0 && s.group.size() > 1 && !slot_sums.empty()) s.group.allreduce(memory::Tensor::of(std::span<float>(slot_sums)));
  memory::run_kernel(*backend_, [&] {
    parallel_for_threads(threads, static_cast<int64_t>(pieces.size()), 1, [&](int64_t b, int64_t e, int t) {
      for (int64_t p = b; p < e; ++p) {
        const Piece& pc = pieces[static_cast<size_t>(p)];
        void* states[kMaxStates];
        states_at(pc.at, states);
        double totals[kMaxStates] = {};
        for (size_t j = 0; j < k; ++j) totals[j] = slot_sums[pc.slot * k + j];
        with_master(s, pc.at, pc.n, t, [&](float* master, void* low) {
          optim::ParamChunk chunk{.master = {master, pc.n}, .grad = {}, .states = {states, n_states}};
          chunk.apply_weight_decay = pc.decay;
          if (low != nullptr && mixed()) {
            chunk.low_precision = low;
            chunk.low_precision_dtype = dtype_;
          }
          optimizer_->apply_tensor_sums(chunk, ctx, std::span<const double>(totals, k));
          if (low != nullptr && !mixed()) std::memcpy(low, master, pc.n * sizeof(float));
        });
      }
    });
  });
}

double Engine::Impl::grad_sum_of_squares(const StateSet& set, memory::ShardRange range) {
  // Per-piece sums added in piece order: the same bits for any thread count.
  std::vector<double> piece_sums((range.size + kPieceElements - 1) / kPieceElements);
  memory::run_kernel(*backend_, [&] {
    for_each_span(range, kPieceElements, [&](size_t at, size_t n, int t) {
      piece_sums[(at - range.offset) / kPieceElements] = optim::sum_of_squares(grad_f32(set, at, n, t));
    });
  });
  double sum_sq = 0.0;
  for (double v : piece_sums) sum_sq += v;
  // Experts: the reduced gradients are averaged over edp; the model's gradient is that / E.
  const double f = set.grad_factor();
  return f == 1.0 ? sum_sq : sum_sq * f * f;
}

void Engine::Impl::step_set(StateSet& set, const optim::StepContext& ctx) {
  optim::StepContext c = ctx;
  // Note [expert parameters]: an expert's averaged gradient is E times the model's.
  c.grad_scale = static_cast<float>(ctx.grad_scale * set.grad_factor());
  if (optimizer_->tensor_sums() > 0) {
    step_tensorwise(set, c);
  } else if (set.nvme) {
    step_offloaded(set, c);
  } else {
    memory::run_kernel(*backend_, [&] { step_elementwise(set, c); });
  }
}

bool Engine::step() {
  Impl& s = *impl_;
  if (!s.backward_since_step_) [[unlikely]] {
    throw UsageError(model_.forward_pending()
                         ? "Engine::step() after a forward() without its backward(): call backward() first (each "
                           "micro-batch is forward(batch), backward(), step())"
                         : "Engine::step() without a backward() since the last step(): step() follows each backward(); "
                           "a second step() would apply no new gradients");
  }
  s.backward_since_step_ = false;
  if (s.micro_step_ < config_.batch.gradient_accumulation_steps) return false;
  double t0 = now_seconds();
  {
    memory::DeviceAccess access(*s.backend_);
    for (auto& set : s.sets_) set->reducer->wait_all();
  }
  s.reductions_access_.reset();
  const double accumulation = static_cast<double>(config_.batch.gradient_accumulation_steps);
  const int64_t t = s.steps_taken_ + 1;
  const bool local = s.compressed_ && !s.exact_gradients(t);
  if (s.keep_fp32_grads_) {
    for (auto& set : s.sets_) s.fill_grad32(*set);
  }

  // One pass over this rank's gradients gives its part of the squared norm; a non-finite sum is an
  // fp16 overflow (an Inf/NaN part makes the agreed total non-finite on every rank). Local gradients
  // (a compressing step) are whole on every rank: their norm is the root mean square over the ranks
  // of each rank's local norm. With expert parameters every element of the world's model is counted
  // exactly once: at stages 1-3 each rank's shards (of the dense layout over dp, of an expert layout
  // over its edp group, and the EP ranks hold different experts), at stage 0 each set's whole
  // gradients on its group's rank 0 only; the parts are summed over dp (Note [expert parameters]).
  double sum_sq = 0.0;
  for (auto& set : s.sets_) {
    if (s.has_experts() && s.stage_ == 0 && set->group.rank() != 0) continue;
    sum_sq += s.grad_sum_of_squares(*set, local ? set->grad_range() : set->step_range());
  }
  // One small allreduce agrees on both the loss total (every micro-batch has the same number of
  // samples, so the global mean is the total over all of them) and, where the norm is not local
  // already, the squared norm. Stage 0 holds every reduced gradient: its local sum is the total.
  const bool agree_norm = s.stage_ > 0 || local || s.has_experts();
  float agreed[2] = {static_cast<float>(s.loss_sum_), agree_norm ? static_cast<float>(sum_sq) : 0.0f};
  if (group_.size() > 1) group_.allreduce(memory::Tensor::of(std::span<float>(agreed, 2)));
  const float loss_total = agreed[0];
  // The agreed norm went through fp32; so does the local one, so every stage and world size of one
  // rank clips with the same bits.
  sum_sq = agree_norm ? agreed[1] : static_cast<float>(sum_sq);
  if (local) sum_sq /= group_.size();
  const double loss_scale = s.scaler_.scale();
  const double unscale = 1.0 / loss_scale;  // the reductions averaged over ranks already
  const bool overflow = !std::isfinite(sum_sq);
  const double grad_norm = overflow ? sum_sq : std::sqrt(sum_sq) * unscale;
  const bool skipped = s.scaler_.update(overflow);

  StepReport report;
  report.loss = loss_total / (accumulation * group_.size());
  report.grad_norm = grad_norm;
  report.loss_scale = loss_scale;
  report.skipped = skipped;
  report.lr = s.schedule_.lr_at(s.steps_taken_);
  report.compressed = local;
  if (!skipped) {
    const double coef = optim::clip_coefficient(grad_norm, config_.gradient_clipping);
    const optim::StepContext step_ctx{.step = t,
                                      .lr = report.lr,
                                      .grad_scale = static_cast<float>(unscale * coef),
                                      .betas = s.schedule_.betas_at(s.steps_taken_)};
    if (s.compressed_) {
      s.step_compressed(step_ctx);
    } else {
      for (auto& set : s.sets_) s.step_set(*set, step_ctx);
    }
    ++s.steps_taken_;
    for (auto& set : s.sets_) {
      if (s.stage_ == 1 || s.stage_ == 2) s.allgather_params(*set);
      if (set->gatherer) {
        memory::DeviceAccess access(*s.backend_);  // drops gathered buffers in device memory
        set->gatherer->invalidate();
      }
    }
  }
  for (auto& set : s.sets_) s.backend_->fill_zero(set->grads.data(), set->grads.tier(), set->grads.size());
  report.forward_s = s.forward_s_;
  report.backward_s = s.backward_s_;
  report.optimizer_s = now_seconds() - t0;
  const uint64_t sent = group_.counters().bytes_sent;
  report.comm_bytes_sent = sent - s.bytes_sent_at_step_start_;
  s.bytes_sent_at_step_start_ = sent;
  uint64_t grad_sent = 0;
  for (const auto& set : s.sets_) grad_sent += set->reducer->bytes_sent();
  report.grad_comm_bytes_sent = grad_sent - s.grad_bytes_sent_at_step_start_;
  s.grad_bytes_sent_at_step_start_ = grad_sent;
  const memory::TransferStats moved = s.backend_->transfers();
  report.transfers = {moved.host_to_device_bytes - s.transfers_at_step_start_.host_to_device_bytes,
                      moved.device_to_host_bytes - s.transfers_at_step_start_.device_to_host_bytes};
  s.transfers_at_step_start_ = moved;
  report.step = ++global_step_;
  const double step_end = now_seconds();
  s.micro_step_ = 0;
  s.loss_sum_ = 0.0;
  s.forward_s_ = s.backward_s_ = 0.0;
  last_ = report;
  // Last, once the step is complete: a monitor that cannot write (IoError) leaves a consistent engine.
  if (s.monitor_) {
    MonitorSample m{.step = report.step,
                    .samples = report.step * config_.batch.train_batch_size,
                    .loss = report.loss,
                    .lr = report.lr,
                    .loss_scale = report.loss_scale,
                    .forward_s = report.forward_s,
                    .backward_s = report.backward_s,
                    .optimizer_s = report.optimizer_s,
                    .step_s = step_end - s.window_start_s_,
                    .step_samples = config_.batch.train_batch_size,
                    // Every rank feeds micro-batches of the same shape (DeepSpeed's batch arithmetic).
                    .step_tokens = s.window_tokens_ * group_.size(),
                    .memory = s.tracker_.snapshot(),
                    .device_reserved_bytes = s.device_->stats().reserved_bytes};
    s.monitor_->on_step(m, group_.op_stats());
  }
  if (s.profiler_ && s.profiler_->window_finished()) {
    s.profiler_->publish(model_, {.world_size = group_.size(),
                                  .micro_batch = config_.batch.micro_batch_per_rank,
                                  .accumulation = config_.batch.gradient_accumulation_steps,
                                  .step_latency_s = report.optimizer_s,
                                  .iter_latency_s = step_end - s.window_start_s_});
  }
  return true;
}

}  // namespace zs::engine
