// Lion (DeepSpeed's `Lion` optimizer type: FusedLion / DeepSpeedCPULion; Chen et al. 2023, "Symbolic
// Discovery of Optimization Algorithms").
//
//   optim::Lion lion({.lr = 1e-4, .betas = {0.9, 0.99}, .weight_decay = 0.1});
//   std::vector<float> m(n);                      // exp_avg: zeroed
//   void* states[] = {m.data()};
//   lion.step({.master = p, .grad = g, .states = states}, {.step = 1, .lr = 1e-4});
//
// Update per element, in fp32, in DeepSpeed's order (csrc/includes/cpu_lion.h: decay, then the signed
// step; the momentum last, from its old value):
//   g     = grad * grad_scale
//   c     = beta1 * m + (1 - beta1) * g            (interpolation)
//   p     = p * (1 - lr * weight_decay) - lr * sign(c)   (decoupled decay; factor 1 when !apply_weight_decay)
//   m     = beta2 * m + (1 - beta2) * g            (momentum)
//   low   = bf16/fp16 copy of p when asked (round to nearest even, as Adam's kernels)
// sign(c) is +1 for c > 0, -1 for c < 0, c itself otherwise (sign(+-0) = +-0, a NaN stays NaN), as in
// CAdam (optim/cadam.h) and torch.sign; DeepSpeed's CPU kernel takes +0 as +1 (a bit trick on the sign
// bit), which moves an element whose interpolation is exactly 0 (no gradient and no momentum) by lr.
// 1 - lr * weight_decay is folded once per chunk in double and rounded to fp32. DeepSpeed's kernels
// use fused multiply-adds; ours do not (optim/CMakeLists.txt), so they round each product: the
// results differ from DeepSpeed's by at most an ulp of p per step, and agree bit for bit with
// step_reference() on every ISA.
//
// State: one fp32 momentum per element ("exp_avg", 4 bytes per parameter against Adam's 8). No bias
// correction: StepContext::step is unused. Learning-rate rule (the paper's): because sign() gives
// every element an update of size lr, use an lr 3-10x smaller than AdamW's for the same model and a
// weight_decay 3-10x larger (the decay per step, lr * weight_decay, then stays about the same).
// Defaults: lr 1e-4, betas (0.9, 0.99) (the paper's), weight_decay 0. DeepSpeed's Python classes
// default to lr 1e-3 and betas (0.9, 0.999); a config that names its values gets the same update.
//
// step() runs the fused one-pass kernel of the widest ISA the CPU has, or of the ISA given to the
// constructor; step_reference() is the plain scalar loop the kernels are tested against (bit for bit).
// Thread-safety: as Optimizer (disjoint chunks).
#pragma once

#include <array>
#include <string>

#include "memory/cpu_features.h"
#include "optim/optimizer.h"

namespace zs::optim {

struct LionConfig {
  double lr = 1e-4;
  std::array<double, 2> betas = {0.9, 0.99};  // {interpolation beta1, momentum beta2}
  double weight_decay = 0.0;
};

// Throws ConfigError naming `json_path` (e.g. "optimizer.params" -> "optimizer.params.betas[0]") for
// out-of-range values: lr >= 0, betas in [0, 1), weight_decay >= 0.
void validate(const LionConfig& config, const std::string& json_path);

class Lion final : public Optimizer {
 public:
  // Uses the widest kernel the CPU supports (memory::best_isa()).
  explicit Lion(const LionConfig& config);
  // Forces the kernel of `isa` (tests, benchmarks); throws ConfigError when this CPU cannot run it.
  Lion(const LionConfig& config, memory::IsaLevel isa);

  std::string_view name() const override { return "Lion"; }
  // {"exp_avg": fp32 per element, starts at 0}.
  std::span<const StateSpec> state_specs() const override;
  // The fused kernel: one pass, low-precision copy included.
  void step(const ParamChunk& chunk, const StepContext& ctx) const override;
  // The scalar reference loop (then a separate conversion pass): the test oracle.
  void step_reference(const ParamChunk& chunk, const StepContext& ctx) const;

  const LionConfig& config() const { return config_; }
  memory::IsaLevel isa() const { return isa_; }

 private:
  LionConfig config_;
  memory::IsaLevel isa_;
};

}  // namespace zs::optim
