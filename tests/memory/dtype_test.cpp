// Conversions: every vector kernel the CPU supports against the scalar functions, bit for bit, on
// every 16-bit pattern and on millions of fp32 patterns; the scalar functions against independent
// references (GCC's software _Float16 for fp16, a nearest-neighbour search in double for bf16).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/errors.h"
#include "memory/dtype.h"

namespace zs::memory {
namespace {

float f(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }

// Edge cases for 32 -> 16: zeros, subnormals, ties at both widths, max finite, overflow, NaN payloads.
std::vector<uint32_t> edge_patterns() {
  std::vector<uint32_t> v = {0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF,
                             0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7F800001, 0xFF800001, 0x7FC00000, 0xFFC00000,
                             0x7FFFFFFF, 0xFFFFFFFF, 0x7F80FFFF, 0x7FBFFFFF, 0x7F8000FF, 0x3F800000, 0xBF800000,
                             0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001, 0x47800000, 0x38800000, 0x387FFFFF,
                             0x33000000, 0x33000001, 0x32FFFFFF, 0x33800000, 0x33C00000, 0x34000000, 0x34400000};
  // Halfway and near-halfway patterns for every exponent: the dropped bits exactly at half (bf16:
  // 0x8000, fp16: 0x1000), one below and one above, with odd and even kept lsb.
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t e = 0; e < 256; ++e) {
      for (uint32_t kept : {0u, 1u, 0x7Eu, 0x7Fu}) {
        uint32_t base = sign | (e << 23) | (kept << 16);
        for (uint32_t low : {0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu, 0x0001u}) v.push_back(base | low);
      }
      for (uint32_t kept : {0u, 1u, 0x3FEu, 0x3FFu}) {
        uint32_t base = sign | (e << 23) | (kept << 13);
        for (uint32_t low : {0x0FFFu, 0x1000u, 0x1001u, 0x1FFFu}) v.push_back(base | low);
      }
    }
  }
  return v;
}

// Edge cases, a stride through the whole 2^32 space (prime stride: every exponent and many
// mantissas), and uniform random patterns. About 6 million values.
std::vector<float> narrowing_inputs() {
  std::vector<float> out;
  for (uint32_t b : edge_patterns()) out.push_back(f(b));
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 1999) out.push_back(f(static_cast<uint32_t>(b)));
  std::mt19937 rng(12345);
  for (int i = 0; i < 4'000'000; ++i) out.push_back(f(static_cast<uint32_t>(rng())));
  return out;
}

const std::vector<float>& inputs() {
  static const std::vector<float> v = narrowing_inputs();
  return v;
}

class ConvertIsa : public ::testing::TestWithParam<IsaLevel> {};

TEST_P(ConvertIsa, Bf16ToF32AllPatterns) {
  std::vector<uint16_t> src(65536);
  for (uint32_t i = 0; i < 65536; ++i) src[i] = static_cast<uint16_t>(i);
  std::vector<float> out(65536);
  convert_bf16_to_f32(src, out, GetParam());
  for (uint32_t i = 0; i < 65536; ++i) {
    ASSERT_EQ(bits(out[i]), bits(bf16_to_f32(src[i]))) << std::hex << "bf16 0x" << i;
  }
}

TEST_P(ConvertIsa, F16ToF32AllPatterns) {
  std::vector<uint16_t> src(65536);
  for (uint32_t i = 0; i < 65536; ++i) src[i] = static_cast<uint16_t>(i);
  std::vector<float> out(65536);
  convert_f16_to_f32(src, out, GetParam());
  for (uint32_t i = 0; i < 65536; ++i) {
    ASSERT_EQ(bits(out[i]), bits(f16_to_f32(src[i]))) << std::hex << "fp16 0x" << i;
  }
}

TEST_P(ConvertIsa, F32ToBf16MatchesScalar) {
  const auto& in = inputs();
  std::vector<uint16_t> out(in.size());
  convert_f32_to_bf16(in, out, GetParam());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(out[i], f32_to_bf16(in[i])) << std::hex << "fp32 0x" << bits(in[i]);
  }
}

