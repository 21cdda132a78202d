// Lamb (optim/lamb.h): the update against a plain scalar reference of DeepSpeed's FusedLamb formula
// (csrc/lamb/fused_lamb_cuda_kernel.cu, written out below in double) on fixed data over several
// steps; the two-pass protocol on a tensor cut into chunks against step() on the whole tensor; the
// trust ratio's clamps and its zero-norm rule; the low-precision copy; the registry entry (defaults,
// unknown keys, ranges, keys refused by name) and OneBitLamb's refusal.
#include "optim/lamb.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "memory/dtype.h"
#include "optim/registry.h"
#include "tests/optim/optimizer_parse.h"

namespace zs::optim {
namespace {

// DeepSpeed's FusedLamb on one tensor, in double: part 1 (moments, ||w||^2, ||u||^2), the trust
// ratio, part 3 (p -= lr * ratio * u).
struct Reference {
  std::vector<double> p, m, v;
  void step(const LambConfig& c, const std::vector<float>& grad, double lr, int64_t step, double grad_scale, bool decay) {
    // DeepSpeed's kernel takes its scalars as fp32: the betas (and bias corrections from them) too.
    const double b1 = static_cast<float>(c.betas[0]), b2 = static_cast<float>(c.betas[1]);
    const double bc1 = c.bias_correction ? 1 - std::pow(b1, double(step)) : 1;
    const double bc2 = c.bias_correction ? 1 - std::pow(b2, double(step)) : 1;
    const double wd = decay ? c.weight_decay : 0.0;
    std::vector<double> u(p.size());
    double w_sq = 0, u_sq = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = grad[i] * grad_scale;
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double denom = c.eps_inside_sqrt ? std::sqrt(v[i] / bc2 + c.eps) : std::sqrt(v[i] / bc2) + c.eps;
      u[i] = (m[i] / bc1) / denom + wd * p[i];
      w_sq += p[i] * p[i];
      u_sq += u[i] * u[i];
    }
    double ratio = 1.0;
    if (w_sq != 0 && u_sq != 0) ratio = std::min(std::max(std::sqrt(w_sq) / std::sqrt(u_sq), c.min_coeff), c.max_coeff);
    for (size_t i = 0; i < p.size(); ++i) p[i] -= lr * ratio * u[i];
  }
};

struct Tensor {
  std::vector<float> p, m, v;
  std::vector<uint16_t> low;
  void* states[2];  // the current chunk's state pointers (one chunk in use at a time)
  explicit Tensor(size_t n, uint32_t seed, float scale = 1.0f) : p(n), m(n), v(n), low(n) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist(0.0f, scale);
    for (float& x : p) x = dist(gen);
  }
  ParamChunk chunk(const std::vector<float>& g, bool decay = true, size_t begin = 0, size_t len = SIZE_MAX) {
    len = std::min(len, p.size() - begin);
    states[0] = m.data() + begin;
    states[1] = v.data() + begin;
    return {.master = std::span<float>(p).subspan(begin, len),
            .grad = std::span<const float>(g).subspan(begin, len),
            .states = std::span<void* const>(states, 2),
            .apply_weight_decay = decay};
  }
};

std::vector<float> gradient(size_t n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> g(n);
  for (float& x : g) x = dist(gen);
  return g;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], rtol * std::max(1.0, std::abs(want[i]))) << what << " element " << i;
  }
}

TEST(Lamb, MatchesDeepSpeedsFormulaOverSeveralSteps) {
  struct Case {
    LambConfig cfg;
    bool decay;
    float grad_scale;
  };
  const Case cases[] = {
      {{.lr = 1e-2, .weight_decay = 0.01}, true, 1.0f},
      {{.lr = 1e-2, .weight_decay = 0.1}, false, 0.5f},  // no decay for this tensor (a bias)
      {{.lr = 3e-3, .betas = {0.8, 0.95}, .eps = 1e-6, .weight_decay = 0.01, .bias_correction = false}, true, 1.0f},
      {{.lr = 3e-3, .eps = 1e-4, .eps_inside_sqrt = true}, true, 2.0f},
      // Clamp ranges that exclude the unclamped ratio (about 1 here: unit weights, Adam-sized updates).
      {{.lr = 1e-2, .max_coeff = 0.3, .min_coeff = 0.1}, true, 1.0f},
      {{.lr = 1e-2, .max_coeff = 100.0, .min_coeff = 50.0}, true, 1.0f},
  };
  for (size_t c = 0; c < std::size(cases); ++c) {
    const Case& k = cases[c];
    Lamb lamb(k.cfg);
    Tensor t(1000, 7);
    Reference ref{{t.p.begin(), t.p.end()}, std::vector<double>(1000), std::vector<double>(1000)};
    for (int64_t step = 1; step <= 5; ++step) {
      const std::vector<float> g = gradient(1000, 100 + uint32_t(step), 1e-2f);
      lamb.step(t.chunk(g, k.decay), {.step = step, .lr = k.cfg.lr, .grad_scale = k.grad_scale});
      ref.step(k.cfg, g, k.cfg.lr, step, k.grad_scale, k.decay);
      expect_close(t.p, ref.p, 2e-6, "case " + std::to_string(c) + " step " + std::to_string(step));
    }
  }
}

