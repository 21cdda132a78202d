// Engine::step: the optimizer step at an accumulation boundary, as named phases (each an Impl
// member below, in the order step() runs them): wait for the reductions; agree on the loss and the
// gradient norm (an fp16 overflow is a non-finite norm); clip; update every state set (its owner
// steps each piece: model_states_step.cpp; one-bit Adam and 0/1 Adam: compressed_step.cpp); gather
// the updated parameters; report.
#include <cmath>
#include <vector>

#include "core/clock.h"
#include "core/errors.h"
#include "core/parallel.h"
#include "engine/detail/engine_impl.h"
#include "nn/flops.h"
#include "optim/clip.h"

namespace zs::engine {

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
  const double t0 = now_seconds();
  s.wait_reductions();
  const int64_t t = s.steps_taken_ + 1;
  const bool local = s.compressed_ && !s.exact_gradients(t);
  const Impl::LossAndNorm agreed = s.agree_loss_and_norm(local);

  const double loss_scale = s.scaler_.scale();
  const double unscale = 1.0 / loss_scale;  // the reductions averaged over ranks already
  const bool overflow = !std::isfinite(agreed.sum_sq);
  StepReport report;
  report.loss = agreed.loss_total / (static_cast<double>(config_.batch.gradient_accumulation_steps) * group_.size());
  report.grad_norm = overflow ? agreed.sum_sq : std::sqrt(agreed.sum_sq) * unscale;
  report.loss_scale = loss_scale;
  report.skipped = s.scaler_.update(overflow);
  report.lr = s.schedule_.lr_at(s.steps_taken_);
  report.compressed = local;
  if (!report.skipped) {
    s.update(s.clipped_step(t, report, unscale));
    ++s.steps_taken_;
    s.gather_updated_params();
  }
  for (auto& set : s.sets_) set->zero_grads();
  s.finish_report(report, t0);
  report.step = ++global_step_;
  const double step_end = now_seconds();
  s.restart_window();
  last_ = report;
  s.publish(model_, report, step_end);
  return true;
}

void Engine::Impl::wait_reductions() {
  {
    memory::DeviceAccess access(*backend_);
    for (auto& set : sets_) set->reducer->wait_all();
  }
  reductions_access_.reset();
}

Engine::Impl::LossAndNorm Engine::Impl::agree_loss_and_norm(bool local) {
  for (auto& set : sets_) set->fill_fp32_grads();
  // One pass over this rank's gradients gives its part of the squared norm; a non-finite sum is an
  // fp16 overflow (an Inf/NaN part makes the agreed total non-finite on every rank). Local gradients
  // (a compressing step) are whole on every rank: their norm is the root mean square over the ranks
  // of each rank's local norm. With expert parameters every element of the world's model is counted
  // exactly once: at stages 1-3 each rank's shards (of the dense layout over dp, of an expert layout
  // over its edp group, and the EP ranks hold different experts), at stage 0 each set's whole
  // gradients on its group's rank 0 only; the parts are summed over dp (Note [expert parameters]).
  double sum_sq = 0.0;
  for (auto& set : sets_) {
    if (has_experts() && stage_ == 0 && set->group.rank() != 0) continue;
    sum_sq += grad_sum_of_squares(*set, local ? set->grad_range() : set->step_range());
  }
  // One small allreduce agrees on both the loss total (every micro-batch has the same number of
  // samples, so the global mean is the total over all of them) and, where the norm is not local
  // already, the squared norm. Stage 0 holds every reduced gradient: its local sum is the total.
  const bool agree_norm = stage_ > 0 || local || has_experts();
  float agreed[2] = {static_cast<float>(loss_sum_), agree_norm ? static_cast<float>(sum_sq) : 0.0f};
  if (group_.size() > 1) group_.allreduce(memory::Tensor::of(std::span<float>(agreed, 2)));
  LossAndNorm out;
  out.loss_total = agreed[0];
  // The agreed norm went through fp32; so does the local one, so every stage and world size of one
  // rank clips with the same bits.
  out.sum_sq = agree_norm ? agreed[1] : static_cast<float>(sum_sq);
  if (local) out.sum_sq /= group_.size();
  if (tp_ != nullptr) {
    // Each tp rank's total covers its TP shards (and, on tp rank 0, the replicated parameters): their
    // sum is the tp = 1 model's, the same on every rank of dp x tp (Note [tensor-parallel parameters]).
    float total = static_cast<float>(out.sum_sq);
    tp_->allreduce(memory::Tensor::of(std::span<float>(&total, 1)));
    out.sum_sq = total;
  }
  out.sum_sq = pipeline_sum(out.sum_sq);  // every stage's part (Note [pipeline stages in the engine])
  return out;
}

