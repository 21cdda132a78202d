// 0/1 Adam's schedule (arXiv 2202.06009; DeepSpeed's deepspeed/runtime/fp16/onebit/zoadam.py): which
// kernels of optim/onebit_adam.h step t runs and when the engine communicates. The engine owns the
// buffers (p, m, v, u, and comm::OneBitAllreduce's error buffers) and drives one step as:
//
//   ZeroOneSchedule sched(cfg);                  // sched.set_state(saved) when resuming
//   const auto plan = sched.plan(t, lr);         // before the backward of step t
//   CompressedChunk c{.master = p, .exp_avg = m, .exp_avg_sq = v, .accumulator = u, .grad = g, .n = n};
//   switch (plan.kind) {
//     case Kind::kVarUpdate:            // the backward averages gradients exactly (fp32 allreduce)
//       adam_update(c, k);  break;
//     case Kind::kCompressedGradient:   // the backward does not reduce; g is the local gradient
//       reduce(g);  momentum_update(c, k);  frozen_update(c, k);  break;  // reduce: 1-bit, in place
//     case Kind::kLocal:                // no gradient communication at all
//       if (plan.reset_errors) reducer.reset_errors();
//       if (!plan.sync) { local_step(c, k); break; }
//       local_step_sync_prepare(c, k);  reduce(u);
//       sync_finish(c, compressed_constants(cfg, {.lr = lr, .lrs = plan.lrs_at_sync}));  break;
//   }
//   sched.advance(t, lr);                        // only for steps that ran (not for an fp16 overflow)
//
// Note [0/1 Adam schedule]: a literal port of zoadam.py's bookkeeping, with DeepSpeed's state['step']
// equal to our t (its buffer-initialisation call is not replicated: Note [Differences from DeepSpeed]
// in optim/onebit_adam.h). All counters start as var_interval = 1, var_counter = 0,
// local_step_interval = 1, local_step_counter = 0, lrs = 0.
// - Until the variance freezes, step t is a variance step iff t % var_interval == 0. DeepSpeed decides
//   at the end of step t-1 (enable_backward_allreduce = t % var_interval == 0) whether the backward of
//   step t averages gradients; var_interval does not change in between, so plan(t) gives the same
//   answer. After each variance step var_counter += 1; when it reaches var_update_scaler it returns to
//   0 and var_interval doubles.
// - The freeze flips at the end of step t when t > var_freeze_step, so steps 1 .. var_freeze_step + 1
//   are unfrozen and every later step is kLocal (the first one with reset_errors: DeepSpeed zeroes
//   the error buffers there, because they held gradient residuals and will now hold u's).
// - A kLocal step adds its lr to lrs; it synchronises iff t % local_step_interval == 0, after which
//   lrs = 0. After each kLocal step local_step_counter += 1; when it reaches local_step_scaler it
//   returns to 0 and local_step_interval = min(local_step_clipper, 2 local_step_interval).
// - As in DeepSpeed, the momentum rebuilt at a sync, m = -u / lrs, is the lr-weighted mean over the
//   local steps of (m + weight_decay p d), d = sqrt(v) + eps: with weight decay it absorbs the decay
//   term. DeepSpeed's load_state_dict resets these counters and u; here state()/set_state() keep them,
//   so a resumed run continues the same schedule (the engine decides whether to reset error buffers).
//
// Thread-safety: plan() is const; advance() and set_state() must not race with anything else.
#pragma once

#include <cstdint>
#include <string_view>

#include "optim/onebit_adam.h"

namespace zs::optim {

class ZeroOneSchedule {
 public:
  // Validates `config` (ConfigError naming "optimizer.params.<key>").
  explicit ZeroOneSchedule(const ZeroOneAdamConfig& config);

  enum class Kind {
    kVarUpdate,           // gradients averaged exactly; adam_update
    kCompressedGradient,  // local gradient compressed-averaged; momentum_update then frozen_update
    kLocal,               // variance frozen: local_step; synchronise when Plan::sync
  };

  struct Plan {
    Kind kind = Kind::kVarUpdate;
    bool sync = false;          // kLocal only: local_step_sync_prepare, compress u, sync_finish
    bool reset_errors = false;  // true once, at the first kLocal step: zero the compression error buffers
    double lrs_at_sync = 0.0;   // kLocal: the sum of lr over the local steps since the last sync, this
                                // step's included (pass as CompressedStep::lrs to sync_finish); else 0
  };

  // What step `step` (1-based) does when it runs with learning rate `lr`: a pure function of the state
  // after steps 1 .. step-1. Precondition (ZS_ASSERT): step == state().step + 1.
  Plan plan(int64_t step, double lr) const;

  // Bookkeeping after step `step` ran with learning rate `lr` (the same values plan() was given).
  // Precondition (ZS_ASSERT): step == state().step + 1.
  void advance(int64_t step, double lr);

  // Everything the schedule needs to resume (a few scalars for the checkpoint).
  struct State {
    int64_t step = 0;                 // last step advanced (0: none yet)
    int64_t var_interval = 1;         // steps between variance updates (a power of 2)
    int64_t var_counter = 0;          // variance updates since var_interval last doubled
    int64_t local_step_interval = 1;  // steps between synchronisations in the frozen phase
    int64_t local_step_counter = 0;   // frozen steps since local_step_interval last doubled
    double lrs = 0.0;                 // sum of lr over the frozen steps since the last sync
  };
  const State& state() const { return state_; }
  // Throws CheckpointError naming the field when `state` cannot come from this config (e.g. a
  // var_counter >= var_update_scaler: the checkpoint was written with other optimizer.params).
  void set_state(const State& state);

  // Whether steps after the last advanced one are kLocal.
  bool frozen() const { return state_.step > config_.var_freeze_step; }
  const ZeroOneAdamConfig& config() const { return config_; }

 private:
  ZeroOneAdamConfig config_;
  State state_;
};

// "var_update", "compressed_gradient", "local".
std::string_view kind_name(ZeroOneSchedule::Kind kind);

}  // namespace zs::optim
