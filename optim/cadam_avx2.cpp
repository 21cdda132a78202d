// AVX2 + F16C fused CAdam kernel; compiled with -mavx2 -mfma -mf16c (zs_isa_sources) plus
// -ffp-contract=off, and only called after memory::isa_supported(kAvx2). One block of 32 elements is
// four vectors; a short last block goes through the scalar kernel, which agrees with this one (and
// with CAdam::step_reference) bit for bit. Operation order: optim/cadam.h; the quantiser rounds
// stochastically, floor(x + u) with an explicit rounding mode and u from cadam_dither()'s integer hash
// computed lane by lane (vpmulld wraps like uint32 multiplication); the signed-saturating packs turn
// floor 128 into 127 as the reference's min does; bf16 rounding: memory/simd_bf16.h.
#include <immintrin.h>

#include <cfloat>
#include <cstdint>

#include "memory/simd_bf16.h"
#include "optim/detail/cadam_kernels.h"

namespace zs::optim::detail {
namespace {

using memory::simd::bf16_round;

enum class Low { kNone, kBF16, kF16 };

struct Consts {
  __m256 beta1, beta2, omb1, omb2, lr, wd, grad_scale, one, minus_one, zero, q_max, q_min, flt_max, abs_mask,
      dither_unit;
  __m256i dither_mul, lane_key[4];
  explicit Consts(const CAdamConstants& k)
      : beta1(_mm256_set1_ps(k.beta1)), beta2(_mm256_set1_ps(k.beta2)), omb1(_mm256_set1_ps(k.one_minus_beta1)),
        omb2(_mm256_set1_ps(k.one_minus_beta2)), lr(_mm256_set1_ps(k.lr)), wd(_mm256_set1_ps(k.weight_decay)),
        grad_scale(_mm256_set1_ps(k.grad_scale)), one(_mm256_set1_ps(1.0f)), minus_one(_mm256_set1_ps(-1.0f)),
        zero(_mm256_setzero_ps()), q_max(_mm256_set1_ps(127.0f)), q_min(_mm256_set1_ps(-127.0f)),
        flt_max(_mm256_set1_ps(FLT_MAX)), abs_mask(_mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF))),
        dither_unit(_mm256_set1_ps(kCAdamDitherUnit)),
        dither_mul(_mm256_set1_epi32(static_cast<int>(kCAdamDitherMul))) {
    for (int j = 0; j < 4; ++j) lane_key[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k.lane_key + 8 * j));
  }
};

// cadam_dither() on 8 lanes: old master bits, lanes 8j .. 8j+7 of the block.
inline __m256 dither8(const Consts& c, __m256 p_old, int j) {
  __m256i h = _mm256_xor_si256(_mm256_castps_si256(p_old), c.lane_key[j]);
  h = _mm256_mullo_epi32(_mm256_xor_si256(h, _mm256_srli_epi32(h, 16)), c.dither_mul);
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(h, 8)), c.dither_unit);
}

// 8 elements (lanes 8j .. 8j+7 of the block) of the update; returns m' and sets `dither`.
template <Low kLow>
inline __m256 update8(const Consts& c, float* p, const float* g, uint16_t* low, __m256 m, int j, __m256& dither) {
  const __m256 pv = _mm256_loadu_ps(p);
  dither = dither8(c, pv, j);
  const __m256 grad = _mm256_mul_ps(_mm256_loadu_ps(g), c.grad_scale);
  const __m256 cv = _mm256_add_ps(_mm256_mul_ps(c.beta1, m), _mm256_mul_ps(c.omb1, grad));
  __m256 sign = _mm256_blendv_ps(cv, c.one, _mm256_cmp_ps(cv, c.zero, _CMP_GT_OQ));
  sign = _mm256_blendv_ps(sign, c.minus_one, _mm256_cmp_ps(cv, c.zero, _CMP_LT_OQ));
  const __m256 pn = _mm256_sub_ps(pv, _mm256_mul_ps(c.lr, _mm256_add_ps(sign, _mm256_mul_ps(c.wd, pv))));
  _mm256_storeu_ps(p, pn);
  if constexpr (kLow == Low::kBF16) {
    const __m256i r = bf16_round(pn);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(low),
                     _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
  } else if constexpr (kLow == Low::kF16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(low), _mm256_cvtps_ph(pn, _MM_FROUND_TO_NEAREST_INT));
  }
  return _mm256_add_ps(_mm256_mul_ps(c.beta2, m), _mm256_mul_ps(c.omb2, grad));
}

