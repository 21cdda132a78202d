#include "optim/adam.h"
#include "optim/clip.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/errors.h"

namespace zs::optim {
namespace {

// Textbook Adam in double, written independently of the kernel (no folded constants).
void reference_adam(std::vector<double>& p, const std::vector<double>& g, std::vector<double>& m, std::vector<double>& v,
                    const AdamConfig& c, int64_t step, double lr, double grad_scale, bool decay) {
  double wd = decay ? c.weight_decay : 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    double grad = g[i] * grad_scale;
    if (!c.adam_w_mode) grad += wd * p[i];
    m[i] = c.betas[0] * m[i] + (1 - c.betas[0]) * grad;
    v[i] = c.betas[1] * v[i] + (1 - c.betas[1]) * grad * grad;
    double mhat = c.bias_correction ? m[i] / (1 - std::pow(c.betas[0], step)) : m[i];
    double vhat = c.bias_correction ? v[i] / (1 - std::pow(c.betas[1], step)) : v[i];
    if (c.adam_w_mode) p[i] -= lr * wd * p[i];
    p[i] -= lr * mhat / (std::sqrt(vhat) + c.eps);
  }
}

struct Case {
  bool adam_w;
  bool bias_correction;
  bool decay;
};

class AdamVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(AdamVsReference, TracksDoublePrecisionReferenceOverSteps) {
  const Case tc = GetParam();
  AdamConfig cfg{.lr = 3e-3, .betas = {0.9, 0.95}, .eps = 1e-8, .weight_decay = 0.1, .adam_w_mode = tc.adam_w,
                 .bias_correction = tc.bias_correction};
  Adam adam(cfg);
  const size_t n = 1037;  // odd, so no kernel can assume a multiple of a vector width
  std::mt19937 gen(42);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f), g(n);
  for (auto& x : p) x = dist(gen);
  std::vector<double> pr(p.begin(), p.end()), mr(n, 0.0), vr(n, 0.0);
  void* states[] = {m.data(), v.data()};
  for (int64_t step = 1; step <= 5; ++step) {
    for (auto& x : g) x = dist(gen);
    std::vector<double> gd(g.begin(), g.end());
    adam.step({.master = p, .grad = g, .states = states, .apply_weight_decay = tc.decay},
              {.step = step, .lr = 3e-3, .grad_scale = 0.5f});
    reference_adam(pr, gd, mr, vr, cfg, step, 3e-3, 0.5, tc.decay);
  }
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(p[i], pr[i], 1e-5 * (1 + std::abs(pr[i]))) << "element " << i;
    ASSERT_NEAR(m[i], mr[i], 1e-5 * (1 + std::abs(mr[i]))) << "element " << i;
    ASSERT_NEAR(v[i], vr[i], 1e-5 * (1 + std::abs(vr[i]))) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, AdamVsReference,
                         ::testing::Values(Case{true, true, true}, Case{false, true, true}, Case{true, false, true},
                                           Case{true, true, false}, Case{false, false, false}));

TEST(Adam, WritesLowPrecisionCopyOfUpdatedWeights) {
  Adam adam(AdamConfig{});
  std::vector<float> p = {1.0f, -2.0f, 3.5f}, g = {0.1f, 0.2f, -0.3f}, m(3), v(3);
  std::vector<uint16_t> bf16(3);
  void* states[] = {m.data(), v.data()};
  adam.step({.master = p, .grad = g, .states = states, .low_precision = bf16.data(), .low_precision_dtype = memory::DType::kBF16},
            {.step = 1, .lr = 0.01});
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(bf16[i], memory::f32_to_bf16(p[i]));
}

TEST(Adam, NamesItsStates) {
  Adam adam(AdamConfig{});
  ASSERT_EQ(adam.state_specs().size(), 2u);
  EXPECT_EQ(adam.state_specs()[0].name, "exp_avg");
  EXPECT_EQ(adam.state_specs()[0].value_bytes, 4u);
  EXPECT_EQ(adam.state_specs()[0].elements_per_value, 1u);
  EXPECT_EQ(adam.alignment_elements(), 1u);
  EXPECT_EQ(adam.state_bytes(1000), 8000u);
  EXPECT_EQ(adam.state_bytes(0), 0u);
  EXPECT_DOUBLE_EQ(adam.state_bytes_per_param(), 8.0);
  EXPECT_EQ(adam.name(), "AdamW");
  EXPECT_EQ(Adam(AdamConfig{.adam_w_mode = false}).name(), "Adam");
}

TEST(StateSpec, BytesForRoundsBlocksUp) {
  constexpr StateSpec fp32{.name = "m"};
  constexpr StateSpec int8{.name = "q", .value_bytes = 1};
  constexpr StateSpec scale{.name = "s", .value_bytes = 4, .elements_per_value = 32};
  static_assert(fp32.bytes_for(10) == 40 && int8.bytes_for(10) == 10);
  EXPECT_EQ(scale.bytes_for(0), 0u);
  EXPECT_EQ(scale.bytes_for(1), 4u);
  EXPECT_EQ(scale.bytes_for(32), 4u);
  EXPECT_EQ(scale.bytes_for(33), 8u);
  EXPECT_EQ(scale.bytes_for(100003), 3126u * 4u);
}

TEST(Adam, ValidateNamesThePath) {
  try {
    validate(AdamConfig{.betas = {0.9, 1.5}}, "optimizer.params");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.params.betas[1]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(validate(AdamConfig{.eps = 0}, "optimizer.params"), ConfigError);
  EXPECT_THROW(validate(AdamConfig{.lr = -1}, "optimizer.params"), ConfigError);
  EXPECT_NO_THROW(validate(AdamConfig{}, "optimizer.params"));
}

TEST(Clip, SumOfSquaresAndOverflow) {
  std::vector<float> x = {3.0f, 4.0f, 0.0f, 1.0f, 1.0f};
  EXPECT_DOUBLE_EQ(sum_of_squares(x), 27.0);
  EXPECT_FALSE(has_inf_or_nan(x));
  x[2] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(has_inf_or_nan(x));
  EXPECT_FALSE(std::isfinite(sum_of_squares(x)));
  x[2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(has_inf_or_nan(x));
  EXPECT_FALSE(has_inf_or_nan(std::span<const float>{}));
}

TEST(Clip, CoefficientMatchesDeepSpeed) {
  EXPECT_DOUBLE_EQ(clip_coefficient(10.0, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_NEAR(clip_coefficient(4.0, 1.0), 1.0 / (4.0 + 1e-6), 1e-15);
}

}  // namespace
}  // namespace zs::optim
