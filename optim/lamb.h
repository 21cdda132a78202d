// Lamb (DeepSpeed's `Lamb` optimizer type: FusedLamb; You et al. 2019, "Large Batch Optimization for
// Deep Learning: Training BERT in 76 minutes", Algorithm 2).
//
//   optim::Lamb lamb({.lr = 1e-3, .weight_decay = 0.01});
//   std::vector<float> m(n), v(n);                 // exp_avg, exp_avg_sq: zeroed
//   void* states[] = {m.data(), v.data()};
//   lamb.step({.master = w, .grad = g, .states = states}, {.step = 1, .lr = 1e-3});  // w: ONE whole tensor
//
// Update of one parameter tensor, per element in fp32, in DeepSpeed's order
// (csrc/lamb/fused_lamb_cuda_kernel.cu, part 1 then part 3):
//   g     = grad * grad_scale
//   m     = beta1 m + (1 - beta1) g
//   v     = beta2 v + (1 - beta2) g g
//   denom = sqrt(v / bc2) + eps            (eps_inside_sqrt: sqrt(v / bc2 + eps))
//   u     = (m / bc1) / denom + decay * p  (decay = weight_decay, 0 when !apply_weight_decay)
// then, over the whole tensor, the trust ratio
//   r     = clamp(||p|| / ||u||, min_coeff, max_coeff), or 1 when either norm is 0
//   p    -= lr * r * u
// with bc1 = 1 - beta1^step, bc2 = 1 - beta2^step (1 when bias_correction is off). DeepSpeed's
// current kernel bias-corrects m and v themselves as above; its releases before 2024 folded the
// correction into the step size (lr * sqrt(bc2) / bc1), which the trust ratio then cancels only in
// part (Algorithm 2 is what we follow). Scalars are fp32 as in DeepSpeed (bc from the fp32 betas);
// the norms are summed in double (DeepSpeed: fp32 per thread).
//
// Note [per-tensor optimizers]
// r needs the norms of the whole parameter tensor, but the engine steps flat shards, pieces and
// sub-groups: a ZeRO shard can cut a parameter across ranks. So Lamb runs in two passes
// (Optimizer::tensor_sums() > 0, optim/optimizer.h): accumulate_tensor_sums() advances m and v of a
// chunk and adds its ||p||^2 and ||u||^2 to the sums of the tensor it belongs to; the caller adds the
// sums of all chunks of each tensor (the engine: over its pieces, then one allreduce over the
// partition group); apply_tensor_sums() recomputes u from the new m and v and applies it with the
// tensor's r. step() is both passes over one chunk taken as a whole tensor (tests, single tensors).
//
// States: "exp_avg" and "exp_avg_sq", fp32 per element (8 bytes per parameter, as Adam).
// Scalar kernels only (no AVX-512/AVX2 versions yet).
// Thread-safety: as Optimizer (disjoint chunks).
#pragma once

#include <array>
#include <string>

#include "optim/optimizer.h"

namespace zs::optim {

struct LambConfig {
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool bias_correction = true;
  bool eps_inside_sqrt = false;
  double max_coeff = 10.0;  // the trust ratio's upper clamp
  double min_coeff = 0.01;  // and lower clamp
};

// Throws ConfigError naming `json_path` (e.g. "optimizer.params" -> "optimizer.params.max_coeff") for
// out-of-range values: lr >= 0, betas in [0, 1), eps > 0, weight_decay >= 0, 0 < min_coeff <= max_coeff.
void validate(const LambConfig& config, const std::string& json_path);

// The trust ratio from a tensor's sums of squares (DeepSpeed's rule): clamp(sqrt(w_sq) / sqrt(u_sq),
// min_coeff, max_coeff), or 1 when either norm is 0.
float lamb_trust_ratio(double w_sq, double u_sq, const LambConfig& config);

class Lamb final : public Optimizer {
 public:
  explicit Lamb(const LambConfig& config);

  std::string_view name() const override { return "Lamb"; }
  // {"exp_avg", "exp_avg_sq"}: fp32 per element, start at 0.
  std::span<const StateSpec> state_specs() const override;
  // Both passes over `chunk` taken as one whole parameter tensor.
  void step(const ParamChunk& chunk, const StepContext& ctx) const override;
  // 2: {sum of p^2, sum of u^2} (p before the update).
  size_t tensor_sums() const override { return 2; }
  void accumulate_tensor_sums(const ParamChunk& chunk, const StepContext& ctx, std::span<double> sums) const override;
  void apply_tensor_sums(const ParamChunk& chunk, const StepContext& ctx, std::span<const double> totals) const override;

  const LambConfig& config() const { return config_; }

 private:
  LambConfig config_;
};

}  // namespace zs::optim
