#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>

#include "core/errors.h"

namespace zs::optim {

ScheduleType parse_schedule_type(const std::string& name, const std::string& json_path) {
  if (name == "WarmupLR") return ScheduleType::kWarmupLR;
  if (name == "WarmupDecayLR") return ScheduleType::kWarmupDecayLR;
  if (name == "WarmupCosineLR") return ScheduleType::kWarmupCosineLR;
  if (name == "OneCycle") return ScheduleType::kOneCycle;
  if (name == "LRRangeTest") {
    throw ConfigError(fmt::format("{}: DeepSpeed's '{}' scheduler is not implemented by zeroshard yet; use WarmupLR, "
                                  "WarmupDecayLR, WarmupCosineLR or OneCycle",
                                  json_path, name));
  }
  throw ConfigError(fmt::format("{}: unknown scheduler '{}'; use WarmupLR, WarmupDecayLR, WarmupCosineLR or OneCycle",
                                json_path, name));
}

std::string schedule_type_name(ScheduleType type) {
  switch (type) {
    case ScheduleType::kConstant: return "Constant";
    case ScheduleType::kWarmupLR: return "WarmupLR";
    case ScheduleType::kWarmupDecayLR: return "WarmupDecayLR";
    case ScheduleType::kWarmupCosineLR: return "WarmupCosineLR";
    case ScheduleType::kOneCycle: return "OneCycle";
  }
  return "?";
}

void validate(const LrScheduleConfig& c, const std::string& path) {
  auto fail = [&](const std::string& key, const std::string& what) {
    throw ConfigError(fmt::format("{}.{}: {}", path, key, what));
  };
  if (c.type == ScheduleType::kConstant) return;
  if (c.type == ScheduleType::kOneCycle) {
    const auto& o = c.one_cycle;
    if (!(o.cycle_min_lr >= 0)) fail("cycle_min_lr", fmt::format("must be >= 0, got {}", o.cycle_min_lr));
    if (!(o.cycle_max_lr >= 0)) fail("cycle_max_lr", fmt::format("must be >= 0, got {}", o.cycle_max_lr));
    if (o.cycle_first_step_size <= 0) fail("cycle_first_step_size", fmt::format("must be > 0, got {}", o.cycle_first_step_size));
    if (o.cycle_second_step_size < 0) fail("cycle_second_step_size", fmt::format("must be > 0, got {}", o.cycle_second_step_size));
    if (o.cycle_first_stair_count < 0) fail("cycle_first_stair_count", "must be >= 0");
    if (o.decay_step_size < 0) fail("decay_step_size", "must be >= 0");
    for (auto [key, mom] : {std::pair{"cycle_min_mom", o.cycle_min_mom}, std::pair{"cycle_max_mom", o.cycle_max_mom}}) {
      if (!(mom >= 0 && mom < 1)) fail(key, fmt::format("must be in [0, 1) (it becomes the optimizer's betas[0]), got {}", mom));
    }
    return;
  }
  // DeepSpeed raises a warmup_num_steps below 1 as an error and uses max(2, warmup_num_steps).
  if (c.warmup_num_steps < 1) fail("warmup_num_steps", fmt::format("must be >= 1 (DeepSpeed's rule), got {}", c.warmup_num_steps));
  if (c.type == ScheduleType::kWarmupLR || c.type == ScheduleType::kWarmupDecayLR) {
    if (!(c.warmup_min_lr >= 0)) fail("warmup_min_lr", fmt::format("must be >= 0, got {}", c.warmup_min_lr));
    if (!(c.warmup_max_lr >= c.warmup_min_lr)) {
      fail("warmup_max_lr", fmt::format("must be >= warmup_min_lr ({}), got {}", c.warmup_min_lr, c.warmup_max_lr));
    }
  }
  if (c.type == ScheduleType::kWarmupDecayLR || c.type == ScheduleType::kWarmupCosineLR) {
    if (c.total_num_steps <= 0) fail("total_num_steps", "is required and must be > 0 for this scheduler");
    if (c.total_num_steps < c.warmup_num_steps) {
      fail("total_num_steps", fmt::format("({}) is less than warmup_num_steps ({})", c.total_num_steps, c.warmup_num_steps));
    }
  }
  if (c.type == ScheduleType::kWarmupCosineLR) {
    if (!(c.warmup_min_ratio >= 0 && c.warmup_min_ratio <= 1)) fail("warmup_min_ratio", "must be in [0, 1]");
    if (!(c.cos_min_ratio >= 0 && c.cos_min_ratio <= 1)) fail("cos_min_ratio", "must be in [0, 1]");
  }
}

// Note [schedule step alignment]. Read from deepspeedai/DeepSpeed at commit 22779f2c:
// - runtime/engine.py, DeepSpeedEngine._take_model_step: `self.optimizer.step()`, then, unless the
//   optimizer reports an overflow, `self.lr_scheduler.step(**(lr_kwargs or {}))`; _scheduler_from_config
//   only constructs the scheduler (`scheduler(optimizer, **scheduler_params)`), it never steps it.
// - runtime/lr_schedules.py: each scheduler's __init__ with last_batch_iteration = -1 (the default)
//   writes get_lr() into the optimizer (WarmupLR.__init__: `if last_batch_iteration == -1:
//   self._last_lr = update_lr(..., self.get_lr())`); get_lr() at -1 is warmup_min_lr (WarmupLR,
//   WarmupDecayLR: "before it has started" returns min_lrs) or 0 (WarmupCosineLR.get_lr); OneCycle's
//   _initialize_lr / _initialize_momentum set cycle_min_lr and betas (cycle_min_mom, 0.99). step()
//   increments last_batch_iteration and writes get_lr() again.
// So optimizer step k (0-based) runs with get_lr() at last_batch_iteration k - 1: a log WarmupLR from
// 0 to 1e-3 over 10 steps gives 0, 0, 3.01e-4, 4.77e-4, ... (zeroshard before this note gave step k
// the value at k: 0, 3.01e-4, 4.77e-4, one step ahead). lr_at(0) is the constructor's value and
// lr_at(k) = lr_after(k - 1); tests/optim/schedule_test.cpp checks every schedule against DeepSpeed's
// formulas written out there, driven by the same construct-then-step loop. Also DeepSpeed's: W =
// max(2, warmup_num_steps) (its __init__), and the warm-up and cosine formulas at iteration i.
double LrSchedule::warmup_fraction(int64_t iteration) const {
  const auto w = std::max<int64_t>(2, config_.warmup_num_steps);
  if (iteration >= w) return 1.0;
  if (config_.warmup_type == WarmupType::kLinear) return static_cast<double>(iteration) / static_cast<double>(w);
  return std::log(static_cast<double>(iteration) + 1.0) / std::log(static_cast<double>(w));
}

// OneCycle's _get_scale_factor, literally: the position in the current cycle as a fraction of the
// half it is in (rising 0 -> 1 over the first half, falling 1 -> 0 over the second), stairs counted
// from the integer offset into the cycle.
double LrSchedule::one_cycle_scale(int64_t iteration) const {
  const auto& o = config_.one_cycle;
  const double first = static_cast<double>(o.cycle_first_step_size);
  const double second = static_cast<double>(o.cycle_second_step_size > 0 ? o.cycle_second_step_size : o.cycle_first_step_size);
  const double total = first + second;
  const double step_ratio = first / total;
  const double batch = static_cast<double>(iteration + 1);
  const double cycle = std::floor(1.0 + batch / total);
  const double x = 1.0 + batch / total - cycle;
  const int64_t second_stairs = o.cycle_second_stair_count >= 0 ? o.cycle_second_stair_count : o.cycle_first_stair_count;
  double scale = 0.0;
  int64_t stairs = 0;
  if (x <= step_ratio) {
    scale = x / step_ratio;
    stairs = o.cycle_first_stair_count;
  } else {
    scale = (x - 1.0) / (step_ratio - 1.0);
    stairs = second_stairs;
  }
  if (stairs > 0) {
    const double in_cycle = std::fmod(batch, total);
    const double position = in_cycle <= first ? in_cycle * static_cast<double>(stairs) / first
                                              : (total - in_cycle) * static_cast<double>(stairs) / second;
    scale = std::floor(position) / static_cast<double>(stairs);
  }
  return scale;
}

double LrSchedule::lr_after(int64_t i) const {
  const auto& c = config_;
  const auto w = std::max<int64_t>(2, c.warmup_num_steps);
  switch (c.type) {
    case ScheduleType::kConstant:
      return c.base_lr;
    case ScheduleType::kWarmupLR:
      return c.warmup_min_lr + (c.warmup_max_lr - c.warmup_min_lr) * warmup_fraction(i);
    case ScheduleType::kWarmupDecayLR: {
      double gamma = i < w ? warmup_fraction(i)
                           : std::max(0.0, static_cast<double>(c.total_num_steps - i) /
                                               std::max(1.0, static_cast<double>(c.total_num_steps - w)));
      return c.warmup_min_lr + (c.warmup_max_lr - c.warmup_min_lr) * gamma;
    }
    case ScheduleType::kWarmupCosineLR: {
      if (i < w) return c.base_lr * (c.warmup_min_ratio + warmup_fraction(i) * (1.0 - c.warmup_min_ratio));
      double progress = std::min(1.0, static_cast<double>(i - w + 1) /
                                          static_cast<double>(std::max<int64_t>(1, c.total_num_steps - w)));
      double cosine = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
      return c.base_lr * std::max(0.0, c.cos_min_ratio + (1.0 - c.cos_min_ratio) * cosine);
    }
    case ScheduleType::kOneCycle: {
      const auto& o = c.one_cycle;
      const int64_t total = o.cycle_first_step_size + (o.cycle_second_step_size > 0 ? o.cycle_second_step_size
                                                                                     : o.cycle_first_step_size);
      if (i < total) return o.cycle_min_lr + (o.cycle_max_lr - o.cycle_min_lr) * one_cycle_scale(i);
      if (o.decay_step_size == 0 || o.decay_lr_rate == 0.0) return o.cycle_min_lr;
      const double interval = static_cast<double>(i - total + 1) / static_cast<double>(o.decay_step_size);
      return o.cycle_min_lr / (1.0 + o.decay_lr_rate * interval);
    }
  }
  return c.base_lr;
}

double LrSchedule::lr_at(int64_t step) const {
  if (step > 0) return lr_after(step - 1);
  switch (config_.type) {
    case ScheduleType::kConstant: return config_.base_lr;
    case ScheduleType::kWarmupLR:
    case ScheduleType::kWarmupDecayLR: return config_.warmup_min_lr;
    case ScheduleType::kWarmupCosineLR: return 0.0;
    case ScheduleType::kOneCycle: return config_.one_cycle.cycle_min_lr;
  }
  return config_.base_lr;
}

std::optional<std::array<double, 2>> LrSchedule::betas_at(int64_t step) const {
  if (!cycles_momentum()) return std::nullopt;
  // DeepSpeed keeps (momentum, 0.99) pairs: its OneCycle sets beta2 to 0.99 whatever the optimizer had.
  constexpr double kBeta2 = 0.99;
  const auto& o = config_.one_cycle;
  if (step == 0) return std::array<double, 2>{o.cycle_min_mom, kBeta2};
  const int64_t i = step - 1;
  const int64_t total = o.cycle_first_step_size + (o.cycle_second_step_size > 0 ? o.cycle_second_step_size
                                                                                 : o.cycle_first_step_size);
  if (i < total) return std::array<double, 2>{o.cycle_max_mom - (o.cycle_max_mom - o.cycle_min_mom) * one_cycle_scale(i), kBeta2};
  if (o.decay_step_size == 0 || o.decay_mom_rate == 0.0) return std::array<double, 2>{o.cycle_max_mom, kBeta2};
  const double interval = static_cast<double>(i - total + 1) / static_cast<double>(o.decay_step_size);
  return std::array<double, 2>{o.cycle_max_mom * (1.0 + o.decay_mom_rate * interval), kBeta2};
}

}  // namespace zs::optim
