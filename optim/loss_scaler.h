// Loss scaling for fp16 training, with DeepSpeed's `fp16` semantics.
//
// Static (loss_scale > 0): the scale never changes and an overflowing step is still skipped, as in DeepSpeed.
// Dynamic (loss_scale == 0): start at 2^initial_scale_power; on an overflowing step the step is
// skipped and, once `hysteresis` overflows have been absorbed, the scale halves (never below
// min_loss_scale); after loss_scale_window consecutive good steps it doubles. With
// consecutive_hysteresis the hysteresis budget refills on every good step.
#pragma once

#include <cstdint>

namespace zs::optim {

struct LossScalerConfig {
  double loss_scale = 0.0;           // 0: dynamic
  int initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
};

class LossScaler {
 public:
  LossScaler() : LossScaler(LossScalerConfig{.loss_scale = 1.0}) {}  // no scaling (bf16, fp32)
  explicit LossScaler(const LossScalerConfig& config);

  double scale() const { return scale_; }
  bool dynamic() const { return dynamic_; }
  // Records one step's outcome (overflow agreed by all ranks); returns true when the step must be skipped.
  bool update(bool overflow);
  int64_t overflows() const { return overflows_; }

  // Everything the scaler needs to resume (checkpoints save and restore it as scalars).
  struct State {
    double scale = 1.0;
    int64_t hysteresis_left = 0;
    int64_t good_steps = 0;
    int64_t overflows = 0;
  };
  State state() const { return {scale_, hysteresis_left_, good_steps_, overflows_}; }
  void set_state(const State& s) {
    scale_ = s.scale;
    hysteresis_left_ = static_cast<int>(s.hysteresis_left);
    good_steps_ = s.good_steps;
    overflows_ = s.overflows;
  }

 private:
  LossScalerConfig config_;
  bool dynamic_;
  double scale_;
  int hysteresis_left_;
  int64_t good_steps_ = 0;  // consecutive steps since the last overflow
  int64_t overflows_ = 0;
};

}  // namespace zs::optim
