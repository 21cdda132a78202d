// reuse_fp32_param's encoding (Note [reuse_fp32_param] in engine/model_states_step.cpp): lossless, and the
// bf16 half equals round-to-nearest-even except at exact half-way cases with an even upper half.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "engine/detail/model_states.h"
#include "memory/dtype.h"

namespace zs::engine {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

TEST(ReuseFp32Param, EncodingIsLosslessAndRoundsLikeRneExceptAtEvenTies) {
  std::mt19937 rng(7);
  std::vector<float> master;
  for (int i = 0; i < 1 << 20; ++i) {
    uint32_t u = rng();
    if ((u & 0x7F800000u) == 0x7F800000u) u &= 0xBFFFFFFFu;  // finite values: masters never hold NaN or Inf
    master.push_back(from_bits(u));
  }
  // Every low half at one upper half, half-way cases with even and odd upper halves included.
  for (uint32_t low = 0; low < 0x10000; ++low) {
    master.push_back(from_bits(0x3F800000u | low));
    master.push_back(from_bits(0xBF810000u | low));
  }
  const size_t n = master.size();
  std::vector<uint16_t> hi(n), lo(n), rne(n);
  std::vector<float> back(n);
  encode_master(master.data(), hi.data(), lo.data(), n);
  decode_master(hi.data(), lo.data(), back.data(), n);
  memory::convert(master.data(), memory::DType::kF32, rne.data(), memory::DType::kBF16, n);
  size_t ties = 0;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(to_bits(back[i]), to_bits(master[i])) << i;
    const uint32_t u = to_bits(master[i]);
    const bool even_tie = (u & 0xFFFFu) == 0x8000u && ((u >> 16) & 1u) == 0;
    if (even_tie) {
      ++ties;
      EXPECT_EQ(hi[i], static_cast<uint16_t>((u >> 16) + 1)) << i;  // away from zero
      EXPECT_EQ(rne[i], static_cast<uint16_t>(u >> 16)) << i;        // to even
    } else {
      ASSERT_EQ(hi[i], rne[i]) << std::hex << u;
    }
  }
  EXPECT_GE(ties, 1u);
}

}  // namespace
}  // namespace zs::engine
