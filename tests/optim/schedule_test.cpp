#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <cmath>
#include <numbers>
#include <type_traits>
#include <vector>

#include "core/errors.h"
#include "optim/adam.h"
#include "optim/cadam.h"
#include "optim/lion.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"

namespace zs::optim {
namespace {

TEST(LrSchedule, ConstantIsTheOptimizerLr) {
  LrSchedule s({.type = ScheduleType::kConstant, .base_lr = 0.25});
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.lr_at(12345), 0.25);
}

// DeepSpeed's schedulers (deepspeed/runtime/lr_schedules.py) written out independently of
// optim/lr_schedule.cpp: each is an object whose get_lr() reads last_batch_iteration; the constructor
// (last_batch_iteration = -1) sets the optimizer's lr, and the engine (runtime/engine.py,
// _take_model_step) calls optimizer.step() and then scheduler.step(). Running that loop gives the lr
// (and betas) each optimizer step used in DeepSpeed.
struct DeepSpeedStep {
  double lr;
  double beta1;
  double beta2;
};

struct DsWarmup {  // WarmupLR, WarmupDecayLR (total > 0) and WarmupCosineLR (cosine)
  double min_lr, max_lr;
  int warmup;       // as configured; DeepSpeed uses max(2, warmup)
  bool log;
  int total = 0;    // WarmupDecayLR / WarmupCosineLR
  bool cosine = false;
  double org_lr = 0, warmup_min_ratio = 0, cos_min_ratio = 0;
  int last = -1;
  double get_lr() const {
    const int w = std::max(2, warmup);
    if (cosine) {
      if (last < 0) return 0.0;
      if (last < w) {
        double r = log ? std::log(last + 1.0) / std::log(double(w)) : double(last) / w;
        return org_lr * (warmup_min_ratio + r * (1.0 - warmup_min_ratio));
      }
      double progress = std::min(1.0, double(last - w + 1) / std::max(1, total - w));
      return org_lr * std::max(0.0, cos_min_ratio + (1.0 - cos_min_ratio) * (1 + std::cos(std::numbers::pi * progress)) / 2);
    }
    if (last < 0) return min_lr;
    double gamma = 1.0;
    if (last < w) {
      gamma = log ? std::log(last + 1.0) / std::log(double(w)) : double(last) / w;
    } else if (total > 0) {
      gamma = std::max(0.0, double(total - last) / std::max(1.0, double(total - w)));
    }
    return min_lr + (max_lr - min_lr) * gamma;
  }
};

struct DsOneCycle {
  double min_lr, max_lr, decay_lr_rate = 0;
  double first = 2000, second = -1;  // -1: None
  int first_stairs = 0, second_stairs = -1;
  double decay_step = 0;
  double min_mom = 0.8, max_mom = 0.9, decay_mom_rate = 0;
  int last = -1;
  double sec() const { return second < 0 ? first : second; }
  double scale() const {
    double total = first + sec(), ratio = first / total, bi = last + 1;
    double cycle = std::floor(1 + bi / total), x = 1 + bi / total - cycle;
    double f = x <= ratio ? x / ratio : (x - 1) / (ratio - 1);
    int stairs = x <= ratio ? first_stairs : (second_stairs < 0 ? first_stairs : second_stairs);
    if (stairs > 0) {
      double ci = std::fmod(bi, total);
      double pos = ci <= first ? ci * stairs / first : (total - ci) * stairs / sec();
      f = std::floor(pos) / stairs;
    }
    return f;
  }
  // After the constructor: lr = min_lr, betas = (min_mom, 0.99).
  double lr() const {
    if (last < 0) return min_lr;
    if (last < first + sec()) return min_lr + (max_lr - min_lr) * scale();
    if (decay_step == 0 || decay_lr_rate == 0) return min_lr;
    return min_lr / (1 + decay_lr_rate * ((last - (first + sec()) + 1) / decay_step));
  }
  double mom() const {
    if (last < 0) return min_mom;
    if (last < first + sec()) return max_mom - (max_mom - min_mom) * scale();
    if (decay_step == 0 || decay_mom_rate == 0) return max_mom;
    return max_mom * (1 + decay_mom_rate * ((last - (first + sec()) + 1) / decay_step));
  }
};

// Optimizer steps 0..n-1 as DeepSpeed's engine runs them: step with the current lr, then scheduler.step().
template <class Ds>
std::vector<double> deepspeed_lrs(Ds ds, int n) {
  std::vector<double> lrs;
  for (int k = 0; k < n; ++k) {
    if constexpr (std::is_same_v<Ds, DsOneCycle>) {
      lrs.push_back(ds.lr());
    } else {
      lrs.push_back(ds.get_lr());
    }
    ++ds.last;  // scheduler.step() after optimizer.step()
  }
  return lrs;
}

void expect_same_lrs(const LrSchedule& ours, const std::vector<double>& ds, const char* what) {
  for (size_t k = 0; k < ds.size(); ++k) {
    ASSERT_NEAR(ours.lr_at(static_cast<int64_t>(k)), ds[k], 1e-15 + 1e-12 * std::abs(ds[k])) << what << " step " << k;
  }
}

TEST(LrSchedule, WarmupLrMatchesDeepSpeedStepForStep) {
  // The numbers: max 1e-3 over 10 log steps. DeepSpeed: 0, 0, 3.01e-4, 4.77e-4 (one step
  // behind what zeroshard gave before Note [schedule step alignment]).
  LrSchedule s({.type = ScheduleType::kWarmupLR, .warmup_min_lr = 0, .warmup_max_lr = 1e-3, .warmup_num_steps = 10});
  EXPECT_EQ(s.lr_at(0), 0.0);
  EXPECT_EQ(s.lr_at(1), 0.0);
  EXPECT_NEAR(s.lr_at(2), 3.0103e-4, 1e-8);
  EXPECT_NEAR(s.lr_at(3), 4.7712e-4, 1e-8);
  EXPECT_NEAR(s.lr_at(10), 1e-3 * std::log(10.0) / std::log(10.0), 1e-15);  // warm-up ends at iteration 9 -> step 10
  EXPECT_NEAR(s.lr_at(9), 1e-3 * std::log(9.0) / std::log(10.0), 1e-15);
  for (bool log : {true, false}) {
    for (int w : {1, 2, 7, 100}) {
      LrSchedule ours({.type = ScheduleType::kWarmupLR, .warmup_min_lr = 0.1, .warmup_max_lr = 1.1, .warmup_num_steps = w,
                       .warmup_type = log ? WarmupType::kLog : WarmupType::kLinear});
      expect_same_lrs(ours, deepspeed_lrs(DsWarmup{.min_lr = 0.1, .max_lr = 1.1, .warmup = w, .log = log}, 250), "WarmupLR");
    }
  }
}

TEST(LrSchedule, WarmupDecayLrMatchesDeepSpeedStepForStep) {
  LrSchedule s({.type = ScheduleType::kWarmupDecayLR, .warmup_min_lr = 0.0, .warmup_max_lr = 1.0,
                .warmup_num_steps = 10, .total_num_steps = 110, .warmup_type = WarmupType::kLinear});
  EXPECT_DOUBLE_EQ(s.lr_at(6), 0.5);    // iteration 5 of 10
  EXPECT_DOUBLE_EQ(s.lr_at(11), 1.0);   // iteration 10: the warm-up's end
  EXPECT_DOUBLE_EQ(s.lr_at(61), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(111), 0.0);  // iteration 110 = total: the decay's end
  EXPECT_DOUBLE_EQ(s.lr_at(500), 0.0);
  for (bool log : {true, false}) {
    LrSchedule ours({.type = ScheduleType::kWarmupDecayLR, .warmup_min_lr = 0.01, .warmup_max_lr = 0.5,
                     .warmup_num_steps = 30, .total_num_steps = 200, .warmup_type = log ? WarmupType::kLog : WarmupType::kLinear});
    expect_same_lrs(ours, deepspeed_lrs(DsWarmup{.min_lr = 0.01, .max_lr = 0.5, .warmup = 30, .log = log, .total = 200}, 260),
                    "WarmupDecayLR");
  }
}

TEST(LrSchedule, WarmupCosineLrMatchesDeepSpeedStepForStep) {
  LrSchedule s({.type = ScheduleType::kWarmupCosineLR, .base_lr = 2.0, .warmup_num_steps = 10, .total_num_steps = 110,
                .warmup_type = WarmupType::kLinear, .warmup_min_ratio = 0.0, .cos_min_ratio = 0.1});
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.0);  // the constructor's 0, whatever warmup_min_ratio
  EXPECT_DOUBLE_EQ(s.lr_at(6), 1.0);
  // Iteration 10, the first after the warm-up: progress 1 of 100.
  EXPECT_NEAR(s.lr_at(11), 2.0 * (0.1 + 0.9 * (1 + std::cos(std::numbers::pi / 100)) / 2), 1e-12);
  EXPECT_NEAR(s.lr_at(110), 2.0 * 0.1, 1e-12);  // the decay's end
  EXPECT_NEAR(s.lr_at(1000), 2.0 * 0.1, 1e-12);
  for (bool log : {true, false}) {
    LrSchedule ours({.type = ScheduleType::kWarmupCosineLR, .base_lr = 3e-4, .warmup_num_steps = 25, .total_num_steps = 150,
                     .warmup_type = log ? WarmupType::kLog : WarmupType::kLinear, .warmup_min_ratio = 0.05,
                     .cos_min_ratio = 0.01});
    expect_same_lrs(ours,
                    deepspeed_lrs(DsWarmup{.min_lr = 0, .max_lr = 0, .warmup = 25, .log = log, .total = 150, .cosine = true,
                                           .org_lr = 3e-4, .warmup_min_ratio = 0.05, .cos_min_ratio = 0.01},
                                  200),
                    "WarmupCosineLR");
  }
}

