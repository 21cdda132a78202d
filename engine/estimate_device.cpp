// The device arena's predicted peak (engine/estimate.h, DevicePeak): the GPT's activation timeline
// and a replay of the stage-3 gatherer and the stage-2/3 gradient reducer over one training step.
#include <algorithm>
#include <deque>
#include <functional>
#include <vector>

#include "engine/detail/estimate_util.h"
#include "engine/estimate.h"
#include "engine/grad_reducer.h"
#include "memory/alloc_policy.h"

namespace zs::engine {

// Note [GPT activations]
// Counted from nn/: every activation is an fp32 tensor of its own, served by the engine's transient
// pool, whose blocks are 64-byte aligned (so each tensor is rounded up to 64 bytes). N = B*T tokens.
// Saved for backward, per block: ln1's input x (N,C), mean and rstd (N each); the qkv Linear's input
// = ln1 output (N,C); attention's qkv output (N,3C) and softmax probabilities (B,H,T,T); the proj
// Linear's input (N,C); ln2's input x1 (N,C), mean, rstd; the fc Linear's input = ln2 output (N,C);
// Gelu's input = fc output (N,4C); the mlp proj Linear's input = Gelu output (N,4C): 16NC + 4N + BHT^2
// (the branch outputs die right after the residual adds; a block's output is the next one's x).
// Around the blocks ("head"): ln_f's input (N,C), mean, rstd, its output (N,C), the logits (N,V) and
// the loss's log-sum-exp (N): 2NC + NV + 3N.
// The moments (bf16/fp16 terms in brackets: a layer reads a weight through an fp32 copy and
// accumulates its gradient in fp32 scratch); the activation peak is the largest:
//   end of forward     saved (+ VC)                   wte's fp32 copy lives through the forward
//   start of backward  saved + NV                     dlogits beside the still-saved logits
//   head backward      saved - N + NC (+ 2VC)         logits freed; dx, and wte's fp32 copy + gradient
//   ln_f backward      saved - NV - N + NC (+ 3C)
//   block L-1-j, with A = saved - head - j block + NC (dy) [+ NC for j >= 1: ln_f's input gradient,
//   held by Sequential::backward's caller] and A' = A - 8NC - NC - 2N (after ln2):
//     mlp.proj         A + 4NC (+ 8C^2)               the (N,4C) input gradient
//     mlp.fc           A - 4NC + NC (+ 8C^2)          Gelu's input and output gone, (N,C) input gradient
//     attn.proj        A' + NC (+ 2C^2)
//     attn.qkv         A' + NC - BHT^2 (+ 6C^2)       qkv output and probabilities dropped, dqkv alive
// Measured against `zeroshard train --summary` (activation_peak_bytes at stage 0) these are exact for
// the configurations in tests/e2e/estimate.cmake; the nn layers can change, so it stays an estimate.

// Note [device timeline]
// The arena's peak is not the sum of the transients' peaks: activations peak in the last block's
// backward, gathered parameters wherever the prefetch window is fullest, and gradient staging when
// buckets fill. So the estimator replays one steady-state training step (the second: the gatherer
// prefetches only along an order recorded in the first) module by module, and at each moment of the
// GPT's activation timeline (Note [GPT activations]) adds up what is alive on the device:
//   device model states (tiered_state_bytes(...).device, exact)
//   + activations at that moment (the moment's formula)
//   + stage 3: gathered parameters, by the gatherer's rules (engine/param_gatherer.cpp) on element
//     counts: a module's own range is gathered when it is fetched (forward: before it runs; backward:
//     before its backward), then the next modules of the recorded order are started while the
//     prefetched total stays within the window (stage3_prefetch_bucket_size, and with parameters on
//     NVMe also offload_param buffer_count x buffer_size and max_in_cpu) and the live total within
//     stage3_max_live_parameters; a module is released after it ran unless its range is below
//     stage3_param_persistence_threshold (persistent: gathered at first use, kept until the step);
//   + stage 2/3: gradient staging, by the reducer's rules (engine/grad_reducer.cpp): a bucket's
//     buffer is allocated when the first module with a parameter in it starts its backward, the bucket
//     is launched when all its parameters are done (overlap_comm) and freed when it is retired. On one
//     rank the reduction is a no-op, so a bucket is retired as soon as it is launched. With more ranks
//     the reduction is a nonblocking MPI collective, which Open MPI progresses only inside MPI calls:
//     the replay keeps launched buckets until kMaxInFlight = 2 newer ones push them out (a test() that
//     finds one done earlier frees it sooner, which can only lower the peak);
//   + the optimizer step's device buffers: 0/1 Adam's compressed-gradient steps copy the whole
//     gradient into an fp32 buffer (4Ψ, comm_buffers) while the activations are gone.
// Moments between those of the timeline hold fewer activations with the same gathered and staged
// buffers, or a small part of a block's, so the largest of the sums is the prediction. Attention's
// per-thread backward scratch (threads x 64 x T floats) is left out.

namespace detail {

GptActivations gpt_activations(const GptActivationShape& a, Precision precision) {
  const auto& m = a.model;
  const uint64_t B = static_cast<uint64_t>(a.micro_batch), T = static_cast<uint64_t>(a.seq_len);
  const uint64_t C = static_cast<uint64_t>(m.d_model), H = static_cast<uint64_t>(m.n_head);
  const uint64_t L = static_cast<uint64_t>(m.n_layer), V = static_cast<uint64_t>(m.vocab_size);
  const uint64_t N = B * T;
  const uint64_t low = precision != Precision::kFp32 ? 1 : 0;  // weights read through an fp32 copy
  auto t = [](uint64_t elements) { return round_up(4 * elements, 64); };  // one fp32 tensor's block
  const uint64_t block = 5 * t(N * C) + t(3 * N * C) + 2 * t(4 * N * C) + 4 * t(N) + t(B * H * T * T);
  const uint64_t head = 2 * t(N * C) + 3 * t(N) + t(N * V);
  GptActivations g;
  g.saved = L * block + head;
  const uint64_t S = g.saved;
  const std::string head_module = m.tied_embeddings ? "" : "lm_head";
  using P = ActivationMoment::Pass;
  using W = ActivationMoment::When;
  g.moments = {
      {"end of forward", P::kForward, head_module, m.tied_embeddings ? W::kAfterChildren : W::kRunning, S + low * t(V * C)},
      {"start of backward (dlogits)", P::kBackward, "", W::kRunning, S + t(N * V)},
      {"output head backward", P::kBackward, head_module, W::kRunning, S - t(N) + t(N * C) + low * 2 * t(V * C)},
      {"ln_f backward", P::kBackward, "ln_f", W::kRunning, S - t(N * V) - t(N) + t(N * C) + low * 3 * t(C)},
  };
  // Each block's backward, last first: dy (N,C) beside the saved tensors of the blocks not yet done
  // (Note [GPT activations]); from the second-to-last block on, the blocks' own input gradient from
  // ln_f stays alive too (Sequential::backward's caller holds it). In a block: each Linear's input
  // gradient and, in bf16/fp16, its fp32 weight copy and fp32 gradient scratch; after the MLP and ln2
  // the (N,4C) tensors, ln2's input and its statistics are gone.
  for (uint64_t j = 0; j < L; ++j) {
    const uint64_t block_start = S - head - j * block + t(N * C) + (j > 0 ? t(N * C) : 0);
    const uint64_t after_ln2 = block_start - 2 * t(4 * N * C) - t(N * C) - 2 * t(N);
    const std::string at = fmt::format("blocks.{}.", L - 1 - j);
    auto moment = [&](const char* linear, uint64_t bytes) {
      g.moments.push_back({fmt::format("{}{} backward", at, linear), P::kBackward, at + linear, W::kRunning, bytes});
    };
    moment("mlp.proj", block_start + t(4 * N * C) + low * 2 * t(4 * C * C));
    moment("mlp.fc", block_start - t(4 * N * C) + t(N * C) + low * 2 * t(4 * C * C));
    moment("attn.proj", after_ln2 + t(N * C) + low * 2 * t(C * C));
    moment("attn.qkv", after_ln2 + t(N * C) - t(B * H * T * T) + low * 2 * t(3 * C * C));
  }
  return g;
}

}  // namespace detail

namespace {

using detail::ActivationMoment;

// A device block of `elements` of `b` bytes: the arena's blocks are 64-byte aligned (memory/alloc_policy.h).
uint64_t device_block(uint64_t elements, uint64_t b) { return detail::round_up(elements * b, memory::kAllocAlignment); }

// The stage-3 gatherer's state (engine/param_gatherer.cpp, same rules): its limits on element counts,
// the buffers in device bytes.
class GatherReplay {
 public:
  GatherReplay(const ModelFacts& f, uint64_t b, uint64_t window, uint64_t max_live)
      : f_(f), b_(b), window_(window), max_live_(max_live), live_(f.schedule.size(), false), prefetched_(f.schedule.size(), false) {}