TEST_P(ConvertIsa, F32ToF16MatchesScalar) {
  const auto& in = inputs();
  std::vector<uint16_t> out(in.size());
  convert_f32_to_f16(in, out, GetParam());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(out[i], f32_to_f16(in[i])) << std::hex << "fp32 0x" << bits(in[i]);
  }
}

// Every length 0..70 at every start offset 0..15: the tails and unaligned heads, and no writes past
// the end (a guard element after the destination must survive).
TEST_P(ConvertIsa, TailsAndOffsets) {
  const auto& in = inputs();
  for (size_t off = 0; off < 16; ++off) {
    for (size_t n = 0; n <= 70; ++n) {
      std::span<const float> src(in.data() + 1000 + off * 7, n);
      std::vector<uint16_t> h(off + n + 1, 0xABCD);
      std::span<uint16_t> dst(h.data() + off, n);
      convert_f32_to_bf16(src, dst, GetParam());
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(dst[i], f32_to_bf16(src[i]));
      ASSERT_EQ(h[off + n], 0xABCD) << "bf16 overrun at n=" << n;
      convert_f32_to_f16(src, dst, GetParam());
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(dst[i], f32_to_f16(src[i]));
      ASSERT_EQ(h[off + n], 0xABCD) << "fp16 overrun at n=" << n;
      for (size_t i = 0; i < off; ++i) ASSERT_EQ(h[i], 0xABCD) << "write before the destination";

      std::vector<float> w(off + n + 1, 42.0f);
      std::span<float> wdst(w.data() + off, n);
      convert_bf16_to_f32(dst, wdst, GetParam());  // dst now holds fp16 bits; any pattern is valid bf16
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(bits(wdst[i]), bits(bf16_to_f32(dst[i])));
      convert_f16_to_f32(dst, wdst, GetParam());
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(bits(wdst[i]), bits(f16_to_f32(dst[i])));
      ASSERT_EQ(w[off + n], 42.0f) << "widening overrun at n=" << n;
    }
  }
}

std::string isa_param_name(const ::testing::TestParamInfo<IsaLevel>& info) {
  return std::string(isa_name(info.param));
}

INSTANTIATE_TEST_SUITE_P(Supported, ConvertIsa, ::testing::ValuesIn(supported_isas()), isa_param_name);

// --- The scalar reference against independent references. ---

TEST(ScalarF16, MatchesSoftwareFloat16OnAllInputs) {
  // _Float16 conversions in GCC 12 on x86-64 without -mavx512fp16 go through libgcc (round to
  // nearest even): an implementation independent of ours. NaNs are compared by class and sign only.
  for (float x : inputs()) {
    uint16_t ours = f32_to_f16(x);
    _Float16 ref = static_cast<_Float16>(x);
    uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    if (std::isnan(x)) {
      ASSERT_EQ(ours & 0x7C00, 0x7C00);
      ASSERT_NE(ours & 0x03FF, 0) << "NaN became Inf: 0x" << std::hex << bits(x);
      ASSERT_NE(ours & 0x0200, 0) << "NaN not quiet";
      ASSERT_EQ(ours & 0x8000, (bits(x) >> 16) & 0x8000);
    } else {
      ASSERT_EQ(ours, ref_bits) << std::hex << "fp32 0x" << bits(x);
    }
  }
}