double Engine::Impl::grad_sum_of_squares(const ModelStates& set, memory::ShardRange range) {
  // Per-piece sums added in piece order: the same bits for any thread count.
  std::vector<double> piece_sums;
  if ((tp_ == nullptr || tp_->rank() == 0) && env_.uncounted.empty()) {
    piece_sums.resize((range.size + kPieceElements - 1) / kPieceElements);
    memory::run_kernel(*backend_, [&] {
      set.for_each_span(range, kPieceElements, [&](size_t at, size_t n, int t) {
        piece_sums[(at - range.offset) / kPieceElements] = optim::sum_of_squares(set.grad_f32(at, n, t));
      });
    });
  } else {
    // Note [tensor-parallel parameters]: the other tp ranks count their TP shards only (tp rank 0
    // counts the replicated parameters for the group), slot by slot; a pipeline stage skips its copy
    // of a parameter another stage counts.
    std::vector<memory::ShardRange> pieces;
    for (const ParamSlot& slot : set.layout.slots()) {
      if (!env_.counts(*slot.param)) continue;
      const memory::ShardRange part = slot.range().intersect(range);
      for (size_t off = 0; off < part.size; off += kPieceElements) {
        pieces.push_back({part.offset + off, std::min(kPieceElements, part.size - off)});
      }
    }
    piece_sums.resize(pieces.size());
    memory::run_kernel(*backend_, [&] {
      parallel_for_threads(env_.threads(), static_cast<int64_t>(pieces.size()), 1, [&](int64_t b, int64_t e, int t) {
        for (int64_t p = b; p < e; ++p) {
          const memory::ShardRange& pc = pieces[static_cast<size_t>(p)];
          piece_sums[static_cast<size_t>(p)] = optim::sum_of_squares(set.grad_f32(pc.offset, pc.size, t));
        }
      });
    });
  }
  double sum_sq = 0.0;
  for (double v : piece_sums) sum_sq += v;
  // Experts: the reduced gradients are averaged over edp; the model's gradient is that / E.
  const double f = set.grad_factor();
  return f == 1.0 ? sum_sq : sum_sq * f * f;
}

optim::StepContext Engine::Impl::clipped_step(int64_t t, const StepReport& report, double unscale) const {
  const double coef = optim::clip_coefficient(report.grad_norm, cfg_.gradient_clipping);
  return {.step = t,
          .lr = report.lr,
          .grad_scale = static_cast<float>(unscale * coef),
          .betas = schedule_.betas_at(steps_taken_)};
}

void Engine::Impl::update(const optim::StepContext& ctx) {
  // Stage 3 on one node: the peers read this rank's parameter shard in place (Note [one-sided
  // parameter gathers] in engine/detail/param_gatherer.h); it is rewritten once they are done.
  for (auto& set : sets_) {
    if (set->gatherer) set->gatherer->begin_shard_write();
  }
  if (compressed_) {
    step_compressed(ctx);
    return;
  }
  for (auto& set : sets_) set->step(*optimizer_, ctx);
}

void Engine::Impl::gather_updated_params() {
  for (auto& set : sets_) {
    if (stage_ == 1 || stage_ == 2) set->allgather_params();
    if (set->gatherer) {
      memory::DeviceAccess access(*backend_);  // drops gathered buffers in device memory
      set->gatherer->shards_written();
    }
  }
}

