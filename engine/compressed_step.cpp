// One-bit Adam and 0/1 Adam in the engine: which gradients they get, the buffers they keep, and the
// order of their kernels (optim/onebit_adam.h) and compressed allreduces (comm/compressed_allreduce.h).
#include <algorithm>
#include <cstring>

#include "core/errors.h"
#include "core/log.h"
#include "engine/detail/engine_impl.h"
#include "optim/zero_one_adam.h"

namespace zs::engine {

// Note [compressed optimizers]
// DeepSpeed's OneBitAdam and ZeroOneAdam refuse ZeRO; here they run at every stage. What makes that
// possible is to shard what the algorithms keep identical on every rank and to keep whole what each
// rank computes from its own gradients:
//   - fp32 master weights and the variance: the stepped range (a shard at stages 1-3), like Adam's.
//   - the momentum: whole on every rank. Before the freeze every rank updates only its stepped range
//     from averaged gradients (as Adam does); at the first compressed step the parts are gathered once,
//     because from then on each rank compresses its whole local momentum (worker side) and the
//     compressed allreduce returns the whole averaged momentum to every rank.
//   - gradients: whole at every stage (the reducer works as at stage 0/1): the compressed phase
//     consumes each rank's whole local gradient, so stage 2's gradient sharding does not apply.
//   - error feedback: whole worker residual, one server chunk (comm::OneBitAllreduce).
// One-bit Adam: steps 1..freeze_step are Adam without bias correction on averaged gradients; after
// that m = b1 m + (1-b1) g_local, m = compressed_allreduce(m), p -= lr (m / (sqrt(v) + eps) + wd p).
// 0/1 Adam (optim::ZeroOneSchedule): variance steps average gradients exactly; the steps between
// compress the local gradient; after var_freeze_step the variance is frozen and, at stage 0, ranks take
// local steps and synchronise the accumulated update every local_step_interval steps, as DeepSpeed
// does. At stages 1-3 the weights are sharded and cannot drift apart per rank, so every frozen step
// synchronises: with one local step per sync, 0/1 Adam's sync compresses lr (m_local + wd p (sqrt(v)
// + eps)); we compress the momentum (the lr and (sqrt(v) + eps) factors are the same on every rank)
// and apply the weight decay on the shard after, which is one-bit Adam's frozen step.
// Communication per compressed step: 2 (N-1)/N bits per element plus one scale per chunk and rank,
// against 2 (N-1)/N x 16 or 32 bits for averaging bf16 or fp32 gradients.

namespace {

// Note [compression at the lr peak]
// issue 38 (docs/benchmarks.md "onebit_quality", 2-layer GPTs d_model 128 to 512, 150 steps, three
// or five seeds, each run against the same formulas with exact averaging, so that the seed-to-seed
// spread cancels): one-bit Adam's compression cost 0.2-1.3% of tail loss on the mean in every setting
// but one, freezing at the end of the lr warm-up (compression starting at the peak lr, DeepSpeed's
// advice) with DeepSpeed's one scale per tensor at d_model 256: +2.4% on the mean of five seeds, one
// of them +9.6% (its loss jumps within ten steps of the freeze and stays up). The likely cause (not
// isolated): at the first compressed steps the error feedback is still empty, and one scale per
// tensor gives every element of an embedding matrix the same magnitude, rare rows (small variance)
// included, so m / sqrt(v) overshoots there at full lr. 256-element blocks (a block is one or two
// embedding rows) cost +1.1% at the same point (worst seed +2.9%), and a freeze where the lr has
// decayed to 2/3 of its peak +0.4-0.5% with either scale. At d_model 512 (three seeds) per tensor at
// the peak cost +0.6% (no seed above +0.7%): the outlier is seed- and size-dependent, not a rule, but
// it is the one setting where the compression cost more than 1.4%. Hence the warning for "tensor"
// when the first compressed step runs at >= 90% of the highest lr so far.
void warn_tensor_scales_at_peak(const optim::LrSchedule& schedule, const optim::OneBitAdamConfig& c) {
  if (c.compression_scale != optim::CompressionScale::kTensor) return;
  constexpr int64_t kMaxScan = 1'000'000;  // a freeze later than this is never at a warm-up's peak
  if (c.freeze_step > kMaxScan) return;
  double peak = 0.0;
  for (int64_t s = 0; s <= c.freeze_step; ++s) peak = std::max(peak, schedule.lr_at(s));
  const double first = schedule.lr_at(c.freeze_step);  // 0-based: step freeze_step + 1, the first compressed one
  if (!(peak > 0.0) || first < 0.9 * peak) return;
  ZS_LOG_WARN(
      "optimizer.params.compression_scale: \"tensor\" with the first compressed step (step {}) at {:.0f}% of the "
      "peak learning rate: on the small GPTs of docs/benchmarks.md (onebit_quality) DeepSpeed's one scale per "
      "tensor, starting at the lr peak, lost 2.4% of tail loss on average and 9.6% on one seed of five against the "
      "same run without compression; \"block\" scales (+1.1% there) or a freeze_step where the learning rate has "
      "decayed to 2/3 of its peak (+0.5%) avoid it",
      c.freeze_step + 1, 100.0 * first / peak);
}

// 0/1 Adam in the same benchmark (d_model 128, var_freeze_step 40 at the end of the lr warm-up):
// with var_update_scaler 16 (DeepSpeed's default) the variance is updated at every step only up to
// step 16, and from there every other step compresses the gradient instead, while the lr still rises;
// the runs spike there and lost 3.9-6.1% of tail loss on the three-seed mean (-4.0% .. +15.1% per
// seed). Updating the variance at every warm-up step (var_update_scaler 1000) cost +1.6% (blocks).
// Hence the warning when a compressed-gradient step comes before the lr reaches its peak.
void warn_zero_one_sparse_variance(const optim::LrSchedule& schedule, const optim::ZeroOneAdamConfig& c) {
  constexpr int64_t kMaxScan = 1'000'000;
  const int64_t last = std::min(c.var_freeze_step, kMaxScan);
  double peak = 0.0;
  int64_t peak_step = 1;  // the first step (1-based) at the highest lr of the variance phase
  for (int64_t t = 1; t <= last; ++t) {
    if (schedule.lr_at(t - 1) > peak) {
      peak = schedule.lr_at(t - 1);
      peak_step = t;
    }
  }
  optim::ZeroOneSchedule plan(c);
  for (int64_t t = 1; t < peak_step; ++t) {
    const double lr = schedule.lr_at(t - 1);
    if (plan.plan(t, lr).kind == optim::ZeroOneSchedule::Kind::kCompressedGradient) {
      ZS_LOG_WARN(
          "optimizer.params.var_update_scaler: step {} already compresses the gradient (the variance is updated "
          "only every {} steps from there) while the learning rate still rises to its peak at step {}: on the small "
          "GPTs of docs/benchmarks.md (onebit_quality) 0/1 Adam lost 3.9-6.1% of tail loss on average (one seed "
          "+15%) so, against +1.6% with the variance updated at every warm-up step; a var_update_scaler of at "
          "least {} avoids it",
          t, plan.state().var_interval, peak_step, peak_step);
      return;
    }
    plan.advance(t, lr);
  }
}

}  // namespace

void Engine::Impl::init_compressed(CompressedState state) {
  // The momentum, variance and accumulator were placed and zeroed by the constructor (the plan).
  CompressedState& c = compressed_.emplace(std::move(state));
  const auto* zero_one = cfg_.optimizer.params_if<optim::ZeroOneAdamConfig>();
  if (zero_one != nullptr) c.schedule.emplace(*zero_one);
  const optim::CompressionScale scale = zero_one != nullptr ? zero_one->compression_scale
                                                            : cfg_.optimizer.params<optim::OneBitAdamConfig>().compression_scale;
  // The parameters' ranges: the alignment gaps between them are padding to comm (zero, as DeepSpeed's
  // padding), and per tensor they are DeepSpeed's tensors (Note [Per-tensor scales]).
  c.reduce.emplace(group_, dense().layout.total(), dense().layout.param_ranges(),
                   scale == optim::CompressionScale::kTensor ? comm::OneBitAllreduce::Scales::kPerTensor
                                                             : comm::OneBitAllreduce::Scales::kBlocks);
  // The plan sized the error feedback by the same rule (the estimator reads the plan): keep them one.
  const PlannedBuffer* planned = dense().plan.find(BufferRole::kErrorFeedback);
  ZS_ASSERT(planned != nullptr && planned->bytes == c.reduce->state_floats() * sizeof(float),
            "the placement plan's error feedback ({} B) differs from the compressed allreduce's ({} B)",
            planned != nullptr ? planned->bytes : 0, c.reduce->state_floats() * sizeof(float));
  c.momentum_whole = stage_ == 0 || group_.size() == 1;
  if (group_.rank() == 0) {
    if (zero_one != nullptr) warn_zero_one_sparse_variance(schedule_, *zero_one);
    else warn_tensor_scales_at_peak(schedule_, cfg_.optimizer.params<optim::OneBitAdamConfig>());
  }
}

uint64_t Engine::Impl::compressed_state_bytes() const {
  if (!compressed_) return 0;
  const CompressedState& c = *compressed_;
  // The error-feedback buffers live in comm's own memory, not in the arena; they are optimizer state
  // all the same (a whole worker residual and one server chunk).
  const uint64_t errors = c.reduce->state_floats() * sizeof(float);
  return c.momentum.size() + c.variance.size() + c.accumulator.size() + errors;
}

bool Engine::Impl::exact_gradients(int64_t step) const {
  const CompressedState& c = *compressed_;
  if (c.schedule) {
    return c.schedule->plan(step, schedule_.lr_at(step - 1)).kind == optim::ZeroOneSchedule::Kind::kVarUpdate;
  }
  return !optim::one_bit_frozen(cfg_.optimizer.params<optim::OneBitAdamConfig>(), step);
}

namespace {

enum class Phase { kAdam, kCompressedGradient, kCompressedMomentum, kLocalStep };

// Note [momentum mask]
// One bit per element cannot say zero: after a compressed average, an element whose gradient has been
// exactly zero all along (an embedding row of a token the data never contains) gets +-scale, and with
// its variance at 0 the update m / (sqrt(v) + eps) is scale / 1e-8: such rows blow up within a step.
// DeepSpeed leaves this to the user (a per-parameter exp_avg_mask). Here the mask is automatic: an
// element whose variance is exactly 0 has never had a non-zero gradient, and its compressed value is
// replaced by 0 before the update (the weight decay still applies). The owner of the element applies
// it, on the values it updates with.
void mask_unvisited(float* x, const float* v, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = v[i] == 0.0f ? 0.0f : x[i];
}

}  // namespace

void Engine::Impl::step_compressed(const optim::StepContext& ctx) {
  CompressedState& c = *compressed_;
  const ModelStates& s = dense();  // the only set: experts are refused with compressed optimizers
  const memory::ShardRange stepped = s.step_range();
  const memory::ShardRange all = s.whole();
  float* m_all = static_cast<float*>(c.momentum.data());
  auto m_at = [&](size_t i) { return m_all + i; };
  auto v_at = [&](size_t i) { return static_cast<float*>(c.variance.data()) + (i - stepped.offset); };
  auto u_at = [&](size_t i) { return static_cast<float*>(c.accumulator.data()) + i; };

  auto constants = [&](const optim::CompressedStep& st) {
    return c.schedule ? optim::compressed_constants(cfg_.optimizer.params<optim::ZeroOneAdamConfig>(), st)
                      : optim::compressed_constants(cfg_.optimizer.params<optim::OneBitAdamConfig>(), st);
  };
  optim::ZeroOneSchedule::Plan plan{};
  Phase phase = Phase::kAdam;
  if (c.schedule) {
    plan = c.schedule->plan(ctx.step, ctx.lr);
    switch (plan.kind) {
      case optim::ZeroOneSchedule::Kind::kVarUpdate: phase = Phase::kAdam; break;
      case optim::ZeroOneSchedule::Kind::kCompressedGradient: phase = Phase::kCompressedGradient; break;
      case optim::ZeroOneSchedule::Kind::kLocal: phase = stage_ == 0 ? Phase::kLocalStep : Phase::kCompressedMomentum; break;
    }
    if (plan.reset_errors) c.reduce->reset_errors();
  } else if (optim::one_bit_frozen(cfg_.optimizer.params<optim::OneBitAdamConfig>(), ctx.step)) {
    phase = Phase::kCompressedMomentum;
  }
  const optim::CompressedConstants k = constants({.lr = ctx.lr, .grad_scale = ctx.grad_scale, .lrs = plan.lrs_at_sync});
  // The compressed-gradient phase's fp32 copy of the local gradients (a transient buffer), allocated
  // outside the kernels so that a measuring run counts it.
  memory::DeviceBlock g32;
  if (phase == Phase::kCompressedGradient) {
    g32 = device_->allocate(all.size * sizeof(float), memory::Category::kCommBuffers, memory::Lifetime::kTransient);
  }
  auto chunk_at = [&](size_t at, size_t n, bool decay, float* master, void* low, const float* grad) {
    optim::CompressedChunk ch{};
    ch.master = master;
    ch.exp_avg = m_at(at);
    ch.exp_avg_sq = stepped.contains(at) ? v_at(at) : nullptr;
    ch.accumulator = c.accumulator.empty() ? nullptr : u_at(at);
    ch.grad = grad;
    ch.n = n;
    ch.low_precision = low;
    ch.low_precision_dtype = dtype_;
    ch.apply_weight_decay = decay;
    return ch;
  };

  memory::run_kernel(*backend_, [&] {
  switch (phase) {
    case Phase::kAdam:
      s.for_each_piece(stepped, [&](size_t at, size_t n, bool decay, int t) {
        const float* g = s.grad_f32(at, n, t).data();
        s.with_master(at, n, t, [&](float* master, void* low) { optim::adam_update(chunk_at(at, n, decay, master, low, g), k); });
      });
      break;
    case Phase::kCompressedGradient: {
      // The local gradients, scaled, in fp32 for the compressed allreduce.
      float* g = static_cast<float*>(g32.data());
      std::memset(g, 0, g32.size());  // the padding between parameters stays zero
      s.for_each_piece(all, [&](size_t at, size_t n, bool, int t) {
        std::span<const float> src = s.grad_f32(at, n, t);
        for (size_t i = 0; i < n; ++i) g[at + i] = src[i] * ctx.grad_scale;
      });
      c.reduce->allreduce({g, all.size});
      const optim::CompressedConstants unscaled = constants({.lr = ctx.lr, .grad_scale = 1.0f});
      s.for_each_piece(stepped, [&](size_t at, size_t n, bool decay, int t) {
        mask_unvisited(g + at, v_at(at), n);
        s.with_master(at, n, t, [&](float* master, void* low) {
          optim::CompressedChunk ch = chunk_at(at, n, decay, master, low, g + at);
          optim::momentum_update(ch, unscaled);
          optim::frozen_update(ch, unscaled);
        });
      });
      break;
    }
    case Phase::kCompressedMomentum: {
      if (!c.momentum_whole) {
        gather_momentum();
        c.momentum_whole = true;
      }
      s.for_each_piece(all, [&](size_t at, size_t n, bool decay, int t) {
        optim::momentum_update(chunk_at(at, n, decay, nullptr, nullptr, s.grad_f32(at, n, t).data()), k);
      });
      c.reduce->allreduce({m_all, all.size});
      s.for_each_piece(stepped, [&](size_t at, size_t n, bool decay, int t) {
        mask_unvisited(m_at(at), v_at(at), n);
        s.with_master(at, n, t, [&](float* master, void* low) { optim::frozen_update(chunk_at(at, n, decay, master, low, nullptr), k); });
      });
      break;
    }
    case Phase::kLocalStep: {
      // Stage 0: every rank steps its own copy of the whole model.
      s.for_each_piece(all, [&](size_t at, size_t n, bool decay, int t) {
        const float* g = s.grad_f32(at, n, t).data();
        s.with_master(at, n, t, [&](float* master, void* low) { optim::local_step(chunk_at(at, n, decay, master, low, g), k); });
      });
      if (plan.sync) {
        s.for_each_piece(all, [&](size_t at, size_t n, bool decay, int t) {
          s.with_master(at, n, t, [&](float* master, void*) { optim::sync_prepare(chunk_at(at, n, decay, master, nullptr, nullptr), k); });
        });
        c.reduce->allreduce({u_at(0), all.size});
        s.for_each_piece(all, [&](size_t at, size_t n, bool decay, int t) {
          mask_unvisited(u_at(at), v_at(at), n);
          s.with_master(at, n, t, [&](float* master, void* low) {
            optim::sync_finish(chunk_at(at, n, decay, master, low, nullptr), k);
          });
        });
      }
      break;
    }
  }
  });
  if (c.schedule) c.schedule->advance(ctx.step, ctx.lr);
}

void Engine::Impl::gather_momentum() {
  // Stages 1-3 at the first compressed step: every rank holds the momentum of its stepped range; the
  // compressed steps need all of it (Note [compressed optimizers]). Once per run, in buckets.
  allgather_in_place(group_, dense().partition,
                     memory::Tensor(compressed_->momentum.data(), memory::DType::kF32, {static_cast<int64_t>(dense().layout.total())}),
                     static_cast<size_t>(cfg_.zero.allgather_bucket_size));
  ZS_LOG_DEBUG("{}: momentum gathered for the compressed phase", cfg_.optimizer.name());
}

}  // namespace zs::engine
