// 0/1 Adam's schedule: Note [0/1 Adam schedule] in optim/zero_one_adam.h. Every rule is evaluated
// with the counters as zoadam.py holds them at that point of its step(), so the order below matters:
// the variance / sync decision uses the interval before this step's bookkeeping changes it.
#include "optim/zero_one_adam.h"

#include <algorithm>
#include <cmath>

#include "core/errors.h"

namespace zs::optim {

ZeroOneSchedule::ZeroOneSchedule(const ZeroOneAdamConfig& config) : config_(config) {
  validate(config_, "optimizer.params");
}

ZeroOneSchedule::Plan ZeroOneSchedule::plan(int64_t step, double lr) const {
  ZS_ASSERT(step == state_.step + 1, "ZeroOneSchedule::plan({}) after step {}: steps run one at a time", step,
            state_.step);
  Plan p;
  if (!frozen()) {
    p.kind = step % state_.var_interval == 0 ? Kind::kVarUpdate : Kind::kCompressedGradient;
    return p;
  }
  p.kind = Kind::kLocal;
  p.sync = step % state_.local_step_interval == 0;
  p.reset_errors = state_.step == config_.var_freeze_step + 1;
  p.lrs_at_sync = state_.lrs + lr;
  return p;
}

void ZeroOneSchedule::advance(int64_t step, double lr) {
  ZS_ASSERT(step == state_.step + 1, "ZeroOneSchedule::advance({}) after step {}: steps run one at a time", step,
            state_.step);
  State& s = state_;
  if (!frozen()) {
    if (step % s.var_interval == 0 && ++s.var_counter == config_.var_update_scaler) {
      s.var_counter = 0;
      // Doubling stops short of overflow; an interval past 2^62 steps never comes due anyway.
      if (s.var_interval <= (int64_t{1} << 61)) s.var_interval *= 2;
    }
  } else {
    s.lrs += lr;
    if (step % s.local_step_interval == 0) s.lrs = 0.0;
    if (++s.local_step_counter == config_.local_step_scaler) {
      s.local_step_counter = 0;
      s.local_step_interval = std::min(config_.local_step_clipper, s.local_step_interval * 2);
    }
  }
  s.step = step;
}

void ZeroOneSchedule::set_state(const State& s) {
  auto fail = [](const char* field, auto value, const std::string& why) {
    throw CheckpointError(fmt::format("0/1 Adam schedule state: {} = {} {}; resume with the optimizer.params the "
                                      "checkpoint was written with",
                                      field, value, why));
  };
  if (s.step < 0) fail("step", s.step, "is negative");
  if (s.var_interval < 1 || (s.var_interval & (s.var_interval - 1)) != 0) {
    fail("var_interval", s.var_interval, "is not a power of 2");
  }
  if (s.var_counter < 0 || s.var_counter >= config_.var_update_scaler) {
    fail("var_counter", s.var_counter, fmt::format("is outside [0, var_update_scaler = {})", config_.var_update_scaler));
  }
  if (s.local_step_interval < 1 || s.local_step_interval > std::max<int64_t>(1, config_.local_step_clipper)) {
    fail("local_step_interval", s.local_step_interval,
         fmt::format("is outside [1, local_step_clipper = {}]", config_.local_step_clipper));
  }
  if (s.local_step_counter < 0 || s.local_step_counter >= config_.local_step_scaler) {
    fail("local_step_counter", s.local_step_counter,
         fmt::format("is outside [0, local_step_scaler = {})", config_.local_step_scaler));
  }
  if (!(s.lrs >= 0.0 && std::isfinite(s.lrs))) fail("lrs", s.lrs, "is not a finite value >= 0");
  state_ = s;
}

std::string_view kind_name(ZeroOneSchedule::Kind kind) {
  switch (kind) {
    case ZeroOneSchedule::Kind::kVarUpdate:
      return "var_update";
    case ZeroOneSchedule::Kind::kCompressedGradient:
      return "compressed_gradient";
    case ZeroOneSchedule::Kind::kLocal:
      return "local";
  }
  return "unknown";
}

}  // namespace zs::optim