TEST(LrSchedule, OneCycleMatchesDeepSpeedStepForStep) {
  // Symmetric cycle: up over 10 iterations, down over 10, then decay every 5.
  LrScheduleConfig c{.type = ScheduleType::kOneCycle};
  c.one_cycle = {.cycle_min_lr = 1e-4, .cycle_max_lr = 1e-3, .decay_lr_rate = 0.5, .cycle_first_step_size = 10,
                 .decay_step_size = 5, .decay_mom_rate = 0.01};
  LrSchedule s(c);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 1e-4);                            // the constructor's cycle_min_lr
  EXPECT_NEAR(s.lr_at(1), 1e-4 + 9e-4 * 0.1, 1e-15);              // iteration 0: batch 1 of 10 up
  EXPECT_NEAR(s.lr_at(10), 1e-3, 1e-15);                          // iteration 9: the peak
  EXPECT_NEAR(s.lr_at(20), 1e-4, 1e-15);                          // iteration 19: back at the bottom
  EXPECT_NEAR(s.lr_at(21), 1e-4 / (1 + 0.5 * (1.0 / 5)), 1e-15);  // iteration 20: decay interval 1/5
  ASSERT_TRUE(s.betas_at(0).has_value());
  EXPECT_DOUBLE_EQ((*s.betas_at(0))[0], 0.8);  // the constructor's cycle_min_mom
  EXPECT_DOUBLE_EQ((*s.betas_at(0))[1], 0.99);
  EXPECT_NEAR((*s.betas_at(10))[0], 0.8, 1e-12);  // momentum falls while lr rises
  EXPECT_NEAR((*s.betas_at(20))[0], 0.9, 1e-12);
  EXPECT_NEAR((*s.betas_at(21))[0], 0.9 * (1 + 0.01 * 0.2), 1e-12);

  struct Case {
    OneCycleConfig ours;
    DsOneCycle ds;
  };
  const std::vector<Case> cases = {
      {{.cycle_min_lr = 1e-4, .cycle_max_lr = 1e-3, .decay_lr_rate = 0.5, .cycle_first_step_size = 10, .decay_step_size = 5,
        .decay_mom_rate = 0.01},
       {.min_lr = 1e-4, .max_lr = 1e-3, .decay_lr_rate = 0.5, .first = 10, .decay_step = 5, .decay_mom_rate = 0.01}},
      // Asymmetric with stairs on both halves, no decay (decay_step_size 0).
      {{.cycle_min_lr = 0.01, .cycle_max_lr = 0.1, .cycle_first_step_size = 12, .cycle_second_step_size = 7,
        .cycle_first_stair_count = 4, .cycle_second_stair_count = 3, .cycle_min_mom = 0.85, .cycle_max_mom = 0.95},
       {.min_lr = 0.01, .max_lr = 0.1, .first = 12, .second = 7, .first_stairs = 4, .second_stairs = 3, .min_mom = 0.85,
        .max_mom = 0.95}},
      // Stairs on the first half only given: the second half takes the same count (DeepSpeed's None).
      {{.cycle_min_lr = 0.0, .cycle_max_lr = 1.0, .decay_lr_rate = 0.1, .cycle_first_step_size = 9,
        .cycle_first_stair_count = 3, .decay_step_size = 2},
       {.min_lr = 0.0, .max_lr = 1.0, .decay_lr_rate = 0.1, .first = 9, .first_stairs = 3, .decay_step = 2}},
  };
  for (const auto& [ours_cfg, ds_cfg] : cases) {
    LrScheduleConfig oc{.type = ScheduleType::kOneCycle};
    oc.one_cycle = ours_cfg;
    validate(oc, "scheduler.params");
    LrSchedule ours(oc);
    DsOneCycle ds = ds_cfg;
    for (int k = 0; k < 80; ++k, ++ds.last) {
      ASSERT_NEAR(ours.lr_at(k), ds.lr(), 1e-15 + 1e-12 * ds.lr()) << "OneCycle step " << k;
      auto betas = ours.betas_at(k);
      ASSERT_TRUE(betas.has_value());
      ASSERT_NEAR((*betas)[0], ds.mom(), 1e-12) << "OneCycle momentum step " << k;
      ASSERT_EQ((*betas)[1], 0.99);
    }
  }
  c.one_cycle.cycle_momentum = false;
  EXPECT_FALSE(LrSchedule(c).betas_at(3).has_value());
  EXPECT_FALSE(LrSchedule({.type = ScheduleType::kWarmupLR}).betas_at(3).has_value());
}