TEST(Lamb, ChunksOfOneTensorStepLikeTheWholeTensor) {
  // The engine's protocol: pass 1 on every chunk, sums added, pass 2 with the totals.
  const LambConfig cfg{.lr = 1e-2, .weight_decay = 0.01};
  Lamb lamb(cfg);
  Tensor whole(1001, 3), cut(1001, 3);
  for (int64_t step = 1; step <= 3; ++step) {
    const std::vector<float> g = gradient(1001, 50 + uint32_t(step), 1e-2f);
    const StepContext ctx{.step = step, .lr = cfg.lr};
    lamb.step(whole.chunk(g), ctx);
    const size_t cuts[] = {0, 96, 700, 1001};
    double sums[2] = {0, 0};
    for (size_t i = 0; i + 1 < std::size(cuts); ++i) lamb.accumulate_tensor_sums(cut.chunk(g, true, cuts[i], cuts[i + 1] - cuts[i]), ctx, sums);
    for (size_t i = 0; i + 1 < std::size(cuts); ++i) {
      ParamChunk c = cut.chunk(g, true, cuts[i], cuts[i + 1] - cuts[i]);
      c.grad = {};  // pass 2 does not read gradients
      lamb.apply_tensor_sums(c, ctx, sums);
    }
    // The sums are added in another order: the ratio may differ in its last bit.
    for (size_t i = 0; i < whole.p.size(); ++i) ASSERT_FLOAT_EQ(cut.p[i], whole.p[i]) << "step " << step << " element " << i;
    EXPECT_EQ(cut.m, whole.m);
    EXPECT_EQ(cut.v, whole.v);
  }
}

TEST(Lamb, TrustRatioClampsAndFallsBackToOneOnAZeroNorm) {
  const LambConfig cfg{};  // max_coeff 10, min_coeff 0.01: DeepSpeed's defaults
  EXPECT_FLOAT_EQ(lamb_trust_ratio(4.0, 1.0, cfg), 2.0f);
  EXPECT_FLOAT_EQ(lamb_trust_ratio(1e6, 1.0, cfg), 10.0f);
  EXPECT_FLOAT_EQ(lamb_trust_ratio(1.0, 1e6, cfg), 0.01f);
  EXPECT_FLOAT_EQ(lamb_trust_ratio(0.0, 1.0, cfg), 1.0f);  // a zero tensor (e.g. a bias at init)
  EXPECT_FLOAT_EQ(lamb_trust_ratio(1.0, 0.0, cfg), 1.0f);  // no update

  // A zero-initialised tensor moves by lr * u in its first step (ratio 1, not min_coeff).
  Lamb lamb({.lr = 0.1});
  Tensor t(4, 1);
  std::fill(t.p.begin(), t.p.end(), 0.0f);
  const std::vector<float> g = {1.0f, -2.0f, 0.5f, 0.0f};
  lamb.step(t.chunk(g), {.step = 1, .lr = 0.1});
  // Step 1 with bias correction: m_hat = g, v_hat = g^2, so u = sign(g) (up to eps); g = 0 gives u = 0.
  EXPECT_NEAR(t.p[0], -0.1f, 1e-6f);
  EXPECT_NEAR(t.p[1], 0.1f, 1e-6f);
  EXPECT_NEAR(t.p[2], -0.1f, 1e-6f);
  EXPECT_EQ(t.p[3], 0.0f);
}

