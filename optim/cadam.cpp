#include "optim/cadam.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "core/errors.h"
#include "optim/detail/cadam_kernels.h"

namespace zs::optim {
namespace {

constexpr StateSpec kCAdamStates[] = {
    {.name = "exp_avg_q", .value_bytes = 1, .elements_per_value = 1},
    {.name = "exp_avg_scale", .value_bytes = 4, .elements_per_value = CAdam::kBlock},
};
static_assert(CAdam::kBlock == detail::kCAdamBlock);

detail::CAdamConstants cadam_constants(const CAdamConfig& c, const StepContext& ctx, bool apply_weight_decay) {
  // Must fold exactly as step_reference does: the kernels are tested against it bit for bit.
  detail::CAdamConstants k;
  const std::array<double, 2>& betas = ctx.betas_or(c.betas);
  k.beta1 = static_cast<float>(betas[0]);
  k.beta2 = static_cast<float>(betas[1]);
  k.one_minus_beta1 = 1.0f - k.beta1;
  k.one_minus_beta2 = 1.0f - k.beta2;
  k.lr = static_cast<float>(ctx.lr);
  k.weight_decay = apply_weight_decay ? static_cast<float>(c.weight_decay) : 0.0f;
  k.grad_scale = ctx.grad_scale;
  for (uint32_t lane = 0; lane < CAdam::kBlock; ++lane) k.lane_key[lane] = detail::cadam_lane_key(ctx.step, lane);
  return k;
}

void check_chunk(const ParamChunk& chunk) {
  ZS_ASSERT(chunk.grad.size() == chunk.master.size() && chunk.states.size() == 2 &&
                (chunk.master.empty() || (chunk.states[0] != nullptr && chunk.states[1] != nullptr)),
            "CAdam chunk: {} params, {} grads, {} states (want exp_avg_q and exp_avg_scale)", chunk.master.size(),
            chunk.grad.size(), chunk.states.size());
  ZS_ASSERT(chunk.low_precision == nullptr || chunk.low_precision_dtype == memory::DType::kBF16 ||
                chunk.low_precision_dtype == memory::DType::kF16,
            "CAdam: low-precision copy must be bf16 or fp16, got {}", memory::dtype_name(chunk.low_precision_dtype));
}

}  // namespace

void validate(const CAdamConfig& c, const std::string& path) {
  auto fail = [&](const std::string& key, const std::string& what) {
    throw ConfigError(fmt::format("{}.{}: {}", path, key, what));
  };
  if (!(c.lr >= 0 && std::isfinite(c.lr))) {
    fail("lr", fmt::format("must be a finite number >= 0, got {} (CAdam wants 3-10x less than AdamW's lr)", c.lr));
  }
  for (int i = 0; i < 2; ++i) {
    if (!(c.betas[i] >= 0 && c.betas[i] < 1)) {
      fail(fmt::format("betas[{}]", i),
           fmt::format("must be in [0, 1), got {} (CAdam's default: [0.965, 0.99])", c.betas[i]));
    }
  }
  if (!(c.weight_decay >= 0 && std::isfinite(c.weight_decay))) {
    fail("weight_decay", fmt::format("must be a finite number >= 0, got {}", c.weight_decay));
  }
}

CAdam::CAdam(const CAdamConfig& config) : config_(config), isa_(memory::best_isa()) {}

CAdam::CAdam(const CAdamConfig& config, memory::IsaLevel isa) : config_(config), isa_(isa) {
  if (!memory::isa_supported(isa)) {
    throw ConfigError(fmt::format("CAdam: the {} kernel cannot run on this CPU; choose one of the ISAs "
                                  "memory::supported_isas() lists (scalar always works)",
                                  memory::isa_name(isa)));
  }
}

std::span<const StateSpec> CAdam::state_specs() const { return kCAdamStates; }

void CAdam::step(const ParamChunk& chunk, const StepContext& ctx) const {
  check_chunk(chunk);
  if (chunk.master.empty()) return;
  detail::fused_cadam({.master = chunk.master.data(),
                       .grad = chunk.grad.data(),
                       .exp_avg_q = static_cast<int8_t*>(chunk.states[0]),
                       .exp_avg_scale = static_cast<float*>(chunk.states[1]),
                       .n = chunk.master.size(),
                       .low_precision = chunk.low_precision,
                       .low_precision_dtype = chunk.low_precision_dtype},
                      cadam_constants(config_, ctx, chunk.apply_weight_decay), isa_);
}

void CAdam::step_reference(const ParamChunk& chunk, const StepContext& ctx) const {
  check_chunk(chunk);
  const size_t n = chunk.master.size();
  const std::array<double, 2>& betas = ctx.betas_or(config_.betas);
  const float beta1 = static_cast<float>(betas[0]);
  const float beta2 = static_cast<float>(betas[1]);
  const float lr = static_cast<float>(ctx.lr);
  const float wd = chunk.apply_weight_decay ? static_cast<float>(config_.weight_decay) : 0.0f;
  float* p = chunk.master.data();
  const float* grad = chunk.grad.data();
  auto* q = static_cast<int8_t*>(chunk.states[0]);
  auto* scale = static_cast<float*>(chunk.states[1]);
  uint32_t lane_key[kBlock];
  for (uint32_t lane = 0; lane < kBlock; ++lane) lane_key[lane] = detail::cadam_lane_key(ctx.step, lane);
  for (size_t b = 0; b * kBlock < n; ++b) {
    const size_t begin = b * kBlock, end = std::min(n, begin + kBlock);
    float m_new[kBlock];
    float dither[kBlock];
    for (size_t i = begin; i < end; ++i) {
      const auto lane = static_cast<uint32_t>(i - begin);
      dither[lane] = detail::cadam_dither(std::bit_cast<uint32_t>(p[i]), lane_key[lane]);  // from the OLD weight
      const float m = static_cast<float>(q[i]) * scale[b];
      const float g = grad[i] * ctx.grad_scale;
      const float c = beta1 * m + (1.0f - beta1) * g;
      const float sign = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : c);
      p[i] = p[i] - lr * (sign + wd * p[i]);
      m_new[lane] = beta2 * m + (1.0f - beta2) * g;
    }
    float absmax = 0.0f;
    bool finite = true;
    for (size_t i = 0; i < end - begin; ++i) {
      const float a = std::fabs(m_new[i]);
      finite = finite && a <= std::numeric_limits<float>::max();
      absmax = std::max(absmax, a);
    }
    const float s = detail::cadam_block_scale(absmax, finite);
    scale[b] = s;
    const float inv = s > 0.0f ? detail::cadam_block_inverse(absmax) : 0.0f;
    for (size_t i = begin; i < end; ++i) {
      if (s > 0.0f) {
        // Stochastic rounding: up with probability x - floor(x) (Note [CAdam stochastic rounding]);
        // x = 127 and a dither near 1 make 128.
        const float x = std::clamp(m_new[i - begin] * inv, -127.0f, 127.0f);
        q[i] = static_cast<int8_t>(std::min(std::floor(x + dither[i - begin]), 127.0f));
      } else {
        q[i] = 0;  // a block of zeros (scale 0) or a non-finite block (scale NaN)
      }
    }
  }
  if (chunk.low_precision != nullptr) {
    memory::convert(p, memory::DType::kF32, chunk.low_precision, chunk.low_precision_dtype, n);
  }
}

}  // namespace zs::optim