TEST(ScalarF16, WideningIsExact) {
  for (uint32_t i = 0; i < 65536; ++i) {
    uint16_t h = static_cast<uint16_t>(i);
    float ours = f16_to_f32(h);
    _Float16 ref;
    std::memcpy(&ref, &h, 2);
    if ((h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0) {
      ASSERT_TRUE(std::isnan(ours));
      ASSERT_EQ(bits(ours), ((i & 0x8000u) << 16) | 0x7FC00000u | ((i & 0x3FFu) << 13)) << std::hex << i;
    } else {
      ASSERT_EQ(bits(ours), bits(static_cast<float>(ref))) << std::hex << i;
      ASSERT_EQ(f32_to_f16(ours), h) << "round trip of 0x" << std::hex << i;
    }
  }
}

double bf16_value(uint32_t h) {  // the finite value of a bf16 pattern, or +-2^128 for Inf (IEEE overflow)
  if ((h & 0x7F80u) == 0x7F80u) return std::copysign(std::ldexp(1.0, 128), (h & 0x8000u) ? -1.0 : 1.0);
  return static_cast<double>(f(h << 16));
}

TEST(ScalarBf16, NearestEvenAgainstNeighbours) {
  for (float x : inputs()) {
    uint16_t r = f32_to_bf16(x);
    if (std::isnan(x)) {
      ASSERT_EQ(r & 0x7F80, 0x7F80);
      ASSERT_NE(r & 0x0040, 0) << "NaN not quiet / became Inf: 0x" << std::hex << bits(x);
      ASSERT_EQ(r >> 15, bits(x) >> 31);
      continue;
    }
    if (std::isinf(x)) {
      ASSERT_EQ(static_cast<uint32_t>(r) << 16, bits(x));
      continue;
    }
    double xv = x, rv = bf16_value(r);
    ASSERT_EQ(std::signbit(rv), std::signbit(xv));
    // The neighbours in magnitude (same sign): r-1 and r+1; r must be at least as close as both,
    // and on a tie r has an even mantissa.
    for (int d : {-1, 1}) {
      uint32_t mag = r & 0x7FFFu;
      if ((d < 0 && mag == 0) || (d > 0 && mag >= 0x7F80u)) continue;
      uint32_t nb = (r & 0x8000u) | (mag + static_cast<uint32_t>(d));
      double nv = bf16_value(nb);
      double er = std::fabs(xv - rv), en = std::fabs(xv - nv);
      ASSERT_LE(er, en) << std::hex << "fp32 0x" << bits(x) << " -> 0x" << r;
      if (er == en) {
        ASSERT_EQ(r & 1, 0) << std::hex << "tie not to even: 0x" << bits(x);
      }
    }
  }
}

TEST(ScalarBf16, WideningIsExactShift) {
  for (uint32_t i = 0; i < 65536; ++i) {
    uint32_t b = bits(bf16_to_f32(static_cast<uint16_t>(i)));
    bool nan = (i & 0x7F80u) == 0x7F80u && (i & 0x7Fu) != 0;
    ASSERT_EQ(b, nan ? (i << 16) | 0x00400000u : i << 16) << std::hex << i;
    if (!nan) {
      ASSERT_EQ(f32_to_bf16(f(b)), i);
    }
  }
}

TEST(Scalar, NamedEdgeCases) {
  EXPECT_EQ(f32_to_bf16(f(0x7F800001)), 0x7FC0);  // signalling NaN, tiny payload: stays NaN
  EXPECT_EQ(f32_to_bf16(f(0xFF800001)), 0xFFC0);  // sign kept
  EXPECT_EQ(f32_to_bf16(f(0x7FFFFFFF)), 0x7FFF);  // payload would carry into the sign: must not
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);  // tie -> even (down)
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // overflow to Inf
  EXPECT_EQ(f32_to_bf16(f(0x00000001)), 0x0000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);
  EXPECT_EQ(f32_to_f16(-1e10f), 0xFC00);
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);              // tie -> even (zero)
  EXPECT_EQ(f32_to_f16(1.5f * 0x1p-24f), 0x0002);       // tie -> even (2 units)
  EXPECT_EQ(f32_to_f16(0x1.8p-25f), 0x0001);            // above the tie
  EXPECT_EQ(f32_to_f16(0x1.ffcp-15f), 0x0400);          // rounds up into the smallest normal
  EXPECT_EQ(f32_to_f16(f(0x7F800001)), 0x7E00);
  EXPECT_EQ(f32_to_f16(f(0xFFC00000)), 0xFE00);
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7C01)));
  EXPECT_EQ(bits(f16_to_f32(0xFC01)), 0xFFC02000u);
  EXPECT_EQ(bits(f16_to_f32(0x7C00)), 0x7F800000u);
}

