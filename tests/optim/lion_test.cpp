// Lion (optim/lion.h): the fused kernels against the scalar reference Lion::step_reference on every
// ISA this machine runs (odd lengths, misaligned starts, weight decay on/off, gradient scale, with and
// without the bf16/fp16 copy, sign(0) and non-finite values), bit for bit; step_parallel against
// step; the update against a hand-computed one; the registry entry (parse, defaults, errors with
// their JSON path); and that it minimises a quadratic.
#include "optim/lion.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/json.h"
#include "memory/cpu_features.h"
#include "memory/dtype.h"
#include "optim/fused_lion.h"
#include "optim/registry.h"
#include "tests/optim/optimizer_parse.h"

namespace zs::optim {
namespace {

using memory::DType;
using memory::IsaLevel;

struct Buffers {
  std::vector<float> p, g, m;
  std::vector<uint16_t> low;
  explicit Buffers(size_t n, uint32_t seed) : p(n), g(n), m(n), low(n, 0xDEAD) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (size_t i = 0; i < n; ++i) {
      p[i] = dist(gen);
      g[i] = dist(gen) * 1e-2f;
      m[i] = dist(gen) * 1e-3f;
    }
    // Special values: no gradient and no momentum (c = +0: sign 0, p only decays), c = -0, a negative
    // zero weight, a tiny weight that rounds to an fp16 subnormal.
    if (n > 4) {
      g[1] = 0.0f, m[1] = 0.0f;
      g[2] = -0.0f, m[2] = -0.0f;
      p[3] = -0.0f;
      p[4] = 3e-6f;
    }
  }
  ParamChunk chunk(void* const* states, std::optional<DType> low_dtype, bool decay = true) {
    ParamChunk c{.master = p, .grad = g, .states = std::span<void* const>(states, 1), .apply_weight_decay = decay};
    if (low_dtype) {
      c.low_precision = low.data();
      c.low_precision_dtype = *low_dtype;
    }
    return c;
  }
};

void expect_bits_equal(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(a[i]), std::bit_cast<uint32_t>(b[i]))
        << what << " element " << i << " of " << a.size() << ": " << a[i] << " vs " << b[i];
  }
}

struct Mode {
  double weight_decay;
  bool apply_weight_decay;
  float grad_scale;
};

void run_case(IsaLevel isa, size_t n, const Mode& mode, std::optional<DType> low_dtype, int threads) {
  const LionConfig cfg{.lr = 3e-4, .betas = {0.9, 0.99}, .weight_decay = mode.weight_decay};
  const Lion fused(cfg, isa);
  const Lion reference(cfg, IsaLevel::kScalar);
  Buffers a(n, static_cast<uint32_t>(n * 31 + 7)), b = a;
  void* sa[] = {a.m.data()};
  void* sb[] = {b.m.data()};
  for (int64_t step = 1; step <= 3; ++step) {
    const StepContext ctx{.step = step, .lr = 3e-4 / static_cast<double>(step), .grad_scale = mode.grad_scale};
    if (threads > 1) {
      fused.step_parallel(a.chunk(sa, low_dtype, mode.apply_weight_decay), ctx, threads);
    } else {
      fused.step(a.chunk(sa, low_dtype, mode.apply_weight_decay), ctx);
    }
    reference.step_reference(b.chunk(sb, low_dtype, mode.apply_weight_decay), ctx);
  }
  const std::string what = std::string(memory::isa_name(isa)) + " n=" + std::to_string(n);
  expect_bits_equal(a.p, b.p, what + " master");
  expect_bits_equal(a.m, b.m, what + " exp_avg");
  if (low_dtype) {
    for (size_t i = 0; i < n; ++i) {
      const uint16_t want = *low_dtype == DType::kBF16 ? memory::f32_to_bf16(b.p[i]) : memory::f32_to_f16(b.p[i]);
      ASSERT_EQ(a.low[i], want) << what << " low-precision element " << i;
    }
  } else {
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(a.low[i], 0xDEAD) << what << ": no copy asked, element " << i << " written";
  }
}

constexpr size_t kLengths[] = {1, 5, 7, 8, 15, 16, 17, 31, 33, 1037, 100003};
constexpr Mode kModes[] = {{0.0, true, 1.0f}, {0.3, true, 1.0f}, {0.3, false, 0.37f}, {1.0, true, 0.25f}};

class LionVsReference : public ::testing::TestWithParam<IsaLevel> {};

TEST_P(LionVsReference, EveryModeAndLengthBitForBit) {
  const IsaLevel isa = GetParam();
  if (!memory::isa_supported(isa)) GTEST_SKIP() << memory::isa_name(isa) << " not supported on this CPU";
  for (const Mode& mode : kModes) {
    for (size_t n : kLengths) {
      SCOPED_TRACE("weight_decay=" + std::to_string(mode.weight_decay) + " apply=" + std::to_string(mode.apply_weight_decay) +
                   " grad_scale=" + std::to_string(mode.grad_scale));
      run_case(isa, n, mode, std::nullopt, 1);
      run_case(isa, n, mode, DType::kBF16, 1);
      run_case(isa, n, mode, DType::kF16, 1);
    }
  }
}

