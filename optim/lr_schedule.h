// Learning-rate schedules with DeepSpeed's names and meaning (`scheduler.type` / `scheduler.params`),
// ported from deepspeed/runtime/lr_schedules.py (Note [schedule step alignment] in lr_schedule.cpp).
//
// lr_at(k) is the learning rate of optimizer step k, counted from 0 over the steps actually taken (a
// step skipped for an fp16 overflow does not advance the schedule, as in DeepSpeed). DeepSpeed's
// schedulers compute f(i) for their `last_batch_iteration` i and are stepped after each optimizer
// step, so optimizer step k runs with f(k - 1); f(-1) is what the constructor sets:
//   kConstant       lr = base_lr (the optimizer's lr; no `scheduler` section)
//   kWarmupLR       f(i) = min + (max - min) * gamma(i), gamma = log(i+1)/log(W) ("log") or i/W
//                   ("linear") while i < W, then 1; f(-1) = min
//   kWarmupDecayLR  as WarmupLR, then gamma = max(0, (T - i) / max(1, T - W)) for i >= W
//   kWarmupCosineLR f(i) = base_lr * ratio: warm-up from warmup_min_ratio to 1 over W steps ("log" or
//                   "linear"), then ratio = cos_min_ratio + (1 - cos_min_ratio) * (1 + cos(pi p)) / 2
//                   with p = min(1, (i - W + 1) / max(1, T - W)), floored at 0; f(-1) = 0
//   kOneCycle       a triangle from cycle_min_lr up to cycle_max_lr over cycle_first_step_size steps
//                   and back over cycle_second_step_size (optionally in stairs), then min_lr /
//                   (1 + decay_lr_rate * d / decay_step_size) after the cycle; with cycle_momentum the
//                   optimizer's betas become (mom, 0.99), mom cycling inversely between
//                   cycle_max_mom and cycle_min_mom (betas_at); f(-1) = cycle_min_lr, cycle_min_mom
// W = max(2, warmup_num_steps), T = total_num_steps (DeepSpeed raises W below 2 to 2).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

namespace zs::optim {

enum class ScheduleType { kConstant, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR, kOneCycle };
enum class WarmupType { kLog, kLinear };

// DeepSpeed's OneCycle params and defaults; cycle_min_lr and cycle_max_lr have none (required).
struct OneCycleConfig {
  double cycle_min_lr = 0.0;
  double cycle_max_lr = 0.0;
  double decay_lr_rate = 0.0;
  int64_t cycle_first_step_size = 2000;
  int64_t cycle_second_step_size = 0;    // 0: DeepSpeed's None, the same as cycle_first_step_size
  int64_t cycle_first_stair_count = 0;   // 0: no stairs (lr moves every step)
  int64_t cycle_second_stair_count = -1; // -1: DeepSpeed's None, the same as cycle_first_stair_count
  int64_t decay_step_size = 0;           // 0: no decay after the cycle (lr stays at cycle_min_lr)
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;
};

struct LrScheduleConfig {
  ScheduleType type = ScheduleType::kConstant;
  double base_lr = 1e-3;           // the optimizer's lr (WarmupCosineLR and kConstant scale it); the Engine sets it from the optimizer
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 1e-3;
  int64_t warmup_num_steps = 1000;
  int64_t total_num_steps = 0;     // WarmupDecayLR and WarmupCosineLR: required, > 0
  WarmupType warmup_type = WarmupType::kLog;
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 0.0001;
  OneCycleConfig one_cycle{};
};

// "WarmupLR" etc.; throws ConfigError naming `json_path` with the accepted names.
ScheduleType parse_schedule_type(const std::string& name, const std::string& json_path);
std::string schedule_type_name(ScheduleType type);

// Throws ConfigError naming `json_path` (e.g. "scheduler.params") for inconsistent values.
void validate(const LrScheduleConfig& config, const std::string& json_path);

class LrSchedule {
 public:
  explicit LrSchedule(const LrScheduleConfig& config) : config_(config) {}
  // The lr of optimizer step `step` (0-based).
  double lr_at(int64_t step) const;
  // The optimizer betas the schedule sets for optimizer step `step` (0-based), replacing the
  // configured ones: OneCycle with cycle_momentum; nullopt for every other schedule.
  std::optional<std::array<double, 2>> betas_at(int64_t step) const;
  // Whether betas_at ever returns a value.
  bool cycles_momentum() const { return config_.type == ScheduleType::kOneCycle && config_.one_cycle.cycle_momentum; }

 private:
  // DeepSpeed's get_lr() with last_batch_iteration = `iteration` (>= 0).
  double lr_after(int64_t iteration) const;
  double warmup_fraction(int64_t iteration) const;
  double one_cycle_scale(int64_t iteration) const;
  LrScheduleConfig config_;
};

}  // namespace zs::optim