  void begin_pass(int pass) {
    pass_ = pass;
    position_ = 0;
  }
  void end_pass() { recorded_[pass_] = true; }

  void fetch(int m) {
    if (range(m) == 0) return;
    if (!recorded_[pass_]) trace_[pass_].push_back(m);
    ++position_;
    if (!live_[static_cast<size_t>(m)]) start(m);
    if (prefetched_[static_cast<size_t>(m)]) {
      prefetched_elements_ -= range(m);
      prefetched_[static_cast<size_t>(m)] = false;
    }
    if (!recorded_[pass_]) return;
    const auto& trace = trace_[pass_];
    for (size_t i = position_; i < trace.size(); ++i) {
      const int next = trace[i];
      if (live_[static_cast<size_t>(next)]) continue;
      if (prefetched_elements_ + range(next) > window_) break;
      if (live_elements_ + range(next) > max_live_) break;
      start(next);
      prefetched_[static_cast<size_t>(next)] = true;
      prefetched_elements_ += range(next);
    }
  }
  void release(int m) {
    if (range(m) == 0 || persistent(m)) return;
    drop(m);
  }
  // The optimizer step: every gathered copy is stale.
  void invalidate() {
    for (size_t m = 0; m < live_.size(); ++m) {
      if (live_[m]) drop(static_cast<int>(m));
      prefetched_[m] = false;
    }
    prefetched_elements_ = 0;
  }
  uint64_t live_bytes() const { return live_bytes_; }
  uint64_t persistent_bytes() const { return persistent_bytes_; }