TEST_P(LionVsReference, MisalignedStartsBitForBit) {
  const IsaLevel isa = GetParam();
  if (!memory::isa_supported(isa)) GTEST_SKIP() << memory::isa_name(isa) << " not supported on this CPU";
  const LionConfig cfg{.weight_decay = 0.5};
  const Lion fused(cfg, isa);
  const Lion reference(cfg, IsaLevel::kScalar);
  for (size_t off = 1; off < 16; ++off) {
    Buffers a(300, 11), b = a;
    const size_t n = 300 - off - (off % 3);
    void* sa[] = {a.m.data() + off};
    void* sb[] = {b.m.data() + off};
    ParamChunk ca{.master = std::span(a.p).subspan(off, n), .grad = std::span<const float>(a.g).subspan(off, n),
                  .states = sa, .low_precision = a.low.data() + off};
    ParamChunk cb{.master = std::span(b.p).subspan(off, n), .grad = std::span<const float>(b.g).subspan(off, n),
                  .states = sb, .low_precision = b.low.data() + off};
    fused.step(ca, {.step = 4, .lr = 1e-3});
    reference.step_reference(cb, {.step = 4, .lr = 1e-3});
    expect_bits_equal(a.p, b.p, "offset " + std::to_string(off));
    expect_bits_equal(a.m, b.m, "offset " + std::to_string(off));
    EXPECT_EQ(a.low, b.low) << "offset " << off;
  }
}

TEST_P(LionVsReference, NonFiniteValuesFlowThroughAsInTheReference) {
  const IsaLevel isa = GetParam();
  if (!memory::isa_supported(isa)) GTEST_SKIP() << memory::isa_name(isa) << " not supported on this CPU";
  const Lion fused(LionConfig{.weight_decay = 0.1}, isa);
  const Lion reference(LionConfig{.weight_decay = 0.1}, IsaLevel::kScalar);
  Buffers a(37, 3);
  a.g[5] = std::numeric_limits<float>::infinity();
  a.g[6] = std::numeric_limits<float>::quiet_NaN();
  a.g[20] = -std::numeric_limits<float>::infinity();
  a.p[7] = 1e38f;
  Buffers b = a;
  void* sa[] = {a.m.data()};
  void* sb[] = {b.m.data()};
  fused.step(a.chunk(sa, DType::kBF16), {.step = 1, .lr = 1e-3});
  reference.step_reference(b.chunk(sb, DType::kBF16), {.step = 1, .lr = 1e-3});
  expect_bits_equal(a.p, b.p, "master");
  expect_bits_equal(a.m, b.m, "exp_avg");
  EXPECT_EQ(a.low, b.low);
  EXPECT_TRUE(std::isnan(a.p[6])) << "a NaN gradient must not become a finite update";
}

INSTANTIATE_TEST_SUITE_P(Isas, LionVsReference, ::testing::Values(IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512),
                         [](const ::testing::TestParamInfo<IsaLevel>& info) {
                           return std::string(memory::isa_name(info.param));
                         });

TEST(Lion, MultiThreadedEqualsSingleThreadedBitForBit) {
  for (int threads : {2, 3}) {
    for (size_t n : {size_t{100003}, size_t{1} << 18}) {
      run_case(memory::best_isa(), n, kModes[1], DType::kBF16, threads);
      run_case(memory::best_isa(), n, kModes[2], std::nullopt, threads);
    }
  }
}

TEST(Lion, UpdateIsDeepSpeedsInItsOrder) {
  // One element by hand: c = 0.9 * 0.5 + 0.1 * (-2) = 0.25 > 0, so p = p * (1 - lr wd) - lr, and the
  // momentum is updated from its old value: m = 0.99 * 0.5 + 0.01 * (-2) = 0.475.
  const Lion lion(LionConfig{.lr = 0.01, .betas = {0.9, 0.99}, .weight_decay = 0.5});
  std::vector<float> p = {2.0f, 2.0f}, g = {-4.0f, 4.0f}, m = {0.5f, 0.5f};
  void* states[] = {m.data()};
  lion.step({.master = p, .grad = g, .states = states}, {.step = 7, .lr = 0.01, .grad_scale = 0.5f});
  EXPECT_FLOAT_EQ(p[0], 2.0f * (1.0f - 0.005f) - 0.01f);
  EXPECT_FLOAT_EQ(m[0], 0.475f);
  EXPECT_FLOAT_EQ(p[1], 2.0f * (1.0f - 0.005f) - 0.01f);  // c = 0.45 + 0.2 > 0 too
  EXPECT_FLOAT_EQ(m[1], 0.495f + 0.02f);
  // A no-decay chunk (biases, norms) moves by exactly lr.
  std::vector<float> q = {1.0f}, h = {-1.0f}, n = {0.0f};
  void* s2[] = {n.data()};
  lion.step({.master = q, .grad = h, .states = s2, .apply_weight_decay = false}, {.step = 1, .lr = 0.25});
  EXPECT_EQ(q[0], 1.25f);
  EXPECT_EQ(lion.state_specs().size(), 1u);
  EXPECT_EQ(lion.state_specs()[0].name, "exp_avg");
  EXPECT_DOUBLE_EQ(lion.state_bytes_per_param(), 4.0);
}

