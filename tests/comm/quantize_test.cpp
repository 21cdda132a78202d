// The int8 block quantisation of ZeRO++'s collectives (comm/quantize.h, Note [Int8 blocks]) against a
// double-precision reference: per block, the scale is absmax / 127 and every value comes back within
// half a scale step; every ISA the CPU runs gives the scalar kernel's bits, for every tail length;
// zero, tiny, inf and NaN blocks follow the note.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "comm/quantize.h"

using namespace zs;
using memory::IsaLevel;

namespace {

std::vector<float> gaussian(size_t n, uint64_t seed, float spread = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  // Blocks of very different magnitudes, as a flat parameter buffer has (norm gains beside embeddings).
  for (size_t i = 0; i < n; ++i) v[i] = normal(rng) * std::ldexp(spread, static_cast<int>((i / comm::kQuantBlock) % 7) * 3 - 9);
  return v;
}

const size_t kSizes[] = {1, 3, 7, 8, 15, 16, 17, 255, 256, 257, 300, 511, 512, 1000, 4096 + 13};

TEST(Quantize, WithinHalfAStepOfTheReferencePerBlock) {
  for (size_t n : kSizes) {
    const auto x = gaussian(n, n);
    std::vector<int32_t> wire(comm::int8_words(n));
    std::vector<float> y(n);
    comm::quantize_int8(x.data(), n, wire.data(), IsaLevel::kScalar);
    comm::dequantize_int8(wire.data(), n, y.data(), false, IsaLevel::kScalar);
    for (size_t b = 0; b < n; b += comm::kQuantBlock) {
      const size_t len = std::min(comm::kQuantBlock, n - b);
      double absmax = 0;
      for (size_t i = 0; i < len; ++i) absmax = std::max(absmax, std::fabs(static_cast<double>(x[b + i])));
      const double step = absmax / 127.0;
      float scale;
      std::memcpy(&scale, &wire[b / comm::kQuantBlock], 4);
      EXPECT_NEAR(scale, step, step * 1e-6) << "n " << n << " block " << b;
      for (size_t i = 0; i < len; ++i) {
        // Half a step, plus the fp32 roundings of x * inv and q * scale.
        ASSERT_LE(std::fabs(static_cast<double>(x[b + i]) - y[b + i]), step * 0.5 + absmax * 3e-7)
            << "n " << n << " element " << b + i;
      }
      // The largest element of a block comes back (almost) exactly: the scale is set by it.
      size_t arg = b;
      for (size_t i = 0; i < len; ++i) arg = std::fabs(x[b + i]) > std::fabs(x[arg]) ? b + i : arg;
      EXPECT_NEAR(y[arg], x[arg], absmax * 1e-6);
    }
  }
}

TEST(Quantize, EveryIsaGivesTheScalarBits) {
  for (IsaLevel isa : memory::supported_isas()) {
    for (size_t n : kSizes) {
      const auto x = gaussian(n, 100 + n, 3.0f);
      std::vector<int32_t> want(comm::int8_words(n), -1), got(comm::int8_words(n), -2);
      comm::quantize_int8(x.data(), n, want.data(), IsaLevel::kScalar);
      comm::quantize_int8(x.data(), n, got.data(), isa);
      ASSERT_EQ(want, got) << memory::isa_name(isa) << " n " << n;
      for (bool accumulate : {false, true}) {
        std::vector<float> a(n, 0.25f), b(n, 0.25f);
        comm::dequantize_int8(want.data(), n, a.data(), accumulate, IsaLevel::kScalar);
        comm::dequantize_int8(want.data(), n, b.data(), accumulate, isa);
        ASSERT_EQ(0, std::memcmp(a.data(), b.data(), n * 4)) << memory::isa_name(isa) << " n " << n;
      }
    }
  }
}

TEST(Quantize, AccumulateAddsTheDequantisedValues) {
  const size_t n = 700;
  const auto x = gaussian(n, 9);
  std::vector<int32_t> wire(comm::int8_words(n));
  comm::quantize_int8(x.data(), n, wire.data());
  std::vector<float> once(n), acc(n, 1.5f);
  comm::dequantize_int8(wire.data(), n, once.data());
  comm::dequantize_int8(wire.data(), n, acc.data(), true);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(acc[i], 1.5f + once[i]);
}

TEST(Quantize, ZeroTinyInfAndNanBlocks) {
  for (IsaLevel isa : memory::supported_isas()) {
    const size_t n = 4 * comm::kQuantBlock + 5;
    std::vector<float> x(n, 0.0f);                                          // block 0: zeros
    for (size_t i = 256; i < 512; ++i) x[i] = 1e-38f * (i % 2 ? 1 : -1);   // block 1: below the flush bound
    for (size_t i = 512; i < 768; ++i) x[i] = static_cast<float>(i);        // block 2: inf at one place
    x[600] = std::numeric_limits<float>::infinity();
    for (size_t i = 768; i < 1024; ++i) x[i] = 1.0f;                        // block 3: a NaN
    x[1000] = std::numeric_limits<float>::quiet_NaN();
    for (size_t i = 1024; i < n; ++i) x[i] = -2.0f;                        // tail block: exact
    std::vector<int32_t> wire(comm::int8_words(n));
    std::vector<float> y(n, 7.0f);
    comm::quantize_int8(x.data(), n, wire.data(), isa);
    comm::dequantize_int8(wire.data(), n, y.data(), false, isa);
    for (size_t i = 0; i < 512; ++i) ASSERT_EQ(y[i], 0.0f) << i;
    for (size_t i = 512; i < 1024; ++i) ASSERT_TRUE(std::isnan(y[i])) << memory::isa_name(isa) << " " << i;
    for (size_t i = 1024; i < n; ++i) ASSERT_EQ(y[i], -2.0f);
  }
}

}  // namespace
