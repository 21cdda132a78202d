// AVX-512 fused CAdam kernel; compiled with -mavx512f/bw/vl/dq (zs_isa_sources) plus
// -ffp-contract=off, and only called after memory::isa_supported(kAvx512). One block of 32 elements is
// two vectors; the short last block uses masked loads and stores, so every element goes through the
// same vector code. Operation order is that of CAdam::step_reference (optim/cadam.h), so results agree
// with it bit for bit: the quantiser multiplies by the block's 127 / max|m'| (cadam_block_inverse), adds
// the dither (cadam_dither()'s integer hash computed lane by lane; vpmulld wraps like uint32
// multiplication), converts with an explicit round-down mode and narrows with signed saturation
// (floor 128 becomes 127, as the reference's min makes it); bf16 rounding is memory's
// (memory/simd_bf16.h), fp16 uses vcvtps2ph, which memory's tests pin to memory::f32_to_f16.
// GCC 12's AVX-512 intrinsics trip -Wmaybe-uninitialized in the header (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cfloat>
#include <cstdint>

#include "memory/simd_bf16.h"
#include "optim/detail/cadam_kernels.h"

namespace zs::optim::detail {
namespace {

using memory::simd::bf16_round;

enum class Low { kNone, kBF16, kF16 };

// Same idea as Note [Adam prefetch] (optim/adam_avx512.cpp): the two fp32 streams, 2 KiB ahead.
constexpr size_t kAhead = 512;  // floats

struct Consts {
  __m512 beta1, beta2, omb1, omb2, lr, wd, grad_scale, zero, q_max, q_min, flt_max, dither_unit;
  __m512i one_bits, sign_bit, dither_mul, lane_key[2];
  explicit Consts(const CAdamConstants& k)
      : beta1(_mm512_set1_ps(k.beta1)), beta2(_mm512_set1_ps(k.beta2)), omb1(_mm512_set1_ps(k.one_minus_beta1)),
        omb2(_mm512_set1_ps(k.one_minus_beta2)), lr(_mm512_set1_ps(k.lr)), wd(_mm512_set1_ps(k.weight_decay)),
        grad_scale(_mm512_set1_ps(k.grad_scale)), zero(_mm512_setzero_ps()), q_max(_mm512_set1_ps(127.0f)),
        q_min(_mm512_set1_ps(-127.0f)), flt_max(_mm512_set1_ps(FLT_MAX)),
        dither_unit(_mm512_set1_ps(kCAdamDitherUnit)), one_bits(_mm512_set1_epi32(0x3F800000)),
        sign_bit(_mm512_set1_epi32(INT32_MIN)), dither_mul(_mm512_set1_epi32(static_cast<int>(kCAdamDitherMul))) {
    for (int j = 0; j < 2; ++j) lane_key[j] = _mm512_loadu_si512(k.lane_key + 16 * j);
  }
};

// cadam_dither() on 16 lanes: old master bits, lanes 16j .. 16j+15 of the block.
inline __m512 dither16(const Consts& c, __m512 p_old, int j) {
  __m512i h = _mm512_xor_si512(_mm512_castps_si512(p_old), c.lane_key[j]);
  h = _mm512_mullo_epi32(_mm512_xor_si512(h, _mm512_srli_epi32(h, 16)), c.dither_mul);
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(h, 8)), c.dither_unit);
}

