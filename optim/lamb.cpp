// Lamb's registry entry and its scalar kernels (optim/lamb.h). Compiled with -ffp-contract=off
// (optim/CMakeLists.txt): pass 2 recomputes the update of pass 1 and must get the same bits.
#include "optim/lamb.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/errors.h"
#include "optim/detail/low_precision.h"
#include "optim/detail/typed_entry.h"
#include "optim/detail/validate.h"

namespace zs::optim {
namespace {

constexpr StateSpec kLambStates[] = {{.name = "exp_avg"}, {.name = "exp_avg_sq"}};

// The registry entry (optim/registry.h): DeepSpeed's `Lamb` type and its params.
class LambType final : public detail::TypedOptimizerType<LambConfig> {
 public:
  std::string_view name() const override { return "Lamb"; }

 protected:
  void read(ObjectReader& p, LambConfig& c) const override {
    p.read("lr", c.lr, RealRange::non_negative());
    p.read("betas", c.betas, RealRange::half_open(0.0, 1.0));
    p.read("eps", c.eps, RealRange::positive());
    p.read("weight_decay", c.weight_decay, RealRange::non_negative());
    p.read("bias_correction", c.bias_correction);
    p.read("eps_inside_sqrt", c.eps_inside_sqrt);
    p.read("max_coeff", c.max_coeff, RealRange::positive());
    p.read("min_coeff", c.min_coeff, RealRange::positive());
    // DeepSpeed's FusedLamb clips by the global gradient norm its caller hands it: what the top-level
    // gradient_clipping does here. 0 (DeepSpeed's default) means off and is accepted.
    double max_grad_norm = 0.0;
    if (p.read("max_grad_norm", max_grad_norm, RealRange::non_negative()) && max_grad_norm > 0) {
      throw ConfigError(fmt::format("{}: zeroshard clips the global gradient norm with the top-level gradient_clipping; "
                                    "remove this key and set \"gradient_clipping\": {}",
                                    p.path_of("max_grad_norm"), max_grad_norm));
    }
    bool amsgrad = false;
    if (p.read("amsgrad", amsgrad) && amsgrad) {
      throw ConfigError(fmt::format("{}: Lamb does not support AMSGrad (DeepSpeed's FusedLamb refuses it too); remove the key",
                                    p.path_of("amsgrad")));
    }
  }
  void check(const LambConfig& c, const std::string& path) const override { optim::validate(c, path); }
  std::unique_ptr<Optimizer> create(const LambConfig& c) const override { return std::make_unique<Lamb>(c); }
};

// The per-step scalars, folded once per chunk so both passes compute u with the same bits.
struct LambConstants {
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float inv_bc1, inv_bc2;  // 1 / bias correction (1 without)
  float eps, decay, lr, grad_scale;
  bool eps_inside_sqrt;
};

LambConstants constants(const LambConfig& c, const StepContext& ctx, bool apply_weight_decay) {
  LambConstants k;
  const std::array<double, 2>& betas = ctx.betas_or(c.betas);  // a schedule's (OneCycle's momentum) or the config's
  k.beta1 = static_cast<float>(betas[0]);
  k.beta2 = static_cast<float>(betas[1]);
  k.one_minus_beta1 = 1.0f - k.beta1;
  k.one_minus_beta2 = 1.0f - k.beta2;
  // From the fp32 betas, as DeepSpeed's kernel (its scalars are floats): the moments are built with
  // 1 - beta in fp32, so step 1 then gives m / bc1 = g and v / bc2 = g^2 to the last bits.
  const double step = static_cast<double>(ctx.step);
  k.inv_bc1 = c.bias_correction ? static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(k.beta1), step))) : 1.0f;
  k.inv_bc2 = c.bias_correction ? static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(k.beta2), step))) : 1.0f;
  k.eps = static_cast<float>(c.eps);
  k.decay = apply_weight_decay ? static_cast<float>(c.weight_decay) : 0.0f;
  k.lr = static_cast<float>(ctx.lr);
  k.grad_scale = ctx.grad_scale;
  k.eps_inside_sqrt = c.eps_inside_sqrt;
  return k;
}