inline __m256i quantise8(const Consts& c, __m256 m_new, __m256 inv, __m256 dither) {
  const __m256 x = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(m_new, inv), c.q_min), c.q_max);
  return _mm256_cvttps_epi32(_mm256_round_ps(_mm256_add_ps(x, dither), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
}

// One whole block of 32 elements.
template <Low kLow>
inline void update_block(const Consts& c, float* p, const float* g, int8_t* q, float* scale, uint16_t* low) {
  const __m256 s_old = _mm256_set1_ps(*scale);
  __m256 mn[4], dither[4];
  for (int j = 0; j < 4; ++j) {
    const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * j));
    const __m256 m = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)), s_old);
    mn[j] = update8<kLow>(c, p + 8 * j, g + 8 * j, kLow == Low::kNone ? nullptr : low + 8 * j, m, j, dither[j]);
  }
  __m256 amax = c.zero;
  int finite = 0xFF;
  for (int j = 0; j < 4; ++j) {
    const __m256 a = _mm256_and_ps(mn[j], c.abs_mask);
    finite &= _mm256_movemask_ps(_mm256_cmp_ps(a, c.flt_max, _CMP_LE_OQ));
    amax = _mm256_max_ps(a, amax);
  }
  // Only used when every lane is finite, where max is exact and order-free.
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
  const float absmax = _mm_cvtss_f32(x);
  const float s = cadam_block_scale(absmax, finite == 0xFF);
  *scale = s;
  if (s > 0.0f) [[likely]] {
    const __m256 inv = _mm256_set1_ps(cadam_block_inverse(absmax));
    const __m256i w01 = _mm256_packs_epi32(quantise8(c, mn[0], inv, dither[0]), quantise8(c, mn[1], inv, dither[1]));
    const __m256i w23 = _mm256_packs_epi32(quantise8(c, mn[2], inv, dither[2]), quantise8(c, mn[3], inv, dither[3]));
    // packs works per 128-bit lane: dwords come out as q0lo q1lo q2lo q3lo | q0hi q1hi q2hi q3hi.
    const __m256i b = _mm256_packs_epi16(w01, w23);
    const __m256i ordered = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), ordered);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_setzero_si256());
  }
}

template <Low kLow>
void run(const CAdamArrays& a, const CAdamConstants& k) {
  const Consts c(k);
  // Local copies: the int8 stores may alias anything, which would make the compiler reload a's
  // fields after each block.
  float* const p = a.master;
  const float* const g = a.grad;
  int8_t* const q = a.exp_avg_q;
  float* const scale = a.exp_avg_scale;
  auto* const low = static_cast<uint16_t*>(a.low_precision);
  const size_t n = a.n;
  size_t i = 0;
  for (; i + kCAdamBlock <= n; i += kCAdamBlock) {
    update_block<kLow>(c, p + i, g + i, q + i, scale + i / kCAdamBlock, kLow == Low::kNone ? nullptr : low + i);
  }
  if (i < n) {
    CAdamArrays tail = a;
    tail.master += i;
    tail.grad += i;
    tail.exp_avg_q += i;
    tail.exp_avg_scale += i / kCAdamBlock;
    tail.n = n - i;
    if constexpr (kLow != Low::kNone) tail.low_precision = low + i;
    fused_cadam_scalar(tail, k);
  }
}

}  // namespace

void fused_cadam_avx2(const CAdamArrays& a, const CAdamConstants& k) {
  if (a.low_precision == nullptr) {
    run<Low::kNone>(a, k);
  } else if (a.low_precision_dtype == memory::DType::kBF16) {
    run<Low::kBF16>(a, k);
  } else {
    run<Low::kF16>(a, k);
  }
}

}  // namespace zs::optim::detail