// 16 elements (lanes 16j .. 16j+15 of the block) of the update; returns m' and sets `dither` (lanes
// outside `mask` are don't-care in both).
template <Low kLow>
inline __m512 update16(const Consts& c, float* p, const float* g, uint16_t* low, __m512 m, __mmask16 mask, int j,
                       __m512& dither) {
  const __m512 pv = _mm512_maskz_loadu_ps(mask, p);
  dither = dither16(c, pv, j);
  const __m512 grad = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, g), c.grad_scale);
  const __m512 cv = _mm512_add_ps(_mm512_mul_ps(c.beta1, m), _mm512_mul_ps(c.omb1, grad));
  // sign(c): where c is neither zero nor NaN, (c & sign bit) | 1.0f in one ternary-logic op
  // (0xEC = (A & C) | B with A = c, B = 1.0f, C = the sign bit); elsewhere c itself (+-0, NaN).
  const __m512i ci = _mm512_castps_si512(cv);
  const __m512 sign = _mm512_castsi512_ps(_mm512_mask_ternarylogic_epi32(
      ci, _mm512_cmp_ps_mask(cv, c.zero, _CMP_NEQ_OQ), c.one_bits, c.sign_bit, 0xEC));
  const __m512 pn = _mm512_sub_ps(pv, _mm512_mul_ps(c.lr, _mm512_add_ps(sign, _mm512_mul_ps(c.wd, pv))));
  _mm512_mask_storeu_ps(p, mask, pn);
  if constexpr (kLow == Low::kBF16) {
    _mm512_mask_cvtepi32_storeu_epi16(low, mask, bf16_round(pn));
  } else if constexpr (kLow == Low::kF16) {
    _mm256_mask_storeu_epi16(low, mask, _mm512_cvtps_ph(pn, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  return _mm512_add_ps(_mm512_mul_ps(c.beta2, m), _mm512_mul_ps(c.omb2, grad));
}

inline __m128i quantise16(const Consts& c, __m512 m_new, __m512 inv, __m512 dither) {
  const __m512 x = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(m_new, inv), c.q_min), c.q_max);
  const __m512i floor = _mm512_cvt_roundps_epi32(_mm512_add_ps(x, dither), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  return _mm512_cvtsepi32_epi8(floor);
}

// One block of up to 32 elements (`mask` bit i: element i present).
template <Low kLow>
inline void update_block(const Consts& c, float* p, const float* g, int8_t* q, float* scale, uint16_t* low,
                         __mmask32 mask) {
  const auto m0 = static_cast<__mmask16>(mask), m1 = static_cast<__mmask16>(mask >> 16);
  const __m512 s_old = _mm512_set1_ps(*scale);
  const __m512 mo0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m0, q))), s_old);
  const __m512 mo1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m1, q + 16))), s_old);
  __m512 d0, d1;
  const __m512 mn0 = update16<kLow>(c, p, g, low, mo0, m0, 0, d0);
  const __m512 mn1 = update16<kLow>(c, p + 16, g + 16, kLow == Low::kNone ? nullptr : low + 16, mo1, m1, 1, d1);
  // max(|m'_i|, |m'_(i+16)|) per lane in one vrangeps (imm 0x0B: larger magnitude, sign cleared).
  // vrangeps passes an inf through but not a NaN (it returns the other operand), so NaNs are found
  // by an unordered compare of the two halves. Absent lanes become 0, which neither raises the max
  // nor counts as non-finite.
  const __m512 mn1z = _mm512_maskz_mov_ps(m1, mn1);
  const __m512 a = _mm512_maskz_range_ps(m0, mn0, mn1z, 0x0B);
  const bool finite = _mm512_cmp_ps_mask(a, c.flt_max, _CMP_LE_OQ) == 0xFFFF &&
                      _mm512_mask_cmp_ps_mask(m0, mn0, mn1z, _CMP_UNORD_Q) == 0;
  const float absmax = _mm512_reduce_max_ps(a);
  const float s = cadam_block_scale(absmax, finite);
  *scale = s;
  if (s > 0.0f) [[likely]] {
    const __m512 inv = _mm512_set1_ps(cadam_block_inverse(absmax));
    _mm_mask_storeu_epi8(q, m0, quantise16(c, mn0, inv, d0));
    _mm_mask_storeu_epi8(q + 16, m1, quantise16(c, mn1, inv, d1));
  } else {
    _mm_mask_storeu_epi8(q, m0, _mm_setzero_si128());
    _mm_mask_storeu_epi8(q + 16, m1, _mm_setzero_si128());
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
  auto low_at = [low](size_t i) { return kLow == Low::kNone ? nullptr : low + i; };  // no nullptr + i
  const size_t n = a.n;
  size_t i = 0;
  for (; i + kCAdamBlock <= n; i += kCAdamBlock) {
    _mm_prefetch(reinterpret_cast<const char*>(p + i + kAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(g + i + kAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(p + i + kAhead + 16), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(g + i + kAhead + 16), _MM_HINT_T0);
    update_block<kLow>(c, p + i, g + i, q + i, scale + i / kCAdamBlock, low_at(i), ~__mmask32{0});
  }
  if (i < n) {
    const auto mask = static_cast<__mmask32>((uint64_t{1} << (n - i)) - 1u);
    update_block<kLow>(c, p + i, g + i, q + i, scale + i / kCAdamBlock, low_at(i), mask);
  }
}

}  // namespace

void fused_cadam_avx512(const CAdamArrays& a, const CAdamConstants& k) {
  if (a.low_precision == nullptr) {
    run<Low::kNone>(a, k);
  } else if (a.low_precision_dtype == memory::DType::kBF16) {
    run<Low::kBF16>(a, k);
  } else {
    run<Low::kF16>(a, k);
  }
}

}  // namespace zs::optim::detail