// OneCycle's betas reach the update: a step whose StepContext carries betas equals a step of the
// same optimizer configured with those betas (kernels and reference), for every optimizer with betas.
template <class Opt, class Config>
void expect_context_betas_replace_configured(Config with_other, Config with_these, std::array<double, 2> these) {
  constexpr size_t n = 100;
  auto run = [&](const Config& config, std::optional<std::array<double, 2>> betas) {
    Opt opt(config);
    std::vector<float> p(n), g(n);
    for (size_t i = 0; i < n; ++i) p[i] = 0.01f * static_cast<float>(i) - 0.3f;
    std::vector<std::vector<std::byte>> states;
    std::vector<void*> ptrs;
    for (const auto& spec : opt.state_specs()) states.emplace_back(spec.bytes_for(n));
    for (auto& st : states) ptrs.push_back(st.data());
    for (int64_t t = 1; t <= 4; ++t) {
      // Gradients that change sign between steps, so that the momentum (and the betas) matter to
      // the sign-update optimizers too.
      for (size_t i = 0; i < n; ++i) g[i] = std::sin(0.7f * static_cast<float>(i) + 2.1f * static_cast<float>(t)) + 0.3f;
      opt.step({.master = p, .grad = g, .states = ptrs}, {.step = t, .lr = 1e-2, .betas = betas});
    }
    return p;
  };
  EXPECT_EQ(run(with_other, these), run(with_these, std::nullopt));
  EXPECT_NE(run(with_other, std::nullopt), run(with_these, std::nullopt));
}

