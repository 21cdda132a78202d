// One-bit Adam / 0/1 Adam (optim/onebit_adam.h, optim/zero_one_adam.h):
//   - every fast kernel against its scalar reference, bit for bit, on every ISA this machine runs,
//     odd lengths, with and without the bf16/fp16 copy and weight decay, and through run_parallel;
//   - ZeroOneSchedule against a direct port of zoadam.py's bookkeeping over 5000 steps;
//   - whole algorithms on K simulated ranks with an exact averaging in place of the compressed
//     allreduce: one-bit Adam == Adam without bias correction (v frozen after freeze_step), 0/1 Adam
//     with local_step_clipper 1 == synchronous training, and both against double-precision ports of
//     DeepSpeed's loops on a small quadratic problem.
#include "optim/onebit_adam.h"
#include "optim/zero_one_adam.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/errors.h"
#include "memory/cpu_features.h"
#include "memory/dtype.h"
#include "optim/adam.h"

namespace zs::optim {

// gtest prints parameterised configs with this (found by argument-dependent lookup).
void PrintTo(const ZeroOneAdamConfig& c, std::ostream* os) {
  *os << "{var_freeze_step " << c.var_freeze_step << ", var_update_scaler " << c.var_update_scaler
      << ", local_step_scaler " << c.local_step_scaler << ", local_step_clipper " << c.local_step_clipper << "}";
}

namespace {

using memory::DType;
using memory::IsaLevel;
using Kind = ZeroOneSchedule::Kind;

// ---------------------------------------------------------------------------------------------------
// Kernels against their references.

struct Buffers {
  std::vector<float> p, m, v, u, g;
  std::vector<uint16_t> low;
  Buffers(size_t n, uint32_t seed) : p(n), m(n), v(n), u(n), g(n), low(n, 0xDEAD) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (size_t i = 0; i < n; ++i) {
      p[i] = dist(gen);
      m[i] = dist(gen) * 1e-3f;
      v[i] = std::abs(dist(gen)) * 1e-5f;
      u[i] = dist(gen) * 1e-3f;
      g[i] = dist(gen) * 1e-2f;
    }
    // Zero gradient and moments (denominator = eps), a negative zero weight and accumulator, a tiny
    // weight that rounds to an fp16 subnormal.
    if (n > 3) {
      g[1] = 0.0f, m[1] = 0.0f, v[1] = 0.0f;
      p[2] = -0.0f, u[2] = -0.0f;
      p[3] = 3e-6f;
    }
  }
  CompressedChunk chunk(std::optional<DType> low_dtype, bool decay) {
    CompressedChunk c{.master = p.data(), .exp_avg = m.data(), .exp_avg_sq = v.data(), .accumulator = u.data(),
                      .grad = g.data(), .n = p.size(), .apply_weight_decay = decay};
    if (low_dtype) {
      c.low_precision = low.data();
      c.low_precision_dtype = *low_dtype;
    }
    return c;
  }
};

template <typename T>
void expect_same_bits(const std::vector<T>& a, const std::vector<T>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) {
      FAIL() << what << " differs at element " << i << " of " << a.size() << ": " << +a[i] << " vs " << +b[i];
    }
  }
}

void expect_same(const Buffers& a, const Buffers& b, const std::string& what) {
  expect_same_bits(a.p, b.p, what + " master");
  expect_same_bits(a.m, b.m, what + " exp_avg");
  expect_same_bits(a.v, b.v, what + " exp_avg_sq");
  expect_same_bits(a.u, b.u, what + " accumulator");
  expect_same_bits(a.g, b.g, what + " grad");
  expect_same_bits(a.low, b.low, what + " low copy");
}

using Reference = std::function<void(const CompressedChunk&, const CompressedConstants&)>;

struct KernelCase {
  const char* name;
  CompressedKernel fast;
  Reference reference;
};

std::vector<KernelCase> kernel_cases() {
  return {
      {"adam_update", adam_update, adam_update_reference},
      {"momentum_update", momentum_update, momentum_update_reference},
      {"frozen_update", frozen_update, frozen_update_reference},
      {"local_step", local_step, local_step_reference},
      {"sync_prepare", sync_prepare, sync_prepare_reference},
      {"local_step_sync_prepare", local_step_sync_prepare,
       [](const CompressedChunk& c, const CompressedConstants& k) {
         CompressedChunk no_low = c;
         no_low.low_precision = nullptr;  // the fused kernel leaves the copy to sync_finish
         local_step_reference(no_low, k);
         sync_prepare_reference(c, k);
       }},
      {"sync_finish", sync_finish, sync_finish_reference},
  };
}