TEST(Lion, MinimisesAQuadratic) {
  // f(p) = sum 0.5 a_i p_i^2 with curvatures over three decades; Lion with a decaying lr gets every
  // coordinate from |p| ~ 1 to within a few lr of 0.
  const size_t n = 64;
  std::vector<float> p(n), g(n), m(n, 0.0f), a(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = std::pow(10.0f, 3.0f * static_cast<float>(i) / static_cast<float>(n));
    p[i] = (i % 2 ? 1.0f : -1.0f) * (0.5f + 0.01f * static_cast<float>(i));
  }
  const Lion lion(LionConfig{.lr = 0.02, .betas = {0.9, 0.99}});
  void* states[] = {m.data()};
  for (int64_t t = 1; t <= 600; ++t) {
    for (size_t i = 0; i < n; ++i) g[i] = a[i] * p[i];
    const double lr = 0.02 * (1.0 - static_cast<double>(t - 1) / 600.0) + 1e-4;
    lion.step({.master = p, .grad = g, .states = states}, {.step = t, .lr = lr});
  }
  for (size_t i = 0; i < n; ++i) EXPECT_LT(std::abs(p[i]), 0.01f) << "coordinate " << i << " curvature " << a[i];
}

TEST(Lion, UnsupportedIsaIsAConfigError) {
  if (memory::isa_supported(IsaLevel::kAvx512)) GTEST_SKIP() << "every ISA is supported here";
  EXPECT_THROW(Lion(LionConfig{}, IsaLevel::kAvx512), ConfigError);
}

// ---- the registry entry ---------------------------------------------------------------------------

using test::error_of;
using test::parse;

TEST(LionEntry, IsRegisteredUnderDeepSpeedsNameInAnyCase) {
  for (const char* spelling : {"Lion", "lion", "LION"}) {
    const OptimizerChoice c = parse(fmt::format(R"({{"type": "{}"}})", spelling));
    EXPECT_EQ(c.name(), "Lion");
    EXPECT_FALSE(c.compressed());
    EXPECT_TRUE(c.type().sign_update());
    const LionConfig& p = c.params<LionConfig>();
    EXPECT_DOUBLE_EQ(p.lr, 1e-4);
    EXPECT_DOUBLE_EQ(p.betas[0], 0.9);
    EXPECT_DOUBLE_EQ(p.betas[1], 0.99);
    EXPECT_DOUBLE_EQ(p.weight_decay, 0.0);
    EXPECT_DOUBLE_EQ(c.state_bytes_per_param(), 4.0);
    ASSERT_EQ(c.state_specs().size(), 1u);
    EXPECT_EQ(c.state_specs()[0].name, "exp_avg");
    EXPECT_EQ(c.make()->name(), "Lion");
  }
  EXPECT_NE(optimizer_type_list().find("Lion"), std::string::npos);
  EXPECT_NE(optimizer_type_list(/*elementwise_only=*/true).find("Lion"), std::string::npos);
}

TEST(LionEntry, ParsesItsParams) {
  const OptimizerChoice c = parse(R"({"type": "Lion", "params": {"lr": 3e-5, "betas": [0.95, 0.98], "weight_decay": 1e-1}})");
  const LionConfig& p = c.params<LionConfig>();
  EXPECT_DOUBLE_EQ(p.lr, 3e-5);
  EXPECT_DOUBLE_EQ(p.betas[0], 0.95);
  EXPECT_DOUBLE_EQ(p.betas[1], 0.98);
  EXPECT_DOUBLE_EQ(p.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(c.lr(), 3e-5);
}

TEST(LionEntry, BadParamsNameTheirJsonPath) {
  EXPECT_NE(error_of(R"({"type": "Lion", "params": {"betas": [0.9, 1.0]}})").find("optimizer.params.betas[1]"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "Lion", "params": {"lr": -1}})").find("optimizer.params.lr"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "Lion", "params": {"weight_decay": "lots"}})").find("optimizer.params.weight_decay"),
            std::string::npos);
  const std::string eps = error_of(R"({"type": "Lion", "params": {"eps": 1e-8}})");
  EXPECT_NE(eps.find("optimizer.params.eps"), std::string::npos) << eps;
  EXPECT_NE(eps.find("no eps"), std::string::npos) << eps;
  const std::string typo = error_of(R"({"type": "Lion", "params": {"weight_decy": 0.1}})");
  EXPECT_NE(typo.find("optimizer.params.weight_decy"), std::string::npos) << typo;
  EXPECT_NE(typo.find("weight_decay"), std::string::npos) << typo;  // did you mean
  EXPECT_NE(error_of(R"({"type": "Lion", "params": {"betas": [0.9]}})").find("optimizer.params.betas"), std::string::npos);
}

}  // namespace
}  // namespace zs::optim
