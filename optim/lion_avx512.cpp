// AVX-512 fused Lion kernel; compiled with -mavx512f/bw/vl/dq (zs_isa_sources) plus
// -ffp-contract=off, and only called after memory::isa_supported(kAvx512). Tails use masked loads
// and stores, so every element goes through the same vector code. Operation order is that of
// Lion::step_reference (see optim/fused_lion.h), so results agree with it bit for bit; the bf16
// rounding is memory's (Note [Rounding and NaN] in memory/dtype.cpp) and fp16 uses vcvtps2ph, which
// memory's tests pin to memory::f32_to_f16.
// GCC 12's AVX-512 intrinsics trip -Wmaybe-uninitialized (GCC PR 105593; see adam_avx512.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <climits>

#include "memory/simd_bf16.h"
#include "optim/detail/lion_kernels.h"

namespace zs::optim::detail {
namespace {

using memory::simd::bf16_round;

enum class Low { kNone, kBF16, kF16 };

struct Consts {
  __m512 beta1, beta2, omb1, omb2, lr, decay, grad_scale, zero;
  __m512i one_bits, sign_bit;
  explicit Consts(const LionConstants& k)
      : beta1(_mm512_set1_ps(k.beta1)), beta2(_mm512_set1_ps(k.beta2)), omb1(_mm512_set1_ps(k.one_minus_beta1)),
        omb2(_mm512_set1_ps(k.one_minus_beta2)), lr(_mm512_set1_ps(k.lr)), decay(_mm512_set1_ps(k.decay)),
        grad_scale(_mm512_set1_ps(k.grad_scale)), zero(_mm512_setzero_ps()),
        one_bits(_mm512_castps_si512(_mm512_set1_ps(1.0f))), sign_bit(_mm512_set1_epi32(INT32_MIN)) {}
};

template <Low kLow>
inline void update16(const Consts& c, float* p, const float* g, float* m, uint16_t* low, __mmask16 mask) {
  const __m512 pv = _mm512_maskz_loadu_ps(mask, p);
  const __m512 gv = _mm512_maskz_loadu_ps(mask, g);
  const __m512 mv = _mm512_maskz_loadu_ps(mask, m);
  const __m512 grad = _mm512_mul_ps(gv, c.grad_scale);
  const __m512 cv = _mm512_add_ps(_mm512_mul_ps(c.beta1, mv), _mm512_mul_ps(c.omb1, grad));
  // sign(c): where c is neither zero nor NaN, (c & sign bit) | 1.0f in one ternary-logic op
  // (0xEC = (A & C) | B with A = c, B = 1.0f, C = the sign bit); elsewhere c itself (+-0, NaN).
  const __m512i ci = _mm512_castps_si512(cv);
  const __m512 sign = _mm512_castsi512_ps(
      _mm512_mask_ternarylogic_epi32(ci, _mm512_cmp_ps_mask(cv, c.zero, _CMP_NEQ_OQ), c.one_bits, c.sign_bit, 0xEC));
  const __m512 pn = _mm512_sub_ps(_mm512_mul_ps(pv, c.decay), _mm512_mul_ps(c.lr, sign));
  const __m512 mn = _mm512_add_ps(_mm512_mul_ps(c.beta2, mv), _mm512_mul_ps(c.omb2, grad));
  _mm512_mask_storeu_ps(m, mask, mn);
  _mm512_mask_storeu_ps(p, mask, pn);
  if constexpr (kLow == Low::kBF16) {
    _mm512_mask_cvtepi32_storeu_epi16(low, mask, bf16_round(pn));
  } else if constexpr (kLow == Low::kF16) {
    _mm256_mask_storeu_epi16(low, mask, _mm512_cvtps_ph(pn, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

template <Low kLow>
void run(const LionArrays& a, const LionConstants& k) {
  const Consts c(k);
  auto* low = static_cast<uint16_t*>(a.low_precision);
  auto low_at = [low](size_t i) { return kLow == Low::kNone ? nullptr : low + i; };  // no nullptr + i
  const size_t n = a.n;
  constexpr auto kAll = static_cast<__mmask16>(0xFFFF);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    update16<kLow>(c, a.master + i, a.grad + i, a.exp_avg + i, low_at(i), kAll);
    update16<kLow>(c, a.master + i + 16, a.grad + i + 16, a.exp_avg + i + 16, low_at(i + 16), kAll);
  }
  for (; i + 16 <= n; i += 16) update16<kLow>(c, a.master + i, a.grad + i, a.exp_avg + i, low_at(i), kAll);
  if (i < n) {
    const auto mask = static_cast<__mmask16>((1u << (n - i)) - 1u);
    update16<kLow>(c, a.master + i, a.grad + i, a.exp_avg + i, low_at(i), mask);
  }
}

}  // namespace

void fused_lion_avx512(const LionArrays& a, const LionConstants& k) {
  if (a.low_precision == nullptr) {
    run<Low::kNone>(a, k);
  } else if (a.low_precision_dtype == memory::DType::kBF16) {
    run<Low::kBF16>(a, k);
  } else {
    run<Low::kF16>(a, k);
  }
}

}  // namespace zs::optim::detail
