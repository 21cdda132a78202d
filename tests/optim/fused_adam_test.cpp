// The fused Adam kernels (optim/fused_adam.h) against the scalar reference Adam::step_reference: every
// ISA this machine runs, odd lengths, every mode, with and without the bf16/fp16 copy, bit for bit;
// and step_parallel against step on one thread, bit for bit.
#include "optim/fused_adam.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/errors.h"
#include "memory/cpu_features.h"
#include "memory/dtype.h"
#include "optim/adam.h"

namespace zs::optim {
namespace {

using memory::DType;
using memory::IsaLevel;

struct Mode {
  bool adam_w;
  bool bias_correction;
  bool decay;
  float grad_scale;
};

// States after a few steps, so moments are not all zero when the checked step runs.
struct Buffers {
  std::vector<float> p, g, m, v;
  std::vector<uint16_t> low;
  explicit Buffers(size_t n, uint32_t seed) : p(n), g(n), m(n), v(n), low(n, 0xDEAD) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (size_t i = 0; i < n; ++i) {
      p[i] = dist(gen);
      g[i] = dist(gen) * 1e-2f;
      m[i] = dist(gen) * 1e-3f;
      v[i] = std::abs(dist(gen)) * 1e-5f;
    }
    // A few special values: zero gradient and moments (denominator = eps), a negative zero weight,
    // a tiny weight that rounds to an fp16 subnormal.
    if (n > 3) {
      g[1] = 0.0f, m[1] = 0.0f, v[1] = 0.0f;
      p[2] = -0.0f;
      p[3] = 3e-6f;
    }
  }
  ParamChunk chunk(void* const* states, std::optional<DType> low_dtype) {
    ParamChunk c{.master = p, .grad = g, .states = std::span<void* const>(states, 2)};
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

void run_case(IsaLevel isa, size_t n, const Mode& mode, std::optional<DType> low_dtype, int threads) {
  AdamConfig cfg{.lr = 3e-3, .betas = {0.9, 0.95}, .eps = 1e-8, .weight_decay = mode.decay ? 0.1 : 0.0,
                 .adam_w_mode = mode.adam_w, .bias_correction = mode.bias_correction};
  const Adam fused(cfg, isa);
  const Adam reference(cfg, IsaLevel::kScalar);
  Buffers a(n, static_cast<uint32_t>(n * 31 + 7)), b = a;
  void* sa[] = {a.m.data(), a.v.data()};
  void* sb[] = {b.m.data(), b.v.data()};
  for (int64_t step = 1; step <= 3; ++step) {
    const StepContext ctx{.step = step, .lr = 3e-3 / static_cast<double>(step), .grad_scale = mode.grad_scale};
    if (threads > 1) {
      fused.step_parallel(a.chunk(sa, low_dtype), ctx, threads);
    } else {
      fused.step(a.chunk(sa, low_dtype), ctx);
    }
    reference.step_reference(b.chunk(sb, low_dtype), ctx);
  }
  const std::string what = std::string(memory::isa_name(isa)) + " n=" + std::to_string(n);
  expect_bits_equal(a.p, b.p, what + " master");
  expect_bits_equal(a.m, b.m, what + " exp_avg");
  expect_bits_equal(a.v, b.v, what + " exp_avg_sq");
  if (low_dtype) {
    for (size_t i = 0; i < n; ++i) {
      const uint16_t want = *low_dtype == DType::kBF16 ? memory::f32_to_bf16(b.p[i]) : memory::f32_to_f16(b.p[i]);
      ASSERT_EQ(a.low[i], want) << what << " low-precision element " << i;
    }
  } else {
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(a.low[i], 0xDEAD) << what << ": no copy asked, element " << i << " written";
  }
}

constexpr size_t kLengths[] = {1, 7, 15, 16, 17, 31, 1037, 100003};
const Mode kModes[] = {
    {true, true, true, 1.0f},   {true, true, true, 0.37f}, {false, true, true, 0.37f}, {true, false, true, 0.5f},
    {true, true, false, 0.5f},  {false, false, false, 1.0f}, {false, true, false, 2.0f}, {false, false, true, 0.25f},
};

class FusedAdamVsReference : public ::testing::TestWithParam<IsaLevel> {};

TEST_P(FusedAdamVsReference, EveryModeAndLengthBitForBit) {
  const IsaLevel isa = GetParam();
  if (!memory::isa_supported(isa)) GTEST_SKIP() << memory::isa_name(isa) << " not supported on this CPU";
  for (const Mode& mode : kModes) {
    for (size_t n : kLengths) {
      SCOPED_TRACE("adam_w=" + std::to_string(mode.adam_w) + " bias_correction=" + std::to_string(mode.bias_correction) +
                   " decay=" + std::to_string(mode.decay) + " grad_scale=" + std::to_string(mode.grad_scale));
      run_case(isa, n, mode, std::nullopt, 1);
      run_case(isa, n, mode, DType::kBF16, 1);
      run_case(isa, n, mode, DType::kF16, 1);
    }
  }
}

TEST_P(FusedAdamVsReference, MisalignedStartsBitForBit) {
  const IsaLevel isa = GetParam();
  if (!memory::isa_supported(isa)) GTEST_SKIP() << memory::isa_name(isa) << " not supported on this CPU";
  // Sub-spans starting 1..15 floats into the buffers: unaligned loads and stores everywhere.
  AdamConfig cfg{.weight_decay = 0.05};
  const Adam fused(cfg, isa);
  const Adam reference(cfg, IsaLevel::kScalar);
  for (size_t off = 1; off < 16; ++off) {
    Buffers a(300, 11), b = a;
    const size_t n = 300 - off - (off % 3);
    void* sa[] = {a.m.data() + off, a.v.data() + off};
    void* sb[] = {b.m.data() + off, b.v.data() + off};
    ParamChunk ca{.master = std::span(a.p).subspan(off, n), .grad = std::span<const float>(a.g).subspan(off, n),
                  .states = sa, .low_precision = a.low.data() + off};
    ParamChunk cb{.master = std::span(b.p).subspan(off, n), .grad = std::span<const float>(b.g).subspan(off, n),
                  .states = sb, .low_precision = b.low.data() + off};
    fused.step(ca, {.step = 4, .lr = 1e-3});
    reference.step_reference(cb, {.step = 4, .lr = 1e-3});
    expect_bits_equal(a.p, b.p, "offset " + std::to_string(off));
    expect_bits_equal(a.m, b.m, "offset " + std::to_string(off));
    expect_bits_equal(a.v, b.v, "offset " + std::to_string(off));
    EXPECT_EQ(a.low, b.low) << "offset " << off;
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, FusedAdamVsReference,
                         ::testing::Values(IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512),
                         [](const ::testing::TestParamInfo<IsaLevel>& info) {
                           return std::string(memory::isa_name(info.param));
                         });

TEST(FusedAdam, MultiThreadedEqualsSingleThreadedBitForBit) {
  const IsaLevel isa = memory::best_isa();
  for (int threads : {2, 3, 4}) {
    for (size_t n : {size_t{100003}, size_t{1} << 18, size_t{262147}}) {
      run_case(isa, n, kModes[1], DType::kBF16, threads);
      run_case(isa, n, kModes[2], std::nullopt, threads);
    }
  }
  // Also a chunk that does not start on a cache line: step_parallel cuts at master's lines.
  const Adam adam(AdamConfig{.weight_decay = 0.1}, isa);
  Buffers a(200011, 5), b = a;
  void* sa[] = {a.m.data() + 3, a.v.data() + 3};
  void* sb[] = {b.m.data() + 3, b.v.data() + 3};
  const size_t n = 200000;
  ParamChunk ca{.master = std::span(a.p).subspan(3, n), .grad = std::span<const float>(a.g).subspan(3, n),
                .states = sa, .low_precision = a.low.data() + 3, .low_precision_dtype = DType::kF16};
  ParamChunk cb{.master = std::span(b.p).subspan(3, n), .grad = std::span<const float>(b.g).subspan(3, n),
                .states = sb, .low_precision = b.low.data() + 3, .low_precision_dtype = DType::kF16};
  adam.step_parallel(ca, {.step = 2}, 2);
  adam.step(cb, {.step = 2});
  expect_bits_equal(a.p, b.p, "unaligned parallel master");
  expect_bits_equal(a.m, b.m, "unaligned parallel exp_avg");
  expect_bits_equal(a.v, b.v, "unaligned parallel exp_avg_sq");
  EXPECT_EQ(a.low, b.low);
}

TEST(FusedAdam, ReferenceAndDefaultKernelAgreeOnSpecialValues) {
  // Inf and NaN gradients must flow through the fused kernel exactly as through the reference
  // (the engine skips such steps, but the kernel must not turn them into finite numbers).
  const Adam fused(AdamConfig{.weight_decay = 0.1, .adam_w_mode = false});
  const Adam reference(AdamConfig{.weight_decay = 0.1, .adam_w_mode = false}, IsaLevel::kScalar);
  Buffers a(37, 3);
  a.g[5] = std::numeric_limits<float>::infinity();
  a.g[6] = std::numeric_limits<float>::quiet_NaN();
  a.p[7] = 1e38f;
  Buffers b = a;
  void* sa[] = {a.m.data(), a.v.data()};
  void* sb[] = {b.m.data(), b.v.data()};
  fused.step(a.chunk(sa, DType::kBF16), {.step = 1});
  reference.step_reference(b.chunk(sb, DType::kBF16), {.step = 1});
  for (size_t i = 0; i < 37; ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(a.p[i]), std::bit_cast<uint32_t>(b.p[i])) << i;
    EXPECT_EQ(a.low[i], b.low[i]) << i;
  }
}

TEST(FusedAdam, UnsupportedIsaIsAConfigError) {
  if (memory::isa_supported(IsaLevel::kAvx512)) GTEST_SKIP() << "every ISA is supported here";
  EXPECT_THROW(Adam(AdamConfig{}, IsaLevel::kAvx512), ConfigError);
}

}  // namespace
}  // namespace zs::optim