CompressedConstants test_constants(double lrs) {
  const ZeroOneAdamConfig cfg{.lr = 3e-3, .betas = {0.9, 0.95}, .eps = 1e-8, .weight_decay = 0.1};
  return compressed_constants(cfg, {.lr = 3e-3, .grad_scale = 0.5f, .lrs = lrs});
}

TEST(OneBitKernels, EqualTheirReferencesBitForBit) {
  const std::optional<DType> lows[] = {std::nullopt, DType::kBF16, DType::kF16};
  int checked = 0;
  for (const KernelCase& kc : kernel_cases()) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{33}, size_t{1001}, size_t{100003}}) {
      for (std::optional<DType> low : lows) {
        for (bool decay : {true, false}) {
          for (double lrs : {0.02, 0.0}) {
            if (lrs == 0.0 && std::string(kc.name) != "sync_finish") continue;
            const CompressedConstants k = test_constants(lrs);
            const std::string what = std::string(kc.name) + " n=" + std::to_string(n) +
                                     " low=" + (low ? std::string(memory::dtype_name(*low)) : "none") +
                                     (decay ? " decay" : " no-decay") + " lrs=" + std::to_string(lrs);
            Buffers want(n, 7);
            kc.reference(want.chunk(low, decay), k);
            for (IsaLevel isa : memory::supported_isas()) {
              Buffers got(n, 7);
              kc.fast(got.chunk(low, decay), k, isa);
              expect_same(got, want, what + " isa=" + std::string(memory::isa_name(isa)));
              ++checked;
            }
            Buffers par(n, 7);
            run_parallel(kc.fast, par.chunk(low, decay), k, 2);
            expect_same(par, want, what + " run_parallel(2)");
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
  EXPECT_GE(checked, 7 * 5 * 3 * 2);
}

TEST(OneBitKernels, ReferencesFollowTheDocumentedFormulas) {
  // One element by hand, so the oracle itself cannot drift from onebit_adam.h.
  const CompressedConstants k = test_constants(0.02);
  float p = 0.5f, m = 0.01f, v = 4e-4f, u = 0.003f, g = 0.2f;
  CompressedChunk c{.master = &p, .exp_avg = &m, .exp_avg_sq = &v, .accumulator = &u, .grad = &g, .n = 1};
  local_step_reference(c, k);
  const float m1 = k.beta1 * 0.01f + k.one_minus_beta1 * (0.2f * 0.5f);
  const float upd = m1 / (std::sqrt(4e-4f) + k.eps) + k.weight_decay * 0.5f;
  EXPECT_EQ(m, m1);
  EXPECT_EQ(p, 0.5f - k.lr * upd);
  EXPECT_EQ(u, 0.003f - k.lr * upd);
  const float p1 = p, u1 = u;
  sync_prepare_reference(c, k);
  EXPECT_EQ(p, p1 - u1);
  EXPECT_EQ(u, u1 * (std::sqrt(v) + k.eps));
  const float p2 = p, u2 = u;
  sync_finish_reference(c, k);
  EXPECT_EQ(m, -(u2 / k.lrs));
  EXPECT_EQ(p, p2 + u2 / (std::sqrt(v) + k.eps));
  EXPECT_EQ(u, 0.0f);
  EXPECT_EQ(k.one_minus_beta1, static_cast<float>(1.0 - 0.9));
}

TEST(OneBitKernels, SyncFinishWithZeroLrsKeepsTheMomentum) {
  Buffers b(33, 3);
  const std::vector<float> m0 = b.m;
  sync_finish(b.chunk(std::nullopt, true), test_constants(0.0));
  expect_same_bits(b.m, m0, "exp_avg");
  for (float x : b.u) EXPECT_EQ(x, 0.0f);
}

TEST(OneBitKernels, SliceOffsetsEveryArray) {
  Buffers b(100, 1);
  const CompressedChunk c = b.chunk(DType::kF16, true);
  const CompressedChunk s = c.slice(10, 30);
  EXPECT_EQ(s.n, 20u);
  EXPECT_EQ(s.master, b.p.data() + 10);
  EXPECT_EQ(s.accumulator, b.u.data() + 10);
  EXPECT_EQ(s.grad, b.g.data() + 10);
  EXPECT_EQ(s.low_precision, static_cast<void*>(b.low.data() + 10));
  CompressedChunk partial{.exp_avg = b.m.data(), .grad = b.g.data(), .n = 100};
  EXPECT_EQ(partial.slice(5, 6).master, nullptr);
  EXPECT_THROW(c.slice(30, 10), InternalError);
  EXPECT_THROW(adam_update(partial, test_constants(0)), InternalError);  // master is null
}

// ---------------------------------------------------------------------------------------------------
// Configs and phases.

TEST(OneBitConfig, ValidateNamesTheKey) {
  auto message = [](auto cfg) {
    try {
      validate(cfg, "optimizer.params");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message(OneBitAdamConfig{}), "");
  EXPECT_EQ(message(ZeroOneAdamConfig{}), "");
  EXPECT_NE(message(OneBitAdamConfig{.freeze_step = 0}).find("optimizer.params.freeze_step"), std::string::npos);
  EXPECT_NE(message(OneBitAdamConfig{.betas = {0.9, 1.0}}).find("optimizer.params.betas[1]"), std::string::npos);
  EXPECT_NE(message(OneBitAdamConfig{.eps = 0}).find("optimizer.params.eps"), std::string::npos);
  EXPECT_NE(message(ZeroOneAdamConfig{.lr = -1}).find("optimizer.params.lr"), std::string::npos);
  EXPECT_NE(message(ZeroOneAdamConfig{.weight_decay = -0.1}).find("optimizer.params.weight_decay"), std::string::npos);
  EXPECT_NE(message(ZeroOneAdamConfig{.var_freeze_step = -1}).find("optimizer.params.var_freeze_step"),
            std::string::npos);
  EXPECT_NE(message(ZeroOneAdamConfig{.var_update_scaler = 0}).find("optimizer.params.var_update_scaler"),
            std::string::npos);
  EXPECT_NE(message(ZeroOneAdamConfig{.local_step_scaler = 0}).find("optimizer.params.local_step_scaler"),
            std::string::npos);
  EXPECT_NE(message(ZeroOneAdamConfig{.local_step_clipper = 0}).find("optimizer.params.local_step_clipper"),
            std::string::npos);
  EXPECT_THROW(ZeroOneSchedule(ZeroOneAdamConfig{.local_step_clipper = 0}), ConfigError);
}

TEST(OneBitConfig, FrozenAfterFreezeStep) {
  const OneBitAdamConfig cfg{.freeze_step = 5};
  for (int64_t t = 1; t <= 5; ++t) EXPECT_FALSE(one_bit_frozen(cfg, t)) << t;
  EXPECT_TRUE(one_bit_frozen(cfg, 6));
  EXPECT_TRUE(one_bit_frozen(cfg, 1000));
}

// A direct port of zoadam.py's bookkeeping (state['step'] = t, its initialisation call left out).
struct ZoadamPort {
  ZeroOneAdamConfig cfg;
  int64_t step = 0, var_interval = 1, var_counter = 0, local_step_interval = 1, local_step_counter = 0;
  double lrs = 0;
  bool freeze_key = false, reinitial_error_buffer = false, enable_backward_allreduce = true;
  bool errors_zeroed_last_step = false;

  struct Record {
    Kind kind;
    bool allreduce;  // enable_backward_allreduce while this step's backward ran
    bool sync = false;
    double lrs_at_sync = 0;
    bool errors_zeroed_before = false;
  };

  Record run(double lr) {
    Record r{.kind = Kind::kLocal, .allreduce = enable_backward_allreduce,
             .errors_zeroed_before = errors_zeroed_last_step};
    step += 1;
    if (!freeze_key) {
      r.kind = step % var_interval == 0 ? Kind::kVarUpdate : Kind::kCompressedGradient;
    } else {
      lrs += lr;
    }
    if (step % local_step_interval == 0 && freeze_key) {
      r.sync = true;
      r.lrs_at_sync = lrs;
      lrs = 0;
    }
    if (!freeze_key) {
      if (step % var_interval == 0) {
        var_counter += 1;
        if (var_counter == cfg.var_update_scaler) {
          var_counter = 0;
          var_interval *= 2;
        }
      }
      enable_backward_allreduce = (step + 1) % var_interval == 0;
    } else {
      local_step_counter += 1;
      if (local_step_counter == cfg.local_step_scaler) {
        local_step_counter = 0;
        local_step_interval = std::min(cfg.local_step_clipper, local_step_interval * 2);
      }
    }
    if (step > cfg.var_freeze_step) {
      freeze_key = true;
      enable_backward_allreduce = false;
    }
    errors_zeroed_last_step = false;
    if (freeze_key && !reinitial_error_buffer) {
      errors_zeroed_last_step = true;
      reinitial_error_buffer = true;
    }
    return r;
  }
};

double varying_lr(int64_t t) { return 1e-3 * (1.0 + 0.5 * std::sin(0.1 * static_cast<double>(t))); }

class ZeroOneScheduleVsPort : public ::testing::TestWithParam<ZeroOneAdamConfig> {};

TEST_P(ZeroOneScheduleVsPort, MatchesZoadamStepByStep) {
  const ZeroOneAdamConfig cfg = GetParam();
  ZeroOneSchedule sched(cfg);
  ZoadamPort port{.cfg = cfg};
  int counts[3] = {0, 0, 0};
  int syncs = 0;
  for (int64_t t = 1; t <= 5000; ++t) {
    const double lr = varying_lr(t);
    const ZeroOneSchedule::Plan plan = sched.plan(t, lr);
    const ZoadamPort::Record want = port.run(lr);
    ASSERT_EQ(plan.kind, want.kind) << "step " << t;
    if (plan.kind != Kind::kLocal) {
      // The engine must know before the backward whether gradients are averaged exactly.
      ASSERT_EQ(plan.kind == Kind::kVarUpdate, want.allreduce) << "step " << t;
    } else {
      ASSERT_FALSE(want.allreduce) << "step " << t;
    }
    ASSERT_EQ(plan.sync, want.sync) << "step " << t;
    if (plan.sync) {
      ASSERT_EQ(plan.lrs_at_sync, want.lrs_at_sync) << "step " << t;
    }
    ASSERT_EQ(plan.reset_errors, want.errors_zeroed_before) << "step " << t;
    sched.advance(t, lr);
    ASSERT_EQ(sched.state().var_interval, port.var_interval) << "step " << t;
    ASSERT_EQ(sched.state().local_step_interval, port.local_step_interval) << "step " << t;
    ASSERT_EQ(sched.state().lrs, port.lrs) << "step " << t;
    ASSERT_EQ(sched.frozen(), port.freeze_key) << "step " << t;
    ++counts[static_cast<int>(plan.kind)];
    syncs += plan.sync ? 1 : 0;
  }
  // Not vacuous: each phase that the config reaches within 5000 steps really ran.
  EXPECT_GT(counts[static_cast<int>(Kind::kVarUpdate)], 0);
  if (cfg.var_freeze_step < 4999) {
    EXPECT_GT(counts[static_cast<int>(Kind::kLocal)], 0);
    EXPECT_GT(syncs, 0);
  }
  if (cfg.var_update_scaler < 1000 && cfg.var_freeze_step > 20) {
    EXPECT_GT(counts[static_cast<int>(Kind::kCompressedGradient)], 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Configs, ZeroOneScheduleVsPort,
    ::testing::Values(
        ZeroOneAdamConfig{.var_freeze_step = 300, .var_update_scaler = 4, .local_step_scaler = 50, .local_step_clipper = 8},
        ZeroOneAdamConfig{.var_freeze_step = 4000, .var_update_scaler = 2, .local_step_scaler = 7, .local_step_clipper = 16},
        ZeroOneAdamConfig{.var_freeze_step = 0, .var_update_scaler = 1, .local_step_scaler = 1, .local_step_clipper = 16},
        ZeroOneAdamConfig{.var_freeze_step = 10, .var_update_scaler = 3, .local_step_scaler = 5, .local_step_clipper = 1},
        ZeroOneAdamConfig{.var_freeze_step = 100000}));

TEST(ZeroOneSchedule, ResumesFromItsState) {
  const ZeroOneAdamConfig cfg{.var_freeze_step = 300, .var_update_scaler = 4, .local_step_scaler = 50,
                              .local_step_clipper = 8};
  ZeroOneSchedule whole(cfg), first(cfg);
  std::vector<ZeroOneSchedule::Plan> want;
  for (int64_t t = 1; t <= 1000; ++t) {
    want.push_back(whole.plan(t, varying_lr(t)));
    whole.advance(t, varying_lr(t));
  }
  for (int64_t t = 1; t <= 437; ++t) first.advance(t, varying_lr(t));
  ZeroOneSchedule resumed(cfg);
  resumed.set_state(first.state());
  for (int64_t t = 438; t <= 1000; ++t) {
    const auto p = resumed.plan(t, varying_lr(t));
    const auto& w = want[static_cast<size_t>(t - 1)];
    ASSERT_EQ(p.kind, w.kind) << t;
    ASSERT_EQ(p.sync, w.sync) << t;
    ASSERT_EQ(p.reset_errors, w.reset_errors) << t;
    ASSERT_EQ(p.lrs_at_sync, w.lrs_at_sync) << t;
    resumed.advance(t, varying_lr(t));
  }
  EXPECT_THROW(resumed.plan(5, 1e-3), InternalError);  // steps run in order
  auto bad = [&](auto edit) {
    ZeroOneSchedule::State s = first.state();
    edit(s);
    ZeroOneSchedule fresh(cfg);
    EXPECT_THROW(fresh.set_state(s), CheckpointError);
  };
  bad([](auto& s) { s.var_interval = 3; });
  bad([](auto& s) { s.var_counter = 4; });
  bad([](auto& s) { s.local_step_interval = 16; });
  bad([](auto& s) { s.local_step_counter = -1; });
  bad([](auto& s) { s.lrs = std::nan(""); });
  bad([](auto& s) { s.step = -2; });
}

TEST(ZeroOneSchedule, NamesKinds) {
  EXPECT_EQ(kind_name(Kind::kVarUpdate), "var_update");
  EXPECT_EQ(kind_name(Kind::kCompressedGradient), "compressed_gradient");
  EXPECT_EQ(kind_name(Kind::kLocal), "local");
}

// ---------------------------------------------------------------------------------------------------
// Whole algorithms on K simulated ranks (plain arrays, no MPI). exact_average stands in for
// comm::OneBitAllreduce: with it, the compressed algorithms must reduce to their synchronous forms.

// loss_r(p) = sum_i a_i (p_i - c_ri)^2 / 2 + noise_rt . p: rank r's gradient at step t.
struct Quadratic {
  size_t n;
  int ranks;
  std::vector<double> a;
  std::vector<std::vector<double>> c;
  Quadratic(size_t n_, int ranks_) : n(n_), ranks(ranks_), a(n_), c(static_cast<size_t>(ranks_), std::vector<double>(n_)) {
    std::mt19937 gen(11);
    std::uniform_real_distribution<float> ua(0.5f, 2.0f);
    std::normal_distribution<float> nc(0.0f, 1.0f);
    for (auto& x : a) x = ua(gen);
    for (auto& cr : c) {
      for (auto& x : cr) x = nc(gen);
    }
  }
  // A counter-based value in [-0.1, 0.1), exactly representable in fp32 (so both precisions see it).
  static double noise(int r, int64_t t, size_t i) {
    uint64_t z = (static_cast<uint64_t>(r) << 56) ^ (static_cast<uint64_t>(t) << 24) ^ i;
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (static_cast<double>(z >> 40) / static_cast<double>(1ULL << 24) - 0.5) * 0.2;
  }
  template <typename T>
  void grad(int r, int64_t t, const std::vector<T>& p, std::vector<T>& g) const {
    const auto& cr = c[static_cast<size_t>(r)];
    for (size_t i = 0; i < n; ++i) {
      g[i] = static_cast<T>(a[i]) * (p[i] - static_cast<T>(cr[i])) + static_cast<T>(noise(r, t, i));
    }
  }
};

// Replaces every buffer by the mean over the buffers (summed in double).
template <typename T>
void exact_average(std::vector<std::vector<T>*> bufs) {
  const size_t n = bufs[0]->size();
  for (size_t i = 0; i < n; ++i) {
    double sum = 0;
    for (auto* b : bufs) sum += static_cast<double>((*b)[i]);
    const auto mean = static_cast<T>(sum / static_cast<double>(bufs.size()));
    for (auto* b : bufs) (*b)[i] = mean;
  }
}

template <typename T>
struct SimRank {
  std::vector<T> p, m, v, u, g;
  SimRank(size_t n, uint32_t seed) : p(n), m(n, 0), v(n, 0), u(n, 0), g(n, 0) {
    std::mt19937 gen(seed);  // the same seed on every rank: replicas start equal
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (auto& x : p) x = static_cast<T>(dist(gen));
  }
  CompressedChunk chunk() {
    return {.master = p.data(), .exp_avg = m.data(), .exp_avg_sq = v.data(), .accumulator = u.data(),
            .grad = g.data(), .n = p.size()};
  }
};

template <typename T>
std::vector<std::vector<T>*> field(std::vector<SimRank<T>>& ranks, std::vector<T> SimRank<T>::*member) {
  std::vector<std::vector<T>*> out;
  for (auto& r : ranks) out.push_back(&(r.*member));
  return out;
}

double lr_at(int64_t t, double base) { return base * (1.0 + 0.5 * std::sin(0.05 * static_cast<double>(t))); }

// One-bit Adam on fp32 ranks with our kernels.
std::vector<SimRank<float>> run_one_bit(const OneBitAdamConfig& cfg, const Quadratic& q, int64_t steps) {
  std::vector<SimRank<float>> ranks(static_cast<size_t>(q.ranks), SimRank<float>(q.n, 5));
  for (int64_t t = 1; t <= steps; ++t) {
    const CompressedConstants k = compressed_constants(cfg, {.lr = lr_at(t, cfg.lr)});
    for (int r = 0; r < q.ranks; ++r) q.grad(r, t, ranks[static_cast<size_t>(r)].p, ranks[static_cast<size_t>(r)].g);
    if (!one_bit_frozen(cfg, t)) {
      exact_average(field(ranks, &SimRank<float>::g));
      for (auto& r : ranks) adam_update(r.chunk(), k);
    } else {
      for (auto& r : ranks) momentum_update(r.chunk(), k);
      exact_average(field(ranks, &SimRank<float>::m));
      for (auto& r : ranks) frozen_update(r.chunk(), k);
    }
  }
  return ranks;
}

// 0/1 Adam on fp32 ranks with our kernels and ZeroOneSchedule.
std::vector<SimRank<float>> run_zero_one(const ZeroOneAdamConfig& cfg, const Quadratic& q, int64_t steps,
                                         int* syncs = nullptr) {
  std::vector<SimRank<float>> ranks(static_cast<size_t>(q.ranks), SimRank<float>(q.n, 5));
  ZeroOneSchedule sched(cfg);
  for (int64_t t = 1; t <= steps; ++t) {
    const double lr = lr_at(t, cfg.lr);
    const ZeroOneSchedule::Plan plan = sched.plan(t, lr);
    const CompressedConstants k = compressed_constants(cfg, {.lr = lr, .lrs = plan.lrs_at_sync});
    for (int r = 0; r < q.ranks; ++r) q.grad(r, t, ranks[static_cast<size_t>(r)].p, ranks[static_cast<size_t>(r)].g);
    switch (plan.kind) {
      case Kind::kVarUpdate:
        exact_average(field(ranks, &SimRank<float>::g));
        for (auto& r : ranks) adam_update(r.chunk(), k);
        break;
      case Kind::kCompressedGradient:
        exact_average(field(ranks, &SimRank<float>::g));
        for (auto& r : ranks) {
          momentum_update(r.chunk(), k);
          frozen_update(r.chunk(), k);
        }
        break;
      case Kind::kLocal:
        if (!plan.sync) {
          for (auto& r : ranks) local_step(r.chunk(), k);
          break;
        }
        for (auto& r : ranks) local_step_sync_prepare(r.chunk(), k);
        exact_average(field(ranks, &SimRank<float>::u));
        for (auto& r : ranks) sync_finish(r.chunk(), k);
        if (syncs != nullptr) ++*syncs;
        break;
    }
    sched.advance(t, lr);
  }
  return ranks;
}

// Largest |got - want| / (1 + |want|) over the elements.
template <typename A, typename B>
double max_error(const std::vector<A>& got, const std::vector<B>& want) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double w = static_cast<double>(want[i]);
    worst = std::max(worst, std::abs(static_cast<double>(got[i]) - w) / (1.0 + std::abs(w)));
  }
  return worst;
}

TEST(OneBitTraining, ExactAveragingEqualsAdamWithoutBiasCorrection) {
  // With m averaged exactly, averaging commutes with the momentum update: one-bit Adam is Adam
  // without bias correction on the averaged gradient, with v frozen after freeze_step (beta2 = 1).
  const OneBitAdamConfig cfg{.lr = 2e-3, .betas = {0.9, 0.99}, .eps = 1e-8, .weight_decay = 0.01, .freeze_step = 50};
  const Quadratic q(1001, 3);
  const int64_t steps = 200;
  const auto ranks = run_one_bit(cfg, q, steps);

  AdamConfig warm{.lr = cfg.lr, .betas = cfg.betas, .eps = cfg.eps, .weight_decay = cfg.weight_decay,
                  .adam_w_mode = true, .bias_correction = false};
  AdamConfig frozen = warm;
  frozen.betas[1] = 1.0;  // v = 1 v + 0 g^2: the variance stays frozen
  const Adam adam_warm(warm), adam_frozen(frozen);
  SimRank<float> ref(q.n, 5);
  std::vector<std::vector<float>> g(static_cast<size_t>(q.ranks), std::vector<float>(q.n));
  for (int64_t t = 1; t <= steps; ++t) {
    std::vector<std::vector<float>*> gs;
    for (int r = 0; r < q.ranks; ++r) {
      q.grad(r, t, ref.p, g[static_cast<size_t>(r)]);
      gs.push_back(&g[static_cast<size_t>(r)]);
    }
    exact_average(gs);
    void* states[] = {ref.m.data(), ref.v.data()};
    (one_bit_frozen(cfg, t) ? adam_frozen : adam_warm)
        .step_reference({.master = ref.p, .grad = g[0], .states = states}, {.step = t, .lr = lr_at(t, cfg.lr)});
  }
  for (const auto& r : ranks) {
    EXPECT_LT(max_error(r.p, ref.p), 1e-5);
    EXPECT_LT(max_error(r.m, ref.m), 1e-5);
    EXPECT_LT(max_error(r.v, ref.v), 1e-5);  // Adam rounds 1 - beta2 as 1.0f - 0.99f, we as float(0.01)
  }
  EXPECT_GT(max_error(ref.p, SimRank<float>(q.n, 5).p), 0.05);  // the parameters really moved
}

TEST(ZeroOneTraining, ClipperOneWithExactAveragingIsSynchronousTraining) {
  // local_step_clipper 1 synchronises every frozen step; with exact averaging (and no weight decay,
  // which 0/1 Adam folds into the rebuilt momentum) every rank then follows synchronous training:
  // m from the averaged gradient every step, v only at the schedule's variance steps.
  const ZeroOneAdamConfig cfg{.lr = 2e-3, .betas = {0.9, 0.99}, .eps = 1e-8, .weight_decay = 0.0,
                              .var_freeze_step = 100, .var_update_scaler = 2, .local_step_scaler = 10,
                              .local_step_clipper = 1};
  const Quadratic q(1001, 3);
  const int64_t steps = 300;
  int syncs = 0;
  const auto ranks = run_zero_one(cfg, q, steps, &syncs);
  EXPECT_EQ(syncs, steps - cfg.var_freeze_step - 1);

  ZeroOneSchedule sched(cfg);
  SimRank<float> ref(q.n, 5);
  std::vector<std::vector<float>> g(static_cast<size_t>(q.ranks), std::vector<float>(q.n));
  for (int64_t t = 1; t <= steps; ++t) {
    const double lr = lr_at(t, cfg.lr);
    const Kind kind = sched.plan(t, lr).kind;
    std::vector<std::vector<float>*> gs;
    for (int r = 0; r < q.ranks; ++r) {
      q.grad(r, t, ref.p, g[static_cast<size_t>(r)]);
      gs.push_back(&g[static_cast<size_t>(r)]);
    }
    exact_average(gs);
    const CompressedConstants k = compressed_constants(cfg, {.lr = lr});
    CompressedChunk c = ref.chunk();
    c.grad = g[0].data();
    if (kind == Kind::kVarUpdate) {
      adam_update_reference(c, k);
    } else {
      momentum_update_reference(c, k);
      frozen_update_reference(c, k);
    }
    sched.advance(t, lr);
  }
  for (const auto& r : ranks) {
    EXPECT_LT(max_error(r.p, ref.p), 1e-5);
    EXPECT_LT(max_error(r.m, ref.m), 1e-5);
    EXPECT_EQ(max_error(r.v, ref.v), 0.0);  // v sees the same averaged gradients
  }
}

// Double-precision port of deepspeed/runtime/fp16/onebit/adam.py's step loop (its initialisation
// call left out), with the compressed allreduce replaced by the exact mean.
std::vector<SimRank<double>> port_one_bit(const OneBitAdamConfig& cfg, const Quadratic& q, int64_t steps) {
  std::vector<SimRank<double>> ranks(static_cast<size_t>(q.ranks), SimRank<double>(q.n, 5));
  const double beta1 = cfg.betas[0], beta2 = cfg.betas[1];
  bool adam_freeze_key = false;
  for (int64_t step = 1; step <= steps; ++step) {
    const double lr = lr_at(step, cfg.lr);
    for (int r = 0; r < q.ranks; ++r) q.grad(r, step, ranks[static_cast<size_t>(r)].p, ranks[static_cast<size_t>(r)].g);
    if (!adam_freeze_key) exact_average(field(ranks, &SimRank<double>::g));  // enable_backward_allreduce
    for (auto& s : ranks) {
      for (size_t i = 0; i < q.n; ++i) {
        s.m[i] = s.m[i] * beta1 + (1 - beta1) * s.g[i];
        if (!adam_freeze_key) s.v[i] = s.v[i] * beta2 + (1 - beta2) * s.g[i] * s.g[i];
      }
    }
    if (adam_freeze_key) exact_average(field(ranks, &SimRank<double>::m));  // compressed_allreduce(exp_avg)
    for (auto& s : ranks) {
      for (size_t i = 0; i < q.n; ++i) {
        double update = s.m[i] / (std::sqrt(s.v[i]) + cfg.eps);
        if (cfg.weight_decay > 0.0) update += cfg.weight_decay * s.p[i];
        s.p[i] += -lr * update;
      }
    }
    if (!adam_freeze_key && step >= cfg.freeze_step) adam_freeze_key = true;
  }
  return ranks;
}

// Double-precision port of zoadam.py's step loop, bookkeeping included (written independently of
// ZeroOneSchedule), with every compressed_allreduce replaced by the exact mean. DeepSpeed skips the
// momentum update of compressed-gradient steps when it has one rank; like our engine, this does not.
std::vector<SimRank<double>> port_zero_one(const ZeroOneAdamConfig& cfg, const Quadratic& q, int64_t steps) {
  std::vector<SimRank<double>> ranks(static_cast<size_t>(q.ranks), SimRank<double>(q.n, 5));
  const double beta1 = cfg.betas[0], beta2 = cfg.betas[1], eps = cfg.eps;
  int64_t var_interval = 1, var_counter = 0, local_step_interval = 1, local_step_counter = 0;
  double lrs = 0;
  bool freeze_key = false;
  for (int64_t step = 1; step <= steps; ++step) {
    const double lr = lr_at(step, cfg.lr);
    for (int r = 0; r < q.ranks; ++r) q.grad(r, step, ranks[static_cast<size_t>(r)].p, ranks[static_cast<size_t>(r)].g);
    const bool var_step = !freeze_key && step % var_interval == 0;
    if (!freeze_key) exact_average(field(ranks, &SimRank<double>::g));  // backward allreduce or grad_onebit
    if (freeze_key) lrs += lr;
    for (auto& s : ranks) {
      for (size_t i = 0; i < q.n; ++i) {
        if (var_step) s.v[i] = s.v[i] * beta2 + (1 - beta2) * s.g[i] * s.g[i];
        s.m[i] = s.m[i] * beta1 + (1 - beta1) * s.g[i];
        double update = s.m[i] / (std::sqrt(s.v[i]) + eps);
        if (cfg.weight_decay > 0.0) update += cfg.weight_decay * s.p[i];
        s.p[i] += -lr * update;
        if (freeze_key) s.u[i] += -lr * update;
      }
    }
    if (step % local_step_interval == 0 && freeze_key) {
      for (auto& s : ranks) {
        for (size_t i = 0; i < q.n; ++i) {
          s.p[i] += -1 * s.u[i];
          s.u[i] *= std::sqrt(s.v[i]) + eps;
        }
      }
      exact_average(field(ranks, &SimRank<double>::u));
      for (auto& s : ranks) {
        for (size_t i = 0; i < q.n; ++i) {
          s.m[i] = -(s.u[i] / lrs);
          s.p[i] += s.u[i] / (std::sqrt(s.v[i]) + eps);
          s.u[i] = 0;
        }
      }
      lrs = 0;
    }
    if (!freeze_key) {
      if (step % var_interval == 0 && ++var_counter == cfg.var_update_scaler) {
        var_counter = 0;
        var_interval *= 2;
      }
    } else if (++local_step_counter == cfg.local_step_scaler) {
      local_step_counter = 0;
      local_step_interval = std::min(cfg.local_step_clipper, local_step_interval * 2);
    }
    if (step > cfg.var_freeze_step) freeze_key = true;
  }
  return ranks;
}

class AgainstDoublePort : public ::testing::TestWithParam<int> {};

TEST_P(AgainstDoublePort, OneBitAdam) {
  const OneBitAdamConfig cfg{.lr = 5e-3, .betas = {0.9, 0.999}, .eps = 1e-8, .weight_decay = 0.01, .freeze_step = 100};
  const Quadratic q(64, GetParam());
  const auto got = run_one_bit(cfg, q, 300);
  const auto want = port_one_bit(cfg, q, 300);
  for (size_t r = 0; r < got.size(); ++r) {
    EXPECT_LT(max_error(got[r].p, want[r].p), 1e-5) << "rank " << r;
    EXPECT_LT(max_error(got[r].m, want[r].m), 1e-5) << "rank " << r;
    // The variance frozen at step 100 (un-bias-corrected, at 1 - 0.999^100 = 9.5% of its settled
    // value: Note [one-bit Adam freeze] in engine/config.cpp) is DeepSpeed's too.
    EXPECT_LT(max_error(got[r].v, want[r].v), 1e-5) << "rank " << r;
  }
  EXPECT_GT(max_error(want[0].p, SimRank<double>(q.n, 5).p), 0.1);  // the parameters really moved
}

TEST_P(AgainstDoublePort, ZeroOneAdam) {
  const ZeroOneAdamConfig cfg{.lr = 5e-3, .betas = {0.9, 0.999}, .eps = 1e-8, .weight_decay = 0.01,
                              .var_freeze_step = 60, .var_update_scaler = 2, .local_step_scaler = 20,
                              .local_step_clipper = 4};
  const Quadratic q(64, GetParam());
  int syncs = 0;
  // 301 steps: the last one is a local step without a sync (intervals 1, 2, then 4 from step 102),
  // so u is not zero at the end.
  const auto got = run_zero_one(cfg, q, 301, &syncs);
  const auto want = port_zero_one(cfg, q, 301);
  for (size_t r = 0; r < got.size(); ++r) {
    EXPECT_LT(max_error(got[r].p, want[r].p), 1e-5) << "rank " << r;
    EXPECT_LT(max_error(got[r].m, want[r].m), 1e-5) << "rank " << r;
    EXPECT_LT(max_error(got[r].u, want[r].u), 1e-5) << "rank " << r;
  }
  EXPECT_GT(syncs, 40);
  EXPECT_LT(syncs, 301 - 61);  // local steps without a sync happened too
  EXPECT_GT(max_error(want[0].u, std::vector<double>(q.n, 0.0)), 1e-4);
  EXPECT_GT(max_error(want[0].p, SimRank<double>(q.n, 5).p), 0.1);
}

INSTANTIATE_TEST_SUITE_P(Ranks, AgainstDoublePort, ::testing::Values(1, 3));

}  // namespace
}  // namespace zs::optim