// u of one element from its (already advanced) m and v.
inline float lamb_update(float m, float v, float p, const LambConstants& k) {
  const float v_hat = v * k.inv_bc2;
  const float denom = k.eps_inside_sqrt ? std::sqrt(v_hat + k.eps) : std::sqrt(v_hat) + k.eps;
  return (m * k.inv_bc1) / denom + k.decay * p;
}

void check_chunk(const ParamChunk& chunk, bool needs_grad) {
  ZS_ASSERT(chunk.states.size() == 2 && (!needs_grad || chunk.grad.size() == chunk.master.size()),
            "Lamb chunk: {} params, {} grads, {} states", chunk.master.size(), chunk.grad.size(), chunk.states.size());
}

}  // namespace

const OptimizerType& lamb_type() {
  static const LambType kType;
  return kType;
}

void validate(const LambConfig& c, const std::string& path) {
  detail::validate_hyper(c.lr, c.betas, c.eps, c.weight_decay, path);
  if (!(c.min_coeff > 0)) detail::fail_param(path, "min_coeff", fmt::format("must be > 0, got {}", c.min_coeff));
  if (!(c.max_coeff >= c.min_coeff)) {
    detail::fail_param(path, "max_coeff", fmt::format("must be >= min_coeff ({}), got {}", c.min_coeff, c.max_coeff));
  }
}

float lamb_trust_ratio(double w_sq, double u_sq, const LambConfig& c) {
  const double w = std::sqrt(w_sq), u = std::sqrt(u_sq);
  if (w == 0 || u == 0) return 1.0f;  // DeepSpeed's rule: a zero tensor or a zero update moves by lr * u
  return static_cast<float>(std::clamp(w / u, c.min_coeff, c.max_coeff));
}

Lamb::Lamb(const LambConfig& config) : config_(config) {}

std::span<const StateSpec> Lamb::state_specs() const { return kLambStates; }

void Lamb::accumulate_tensor_sums(const ParamChunk& chunk, const StepContext& ctx, std::span<double> sums) const {
  check_chunk(chunk, /*needs_grad=*/true);
  ZS_ASSERT(sums.size() == 2, "Lamb keeps 2 sums per tensor, got {}", sums.size());
  const LambConstants k = constants(config_, ctx, chunk.apply_weight_decay);
  auto* m = static_cast<float*>(chunk.states[0]);
  auto* v = static_cast<float*>(chunk.states[1]);
  const float* p = chunk.master.data();
  const float* g = chunk.grad.data();
  double w_sq = 0, u_sq = 0;
  for (size_t i = 0; i < chunk.master.size(); ++i) {
    const float grad = g[i] * k.grad_scale;
    m[i] = k.beta1 * m[i] + k.one_minus_beta1 * grad;
    v[i] = k.beta2 * v[i] + k.one_minus_beta2 * grad * grad;
    const float u = lamb_update(m[i], v[i], p[i], k);
    w_sq += static_cast<double>(p[i]) * p[i];
    u_sq += static_cast<double>(u) * u;
  }
  sums[0] += w_sq;
  sums[1] += u_sq;
}

void Lamb::apply_tensor_sums(const ParamChunk& chunk, const StepContext& ctx, std::span<const double> totals) const {
  check_chunk(chunk, /*needs_grad=*/false);
  ZS_ASSERT(totals.size() == 2, "Lamb keeps 2 sums per tensor, got {}", totals.size());
  const LambConstants k = constants(config_, ctx, chunk.apply_weight_decay);
  const float step = k.lr * lamb_trust_ratio(totals[0], totals[1], config_);
  const auto* m = static_cast<const float*>(chunk.states[0]);
  const auto* v = static_cast<const float*>(chunk.states[1]);
  float* p = chunk.master.data();
  const size_t n = chunk.master.size();
  for (size_t i = 0; i < n; ++i) p[i] -= step * lamb_update(m[i], v[i], p[i], k);
  if (chunk.low_precision != nullptr) detail::store_low_precision_scalar(p, chunk.low_precision, chunk.low_precision_dtype, n);
}

void Lamb::step(const ParamChunk& chunk, const StepContext& ctx) const {
  double sums[2] = {0, 0};
  accumulate_tensor_sums(chunk, ctx, sums);
  apply_tensor_sums(chunk, ctx, sums);
}

}  // namespace zs::optim