TEST(LrSchedule, StepContextBetasReplaceTheConfiguredOnes) {
  const std::array<double, 2> these = {0.83, 0.99};
  expect_context_betas_replace_configured<Adam>(AdamConfig{}, AdamConfig{.betas = these}, these);
  expect_context_betas_replace_configured<Lion>(LionConfig{}, LionConfig{.betas = these}, these);
  expect_context_betas_replace_configured<CAdam>(CAdamConfig{}, CAdamConfig{.betas = these}, these);
}

TEST(LrSchedule, ValidationNamesKeys) {
  try {
    validate(LrScheduleConfig{.type = ScheduleType::kWarmupDecayLR, .warmup_num_steps = 10}, "scheduler.params");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("scheduler.params.total_num_steps"), std::string::npos) << e.what();
  }
  EXPECT_THROW(validate(LrScheduleConfig{.type = ScheduleType::kWarmupLR, .warmup_min_lr = 1, .warmup_max_lr = 0.5},
                        "scheduler.params"),
               ConfigError);
  LrScheduleConfig bad_mom{.type = ScheduleType::kOneCycle};
  bad_mom.one_cycle = {.cycle_min_lr = 0, .cycle_max_lr = 1, .cycle_max_mom = 1.0};
  try {
    validate(bad_mom, "scheduler.params");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("scheduler.params.cycle_max_mom"), std::string::npos) << e.what();
  }
  EXPECT_EQ(parse_schedule_type("OneCycle", "scheduler.type"), ScheduleType::kOneCycle);
  EXPECT_THROW(parse_schedule_type("LRRangeTest", "scheduler.type"), ConfigError);
  EXPECT_THROW(parse_schedule_type("Cosine", "scheduler.type"), ConfigError);
  EXPECT_EQ(parse_schedule_type("WarmupCosineLR", "scheduler.type"), ScheduleType::kWarmupCosineLR);
}