TEST(Convert, GenericDispatchAndBetweenHalfTypes) {
  std::vector<float> x = {1.0f, -2.5f, 3.14159f, 1e-6f, 65504.0f, 1e30f, std::numeric_limits<float>::quiet_NaN()};
  std::vector<uint16_t> b(x.size()), h(x.size()), h2(x.size());
  convert(x.data(), DType::kF32, b.data(), DType::kBF16, x.size());
  convert(b.data(), DType::kBF16, h.data(), DType::kF16, x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(b[i], f32_to_bf16(x[i]));
    EXPECT_EQ(h[i], f32_to_f16(bf16_to_f32(b[i])));
  }
  convert(h.data(), DType::kF16, h2.data(), DType::kF16, x.size());  // same type: a copy
  EXPECT_EQ(h, h2);
  std::vector<float> back(x.size());
  convert(h.data(), DType::kF16, back.data(), DType::kF32, x.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(bits(back[i]), bits(f16_to_f32(h[i])));
  std::vector<int32_t> ids = {1, 2, 3}, ids2(3);
  convert(ids.data(), DType::kI32, ids2.data(), DType::kI32, 3);
  EXPECT_EQ(ids, ids2);
  EXPECT_THROW(convert(ids.data(), DType::kI32, back.data(), DType::kF32, 3), InternalError);
  EXPECT_THROW(convert_f32_to_bf16(std::span<const float>(x), std::span<uint16_t>(b.data(), 2)), InternalError);
}

TEST(Convert, LargeBufferUsesBestKernel) {
  const auto& in = inputs();
  std::vector<uint16_t> a(in.size()), ref(in.size());
  convert_f32_to_bf16(in, a);
  convert_f32_to_bf16(in, ref, IsaLevel::kScalar);
  EXPECT_EQ(a, ref);
}

TEST(DType, NamesAndParsing) {
  EXPECT_EQ(dtype_name(DType::kBF16), "bf16");
  EXPECT_EQ(dtype_size(DType::kF16), 2u);
  EXPECT_EQ(dtype_size(DType::kI32), 4u);
  EXPECT_EQ(parse_dtype("bfloat16", "x"), DType::kBF16);
  EXPECT_EQ(parse_dtype("fp32", "x"), DType::kF32);
  try {
    parse_dtype("fp8", "model.dtype");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.dtype"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("fp8"), std::string::npos);
  }
}

TEST(CpuFeatures, Consistent) {
  auto isas = supported_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), IsaLevel::kScalar);
  EXPECT_EQ(isas.back(), best_isa());
  if (cpu_has_avx512()) {
    EXPECT_TRUE(cpu_has_avx2_f16c());
  }
  EXPECT_EQ(parse_isa("scalar", "--isa"), IsaLevel::kScalar);
  EXPECT_THROW(parse_isa("sse9", "--isa"), ConfigError);
  if (!cpu_has_avx512()) {
    EXPECT_THROW(parse_isa("avx512", "--isa"), ConfigError);
    std::vector<float> x(4);
    std::vector<uint16_t> y(4);
    EXPECT_THROW(convert_f32_to_bf16(x, y, IsaLevel::kAvx512), ConfigError);
  }
}

// Note [ISA cap] in memory/cpu_features.cpp. The cap must come before the first best_isa(), so it is
// exercised in a fresh process (threadsafe death tests re-execute the binary for this test alone).
TEST(IsaCapDeathTest, LowersTheAutomaticChoiceOnly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const IsaLevel widest = supported_isas().back();
        set_isa_cap(IsaLevel::kScalar);
        std::exit(best_isa() == IsaLevel::kScalar && supported_isas().back() == widest ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(IsaCap, RefusedOnceAKernelWasChosen) {
  const IsaLevel chosen = best_isa();
  EXPECT_THROW(set_isa_cap(IsaLevel::kScalar), InternalError);
  EXPECT_EQ(best_isa(), chosen);
}

}  // namespace
}  // namespace zs::memory