 private:
  uint64_t range(int m) const { return f_.schedule[static_cast<size_t>(m)].range_elements; }
  bool persistent(int m) const { return f_.schedule[static_cast<size_t>(m)].persistent; }
  void start(int m) {
    live_[static_cast<size_t>(m)] = true;
    live_elements_ += range(m);
    live_bytes_ += device_block(range(m), b_);
    if (persistent(m)) persistent_bytes_ += device_block(range(m), b_);
  }
  void drop(int m) {
    live_[static_cast<size_t>(m)] = false;
    live_elements_ -= range(m);
    live_bytes_ -= device_block(range(m), b_);
    if (persistent(m)) persistent_bytes_ -= device_block(range(m), b_);
  }

  const ModelFacts& f_;
  uint64_t b_;
  uint64_t window_;
  uint64_t max_live_;
  std::vector<bool> live_, prefetched_;
  std::vector<int> trace_[2];
  bool recorded_[2] = {false, false};
  int pass_ = 0;
  size_t position_ = 0;
  uint64_t live_elements_ = 0;  // persistent included, as the gatherer counts
  uint64_t prefetched_elements_ = 0;
  uint64_t live_bytes_ = 0;
  uint64_t persistent_bytes_ = 0;  // the persistent part of live_bytes_
};

// The stage-2/3 reducer's staging buffers (engine/grad_reducer.cpp), in device bytes.
class StagingReplay {
 public:
  StagingReplay(const ModelFacts& f, uint64_t b, bool one_rank, bool overlap)
      : f_(f), b_(b), one_rank_(one_rank), overlap_(overlap), pending_(f.bucket_elements.size()),
        alive_(f.bucket_elements.size()), launched_(f.bucket_elements.size()) {}

  void begin_backward() {
    for (size_t b = 0; b < pending_.size(); ++b) {
      pending_[b] = f_.bucket_param_count[b];
      launched_[b] = false;
    }
  }
  void starting(int m) {
    for (const auto& [b, n] : f_.schedule[static_cast<size_t>(m)].bucket_params) ensure(b);
  }
  void done(int m) {
    for (const auto& [b, n] : f_.schedule[static_cast<size_t>(m)].bucket_params) {
      pending_[b] -= n;
      if (pending_[b] == 0 && overlap_) launch(b);
    }
    // retire_finished: on one rank every launched bucket is done at once; with more, MPI progresses a
    // nonblocking reduction only inside MPI calls, so the replay keeps launched buckets in flight
    // until kMaxInFlight pushes the oldest out (test() finding one done earlier only lowers the peak).
    if (one_rank_) {
      for (uint32_t b : in_flight_) retire(b);
      in_flight_.clear();
    }
  }
  void end_backward() {
    for (uint32_t b = 0; b < pending_.size(); ++b) launch(b);
    for (uint32_t b : in_flight_) retire(b);
    in_flight_.clear();
  }
  uint64_t alive_bytes() const { return alive_bytes_; }

 private:
  void ensure(uint32_t b) {
    if (alive_[b]) return;
    alive_[b] = true;
    alive_bytes_ += device_block(f_.bucket_elements[b], b_);
  }
  void launch(uint32_t b) {
    if (launched_[b]) return;
    launched_[b] = true;
    ensure(b);
    in_flight_.push_back(b);
    while (in_flight_.size() > GradReducer::kMaxInFlight) {
      retire(in_flight_.front());
      in_flight_.pop_front();
    }
  }
  void retire(uint32_t b) {
    if (!alive_[b]) return;
    alive_[b] = false;
    alive_bytes_ -= device_block(f_.bucket_elements[b], b_);
  }