TEST(Lamb, WritesTheLowPrecisionCopyOfTheUpdatedWeights) {
  Lamb lamb({.lr = 1e-2});
  for (memory::DType dtype : {memory::DType::kBF16, memory::DType::kF16}) {
    Tensor t(37, 9);
    const std::vector<float> g = gradient(37, 2, 1e-2f);
    ParamChunk c = t.chunk(g);
    c.low_precision = t.low.data();
    c.low_precision_dtype = dtype;
    lamb.step(c, {.step = 1, .lr = 1e-2});
    std::vector<uint16_t> want(37);
    memory::convert(t.p.data(), memory::DType::kF32, want.data(), dtype, 37);
    EXPECT_EQ(t.low, want) << memory::dtype_name(dtype);
  }
}

TEST(Lamb, StatesAndTwoPassTraits) {
  Lamb lamb({});
  ASSERT_EQ(lamb.state_specs().size(), 2u);
  EXPECT_EQ(lamb.state_specs()[0].name, "exp_avg");
  EXPECT_EQ(lamb.state_specs()[1].name, "exp_avg_sq");
  EXPECT_DOUBLE_EQ(lamb.state_bytes_per_param(), 8.0);
  EXPECT_EQ(lamb.tensor_sums(), 2u);
}

TEST(LambConfig, ParsesDeepSpeedsParams) {
  OptimizerChoice c = test::parse(R"({"type": "lamb", "params": {"lr": 11e-3, "weight_decay": 0.01,
      "bias_correction": false, "max_coeff": 0.3, "min_coeff": 0.01, "max_grad_norm": 0, "eps_inside_sqrt": true}})");
  EXPECT_EQ(c.name(), "Lamb");
  EXPECT_FALSE(c.compressed());
  const auto& p = c.params<LambConfig>();
  EXPECT_DOUBLE_EQ(p.lr, 11e-3);
  EXPECT_FALSE(p.bias_correction);
  EXPECT_TRUE(p.eps_inside_sqrt);
  EXPECT_DOUBLE_EQ(p.max_coeff, 0.3);
  EXPECT_DOUBLE_EQ(p.betas[1], 0.999);  // default
  EXPECT_DOUBLE_EQ(c.state_bytes_per_param(), 8.0);
  // Defaults: DeepSpeed's FusedLamb.
  const LambConfig d = test::parse(R"({"type": "Lamb"})").params<LambConfig>();
  EXPECT_DOUBLE_EQ(d.lr, 1e-3);
  EXPECT_DOUBLE_EQ(d.eps, 1e-8);
  EXPECT_DOUBLE_EQ(d.max_coeff, 10.0);
  EXPECT_DOUBLE_EQ(d.min_coeff, 0.01);
  EXPECT_TRUE(d.bias_correction);
}

TEST(LambConfig, BadParamsNameTheirPathAndTheFix) {
  auto error = [](const std::string& params) { return test::error_of(R"({"type": "Lamb", "params": )" + params + "}"); };
  EXPECT_NE(error(R"({"max_coef": 1})").find("did you mean 'max_coeff'"), std::string::npos) << error(R"({"max_coef": 1})");
  EXPECT_NE(error(R"({"betas": [0.9, 1.0]})").find("optimizer.params.betas"), std::string::npos);
  EXPECT_NE(error(R"({"min_coeff": 0})").find("optimizer.params.min_coeff"), std::string::npos);
  const std::string swapped = error(R"({"max_coeff": 0.01, "min_coeff": 0.1})");
  EXPECT_NE(swapped.find("optimizer.params.max_coeff: must be >= min_coeff"), std::string::npos) << swapped;
  EXPECT_NE(error(R"({"eps": 0})").find("optimizer.params.eps"), std::string::npos);
  const std::string clip = error(R"({"max_grad_norm": 1.0})");
  EXPECT_NE(clip.find("optimizer.params.max_grad_norm"), std::string::npos) << clip;
  EXPECT_NE(clip.find("\"gradient_clipping\": 1"), std::string::npos) << clip;
  EXPECT_NE(error(R"({"amsgrad": true})").find("optimizer.params.amsgrad"), std::string::npos);
  EXPECT_EQ(error(R"({"amsgrad": false})"), "(no error)");
}

TEST(LambConfig, OneBitLambIsRefusedWithWhatToUseInstead) {
  const std::string e = test::error_of(R"({"type": "OneBitLamb", "params": {"lr": 1e-3}})");
  EXPECT_NE(e.find("optimizer.type: optimizer 'OneBitLamb' is not implemented by zeroshard yet"), std::string::npos) << e;
  EXPECT_NE(e.find("use Lamb"), std::string::npos) << e;
  EXPECT_NE(e.find("OneBitAdam"), std::string::npos) << e;
}

}  // namespace
}  // namespace zs::optim
