#include "optim/lion.h"

#include "core/errors.h"
#include "optim/detail/typed_entry.h"
#include "optim/detail/validate.h"
#include "optim/fused_lion.h"

namespace zs::optim {
namespace {

constexpr StateSpec kLionStates[] = {{.name = "exp_avg"}};

// The registry entry (optim/registry.h): DeepSpeed's `Lion` type and its params.
class LionType final : public detail::TypedOptimizerType<LionConfig> {
 public:
  std::string_view name() const override { return "Lion"; }
  bool sign_update() const override { return true; }

 protected:
  void read(ObjectReader& p, LionConfig& c) const override {
    p.read("lr", c.lr, RealRange::non_negative());
    p.read("betas", c.betas, RealRange::half_open(0.0, 1.0));
    p.read("weight_decay", c.weight_decay, RealRange::non_negative());
    p.unsupported("eps", "Lion takes the sign of the interpolated momentum and has no eps");
  }
  void check(const LionConfig& c, const std::string& path) const override { optim::validate(c, path); }
  std::unique_ptr<Optimizer> create(const LionConfig& c) const override { return std::make_unique<Lion>(c); }
};

}  // namespace

const OptimizerType& lion_type() {
  static const LionType kType;
  return kType;
}

void validate(const LionConfig& c, const std::string& path) {
  detail::validate_hyper(c.lr, c.betas, std::nullopt, c.weight_decay, path);
}

Lion::Lion(const LionConfig& config) : config_(config), isa_(memory::best_isa()) {}

Lion::Lion(const LionConfig& config, memory::IsaLevel isa) : config_(config), isa_(isa) {
  if (!memory::isa_supported(isa)) {
    throw ConfigError(fmt::format("Lion: the {} kernel cannot run on this CPU; choose one of the ISAs "
                                  "memory::supported_isas() lists (scalar always works)",
                                  memory::isa_name(isa)));
  }
}

std::span<const StateSpec> Lion::state_specs() const { return kLionStates; }

LionConstants lion_constants(const LionConfig& c, const StepContext& ctx, bool apply_weight_decay) {
  // Must fold exactly as step_reference does: the kernels are tested against it bit for bit.
  LionConstants k;
  const std::array<double, 2>& betas = ctx.betas_or(c.betas);
  k.beta1 = static_cast<float>(betas[0]);
  k.beta2 = static_cast<float>(betas[1]);
  k.one_minus_beta1 = 1.0f - k.beta1;
  k.one_minus_beta2 = 1.0f - k.beta2;
  k.lr = static_cast<float>(ctx.lr);
  k.decay = apply_weight_decay ? static_cast<float>(1.0 - ctx.lr * c.weight_decay) : 1.0f;
  k.grad_scale = ctx.grad_scale;
  return k;
}

void Lion::step(const ParamChunk& chunk, const StepContext& ctx) const {
  const size_t n = chunk.master.size();
  ZS_ASSERT(chunk.grad.size() == n && chunk.states.size() == 1, "Lion chunk: {} params, {} grads, {} states", n,
            chunk.grad.size(), chunk.states.size());
  fused_lion({.master = chunk.master.data(),
              .grad = chunk.grad.data(),
              .exp_avg = static_cast<float*>(chunk.states[0]),
              .n = n,
              .low_precision = chunk.low_precision,
              .low_precision_dtype = chunk.low_precision_dtype},
             lion_constants(config_, ctx, chunk.apply_weight_decay), isa_);
}

void Lion::step_reference(const ParamChunk& chunk, const StepContext& ctx) const {
  const size_t n = chunk.master.size();
  ZS_ASSERT(chunk.grad.size() == n && chunk.states.size() == 1, "Lion chunk: {} params, {} grads, {} states", n,
            chunk.grad.size(), chunk.states.size());
  const std::array<double, 2>& betas = ctx.betas_or(config_.betas);
  const float beta1 = static_cast<float>(betas[0]);
  const float beta2 = static_cast<float>(betas[1]);
  const float lr = static_cast<float>(ctx.lr);
  const float decay = chunk.apply_weight_decay ? static_cast<float>(1.0 - ctx.lr * config_.weight_decay) : 1.0f;
  float* m = static_cast<float*>(chunk.states[0]);
  float* p = chunk.master.data();
  const float* g = chunk.grad.data();
  for (size_t i = 0; i < n; ++i) {
    const float grad = g[i] * ctx.grad_scale;
    const float c = beta1 * m[i] + (1.0f - beta1) * grad;
    const float sign = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : c);
    p[i] = p[i] * decay - lr * sign;
    m[i] = beta2 * m[i] + (1.0f - beta2) * grad;
  }
  if (chunk.low_precision != nullptr) {
    memory::convert(p, memory::DType::kF32, chunk.low_precision, chunk.low_precision_dtype, n);
  }
}

}  // namespace zs::optim