  const ModelFacts& f_;
  uint64_t b_;
  bool one_rank_;
  bool overlap_;
  std::vector<uint32_t> pending_;
  std::vector<bool> alive_, launched_;
  std::deque<uint32_t> in_flight_;
  uint64_t alive_bytes_ = 0;
};

}  // namespace

DevicePeak estimate_device_peak(const EstimateInput& in, int stage, const StateBytes& device_states) {
  DevicePeak peak;
  const ModelFacts& f = in.model;
  if (!f.exact_layout || !f.activations || f.schedule.empty()) {
    peak.formula = "needs the model's modules and activation shape: give --config with a GPT model section";
    return peak;
  }
  const uint64_t b = detail::bytes_per_element(in.precision);
  const detail::GptActivations acts = detail::gpt_activations(*f.activations, in.precision);
  const int grad_stage = in.compressed ? std::min(stage, 1) : stage;
  uint64_t window = static_cast<uint64_t>(in.zero.stage3_prefetch_bucket_size);
  if (stage_offload(in, stage).param == OffloadDevice::kNvme) window = detail::nvme_prefetch_window(in);
  GatherReplay gather(f, b, window, static_cast<uint64_t>(in.zero.stage3_max_live_parameters));
  StagingReplay staging(f, b, in.ranks == 1, in.zero.overlap_comm);
  const bool gathering = stage == 3, staged = grad_stage >= 2;

  bool measuring = false;
  auto consider = [&](const ActivationMoment& a) {
    DevicePeak p;
    p.applies = true;
    p.at = a.label;
    p.model_states = device_states.total();
    p.activations = a.bytes;
    if (gathering) {
      p.persistent_params = gather.persistent_bytes();
      p.gathered_params = gather.live_bytes() - gather.persistent_bytes();
    }
    if (staged) p.grad_staging = staging.alive_bytes();
    p.bytes = p.model_states + p.activations + p.gathered_params + p.persistent_params + p.grad_staging;
    if (p.bytes > peak.bytes) peak = p;
  };
  auto moments_at = [&](ActivationMoment::Pass pass, int m, ActivationMoment::When when) {
    if (!measuring) return;
    for (const ActivationMoment& a : acts.moments) {
      if (a.pass == pass && a.when == when && a.module == f.schedule[static_cast<size_t>(m)].name) consider(a);
    }
  };
  using P = ActivationMoment::Pass;
  using W = ActivationMoment::When;
  // Forward: a module is fetched before it runs and released after; backward mirrors the forward
  // (children in reverse), the reducer's hooks around each module's backward.
  std::function<void(int)> forward = [&](int m) {
    if (gathering) gather.fetch(m);
    moments_at(P::kForward, m, W::kRunning);
    for (int c : f.schedule[static_cast<size_t>(m)].children) forward(c);
    moments_at(P::kForward, m, W::kAfterChildren);
    if (gathering) gather.release(m);
  };
  std::function<void(int)> backward = [&](int m) {
    if (gathering) gather.fetch(m);
    if (staged) staging.starting(m);
    moments_at(P::kBackward, m, W::kRunning);
    const auto& children = f.schedule[static_cast<size_t>(m)].children;
    for (auto it = children.rbegin(); it != children.rend(); ++it) backward(*it);
    moments_at(P::kBackward, m, W::kAfterChildren);
    if (staged) staging.done(m);
    if (gathering) gather.release(m);
  };
  for (int step = 0; step < 2; ++step) {  // the first step records the order, the second prefetches
    measuring = step == 1;
    for (int pass = 0; pass < 2; ++pass) {
      gather.begin_pass(pass);
      if (pass == 0) {
        forward(0);
      } else {
        if (staged) staging.begin_backward();
        backward(0);
        if (staged) staging.end_backward();
      }
      gather.end_pass();
    }
    gather.invalidate();
  }
  if (in.zero_one) {
    // 0/1 Adam's compressed-gradient steps: the whole gradient in fp32, after the activations are gone.
    const uint64_t comm = 4 * f.flat_elements;
    if (device_states.total() + comm > peak.bytes) {
      peak = DevicePeak{};
      peak.applies = true;
      peak.bytes = device_states.total() + comm;
      peak.at = "optimizer step (0/1 Adam's compressed gradient)";
      peak.model_states = device_states.total();
      peak.comm_buffers = comm;
    }
  }
  peak.formula = fmt::format(
      "at {}: model states {} + activations {} + gathered params {} + persistent params {} + gradient staging {} + comm "
      "buffers {} (a replay of one step; {})",
      peak.at, format_bytes(peak.model_states), format_bytes(peak.activations), format_bytes(peak.gathered_params),
      format_bytes(peak.persistent_params), format_bytes(peak.grad_staging), format_bytes(peak.comm_buffers),
      in.ranks == 1 ? "one rank: reductions are immediate" : "reductions in flight until kMaxInFlight = 2 newer ones push them out");
  return peak;
}

}  // namespace zs::engine