TEST(LossScaler, StaticScaleNeverMovesButSkipsOverflow) {
  LossScaler s({.loss_scale = 128});
  EXPECT_FALSE(s.dynamic());
  EXPECT_TRUE(s.update(true));
  EXPECT_FALSE(s.update(false));
  EXPECT_DOUBLE_EQ(s.scale(), 128);
}

TEST(LossScaler, DynamicHysteresisThenHalvingThenGrowth) {
  LossScaler s({.loss_scale = 0, .initial_scale_power = 4, .loss_scale_window = 3, .hysteresis = 2, .min_loss_scale = 4});
  EXPECT_DOUBLE_EQ(s.scale(), 16);
  EXPECT_TRUE(s.update(true));   // absorbed by hysteresis
  EXPECT_DOUBLE_EQ(s.scale(), 16);
  EXPECT_TRUE(s.update(true));   // halves
  EXPECT_DOUBLE_EQ(s.scale(), 8);
  EXPECT_TRUE(s.update(true));   // hysteresis not refilled (non-consecutive mode): halves again
  EXPECT_DOUBLE_EQ(s.scale(), 4);
  EXPECT_TRUE(s.update(true));   // floor
  EXPECT_DOUBLE_EQ(s.scale(), 4);
  EXPECT_FALSE(s.update(false));
  EXPECT_FALSE(s.update(false));
  EXPECT_DOUBLE_EQ(s.scale(), 4);
  EXPECT_FALSE(s.update(false));  // third good step in a row: doubles, hysteresis refilled
  EXPECT_DOUBLE_EQ(s.scale(), 8);
  EXPECT_TRUE(s.update(true));    // absorbed again
  EXPECT_DOUBLE_EQ(s.scale(), 8);
  EXPECT_EQ(s.overflows(), 5);
}

TEST(LossScaler, DefaultDoesNotScale) {
  LossScaler s;
  EXPECT_DOUBLE_EQ(s.scale(), 1.0);
  EXPECT_FALSE(s.dynamic());
}

}  // namespace
}  // namespace zs::optim