void Engine::Impl::finish_report(StepReport& report, double t0) {
  report.forward_s = forward_s_;
  report.backward_s = backward_s_;
  if (pipeline_ != nullptr) report.pipeline = pipeline_run_;
  report.optimizer_s = now_seconds() - t0;
  const comm::CommCounters counters = group_.counters();
  report.comm_bytes_sent = counters.bytes_sent - bytes_sent_at_step_start_;
  bytes_sent_at_step_start_ = counters.bytes_sent;
  report.comm_bytes_inter_host = counters.bytes_sent_inter_host - inter_host_at_step_start_;
  inter_host_at_step_start_ = counters.bytes_sent_inter_host;
  uint64_t grad_sent = 0;
  for (const auto& set : sets_) grad_sent += set->reducer->bytes_sent();
  report.grad_comm_bytes_sent = grad_sent - grad_bytes_sent_at_step_start_;
  grad_bytes_sent_at_step_start_ = grad_sent;
  if (tp_ != nullptr) {
    const uint64_t tp_sent = tp_->bytes_sent();
    report.tp_comm_bytes_sent = tp_sent - tp_bytes_at_step_start_;
    tp_bytes_at_step_start_ = tp_sent;
  }
  uint64_t gathers = 0, backward_gathers = 0;
  for (const auto& set : sets_) {
    if (!set->gatherer) continue;
    const ZeroppGather* zpp = set->gatherer->zeropp();
    gathers += set->gatherer->gathers() - (zpp != nullptr ? zpp->secondary_gathers() : 0);
    backward_gathers += set->gatherer->backward_gathers();
  }
  report.param_gathers = gathers - gathers_at_step_start_;
  report.backward_param_gathers = backward_gathers - backward_gathers_at_step_start_;
  gathers_at_step_start_ = gathers;
  backward_gathers_at_step_start_ = backward_gathers;
  const memory::TransferStats moved = backend_->transfers();
  report.transfers = {moved.host_to_device_bytes - transfers_at_step_start_.host_to_device_bytes,
                      moved.device_to_host_bytes - transfers_at_step_start_.device_to_host_bytes};
  transfers_at_step_start_ = moved;
  // From the window's first forward: an evaluation between steps is not this step's work.
  const uint64_t recomputed = nn::flops_recomputed() - recomputed_at_window_start_;
  report.recompute_flops = recomputed;
  report.model_flops = nn::flops_performed() - flops_at_window_start_ - recomputed;
}

void Engine::Impl::restart_window() {
  micro_step_ = 0;
  loss_sum_ = 0.0;
  forward_s_ = backward_s_ = 0.0;
}

void Engine::Impl::publish(nn::Model& model, const StepReport& report, double step_end) {
  const double window_start = window_start_s_;
  // Last, once the step is complete: a monitor that cannot write (IoError) leaves a consistent engine.
  const BatchConfig& batch = cfg_.batch;
  if (monitor_) {
    MonitorSample m{.step = report.step,
                    .samples = report.step * batch.train_batch_size,
                    .loss = report.loss,
                    .lr = report.lr,
                    .loss_scale = report.loss_scale,
                    .forward_s = report.forward_s,
                    .backward_s = report.backward_s,
                    .optimizer_s = report.optimizer_s,
                    .step_s = step_end - window_start,
                    .step_samples = batch.train_batch_size,
                    // Every rank feeds micro-batches of the same shape (DeepSpeed's batch arithmetic).
                    .step_tokens = window_tokens_ * group_.size(),
                    .memory = tracker_.snapshot(),
                    .device_reserved_bytes = device_->stats().reserved_bytes};
    monitor_->on_step(m, group_.op_stats());
  }
  if (profiler_ && profiler_->window_finished()) {
    profiler_->publish(model, {.world_size = group_.size(),
                               .micro_batch = batch.micro_batch_per_rank,
                               .accumulation = batch.gradient_accumulation_steps,
                               .step_latency_s = report.optimizer_s,
                               .iter_latency_s = step_end - window_start});
  }
}

}  // namespace zs::engine
