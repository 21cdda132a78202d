// Per-ISA fused CAdam kernels behind CAdam::step (internal).
//
// Each kernel updates a.n elements (any length; the last block may be short and each kernel handles
// it) starting at a block boundary, and agrees bit for bit with CAdam::step_reference: same fp32
// operations in the same order (optim/cadam.h), the same stochastic rounding to int8: floor(x + u) in
// fp32 with u = cadam_dither(), at most 127 (Note [CAdam stochastic rounding]). The avx2/avx512
// kernels live in files compiled with their ISA flags: call them only when memory::isa_supported()
// says so.
#pragma once

#include <cstddef>
#include <cstdint>

#include "memory/cpu_features.h"
#include "memory/dtype.h"

namespace zs::optim::detail {

constexpr size_t kCAdamBlock = 32;

// The per-step scalars, folded once per chunk exactly as step_reference folds them.
struct CAdamConstants {
  float beta1 = 0.965f;
  float beta2 = 0.99f;
  float one_minus_beta1 = 0.035f;  // 1.0f - beta1, in fp32
  float one_minus_beta2 = 0.01f;   // 1.0f - beta2, in fp32
  float lr = 1e-4f;
  float weight_decay = 0.0f;       // 0 when the chunk takes no decay
  float grad_scale = 1.0f;
  uint32_t lane_key[kCAdamBlock] = {};  // cadam_lane_key(StepContext::step, lane)
};

// Raw views of one range of n elements starting at a block boundary: master and grad hold n floats,
// exp_avg_q n int8, exp_avg_scale ceil(n / 32) floats, low_precision nullptr or n bf16/fp16 values.
// No alignment needed; no array may overlap another.
struct CAdamArrays {
  float* master = nullptr;
  const float* grad = nullptr;
  int8_t* exp_avg_q = nullptr;
  float* exp_avg_scale = nullptr;
  size_t n = 0;
  void* low_precision = nullptr;
  memory::DType low_precision_dtype = memory::DType::kBF16;
};

// The re-quantisation rule every kernel applies to a block after its update: returns the new scale
// from the block's max |m'| and whether all its m' were finite (see optim/cadam.h).
inline float cadam_block_scale(float absmax, bool finite) {
  if (!finite) [[unlikely]] {
    return __builtin_nanf("");
  }
  return absmax / 127.0f;
}

// What the quantiser multiplies m' by (a block with scale' > 0: 0 < absmax <= FLT_MAX): 127 / absmax,
// at most FLT_MAX (it overflows for absmax < 127 / FLT_MAX, about 3.7e-37). One divide per block
// instead of one per element pays for most of the dither's work: in cache, the AVX-512 kernel with the
// dither and per-element divides took about 1.3x the time of the round-to-nearest one, with this 1.1x.
inline float cadam_block_inverse(float absmax) {
  const float inv = 127.0f / absmax;
  return inv < 3.40282347e38f ? inv : 3.40282347e38f;
}

// Note [CAdam stochastic rounding] (optim/cadam.h): the dither of one element is a pure function of
// the step, the bits of the element's master weight BEFORE the step, and its lane (0-31) in its block,
// so it is the same whatever chunk, thread or ISA updates the element. Vector kernels compute the same
// integer operations lane by lane (32-bit wrap-around arithmetic). The per-element part is cheap (one
// multiply; the kernels are near memory bandwidth): a full hash of (step, lane), the lane key, is
// computed once per chunk, and xor-ing it into the weight's bits makes the dither of every element
// uniform over steps whatever its weight; the multiply's top bits spread the elements of one step.
inline uint32_t cadam_fmix32(uint32_t h) {  // MurmurHash3's finaliser: a bijection with full avalanche
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}
constexpr uint32_t kCAdamDitherMul = 0x9E3779B9u;  // odd: the multiply is a bijection
constexpr float kCAdamDitherUnit = 0x1p-24f;       // the dither is a 24-bit integer times this

inline uint32_t cadam_lane_key(int64_t step, uint32_t lane) {
  const auto s = static_cast<uint64_t>(step);
  return cadam_fmix32(cadam_fmix32(static_cast<uint32_t>(s) + 0x7F4A7C15u * (lane + 1)) ^
                      static_cast<uint32_t>(s >> 32));
}

// The dither in [0, 1 - 2^-24], a multiple of 2^-24 (exact in fp32).
inline float cadam_dither(uint32_t old_master_bits, uint32_t lane_key) {
  uint32_t h = old_master_bits ^ lane_key;
  h = (h ^ (h >> 16)) * kCAdamDitherMul;
  return static_cast<float>(static_cast<int32_t>(h >> 8)) * kCAdamDitherUnit;
}

void fused_cadam_scalar(const CAdamArrays& a, const CAdamConstants& k);
void fused_cadam_avx2(const CAdamArrays& a, const CAdamConstants& k);
void fused_cadam_avx512(const CAdamArrays& a, const CAdamConstants& k);

// Runs the kernel of `isa` (must be supported here; checked with ZS_ASSERT).
void fused_cadam(const CAdamArrays& a, const CAdamConstants& k, memory::IsaLevel isa);

}  // namespace zs::optim::detail
