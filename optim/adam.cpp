#include "optim/adam.h"

#include <cmath>

#include "core/errors.h"
#include "optim/detail/validate.h"
#include "optim/fused_adam.h"

namespace zs::optim {
namespace {

constexpr StateSpec kAdamStates[] = {{.name = "exp_avg"}, {.name = "exp_avg_sq"}};

}  // namespace

void validate(const AdamConfig& c, const std::string& path) {
  detail::validate_hyper(c.lr, c.betas, c.eps, c.weight_decay, path);
}

Adam::Adam(const AdamConfig& config) : config_(config), isa_(memory::best_isa()) {}

Adam::Adam(const AdamConfig& config, memory::IsaLevel isa) : config_(config), isa_(isa) {
  if (!memory::isa_supported(isa)) {
    throw ConfigError(fmt::format("Adam: the {} kernel cannot run on this CPU; choose one of the ISAs "
                                  "memory::supported_isas() lists (scalar always works)",
                                  memory::isa_name(isa)));
  }
}

std::span<const StateSpec> Adam::state_specs() const { return kAdamStates; }

AdamConstants adam_constants(const AdamConfig& c, const StepContext& ctx, bool apply_weight_decay) {
  // Must fold exactly as step_reference does: the kernels are tested against it bit for bit.
  AdamConstants k;
  const std::array<double, 2>& betas = ctx.betas_or(c.betas);
  k.beta1 = static_cast<float>(betas[0]);
  k.beta2 = static_cast<float>(betas[1]);
  k.one_minus_beta1 = 1.0f - k.beta1;
  k.one_minus_beta2 = 1.0f - k.beta2;
  const double bc1 = c.bias_correction ? 1.0 - std::pow(betas[0], static_cast<double>(ctx.step)) : 1.0;
  const double bc2 = c.bias_correction ? 1.0 - std::pow(betas[1], static_cast<double>(ctx.step)) : 1.0;
  k.step_size = static_cast<float>(ctx.lr / bc1);
  k.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  k.eps = static_cast<float>(c.eps);
  const float wd = apply_weight_decay ? static_cast<float>(c.weight_decay) : 0.0f;
  k.decoupled_decay = c.adam_w_mode ? static_cast<float>(ctx.lr) * wd : 0.0f;
  k.l2 = c.adam_w_mode ? 0.0f : wd;
  k.grad_scale = ctx.grad_scale;
  return k;
}

void Adam::step(const ParamChunk& chunk, const StepContext& ctx) const {
  const size_t n = chunk.master.size();
  ZS_ASSERT(chunk.grad.size() == n && chunk.states.size() == 2, "Adam chunk: {} params, {} grads, {} states", n,
            chunk.grad.size(), chunk.states.size());
  fused_adam({.master = chunk.master.data(),
              .grad = chunk.grad.data(),
              .exp_avg = static_cast<float*>(chunk.states[0]),
              .exp_avg_sq = static_cast<float*>(chunk.states[1]),
              .n = n,
              .low_precision = chunk.low_precision,
              .low_precision_dtype = chunk.low_precision_dtype},
             adam_constants(config_, ctx, chunk.apply_weight_decay), isa_);
}

void Adam::step_reference(const ParamChunk& chunk, const StepContext& ctx) const {
  const size_t n = chunk.master.size();
  ZS_ASSERT(chunk.grad.size() == n && chunk.states.size() == 2, "Adam chunk: {} params, {} grads, {} states", n,
            chunk.grad.size(), chunk.states.size());
  const std::array<double, 2>& betas = ctx.betas_or(config_.betas);
  const float beta1 = static_cast<float>(betas[0]);
  const float beta2 = static_cast<float>(betas[1]);
  const double bc1 = config_.bias_correction ? 1.0 - std::pow(betas[0], static_cast<double>(ctx.step)) : 1.0;
  const double bc2 = config_.bias_correction ? 1.0 - std::pow(betas[1], static_cast<double>(ctx.step)) : 1.0;
  // Folding the corrections into two scalars keeps the per-element work to one sqrt and one divide.
  const float step_size = static_cast<float>(ctx.lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float eps = static_cast<float>(config_.eps);
  const float wd = chunk.apply_weight_decay ? static_cast<float>(config_.weight_decay) : 0.0f;
  const float decoupled_decay = config_.adam_w_mode ? static_cast<float>(ctx.lr) * wd : 0.0f;
  const float l2 = config_.adam_w_mode ? 0.0f : wd;
  float* m = static_cast<float*>(chunk.states[0]);
  float* v = static_cast<float*>(chunk.states[1]);
  float* p = chunk.master.data();
  const float* g = chunk.grad.data();
  for (size_t i = 0; i < n; ++i) {
    float grad = g[i] * ctx.grad_scale + l2 * p[i];
    m[i] = beta1 * m[i] + (1.0f - beta1) * grad;
    v[i] = beta2 * v[i] + (1.0f - beta2) * grad * grad;
    float denom = std::sqrt(v[i]) * inv_sqrt_bc2 + eps;
    p[i] = p[i] - decoupled_decay * p[i] - step_size * m[i] / denom;
  }
  if (chunk.low_precision != nullptr) {
    memory::convert(p, memory::DType::kF32, chunk.low_precision, chunk.low_precision_dtype, n);
  }
}

}  // namespace zs::optim
