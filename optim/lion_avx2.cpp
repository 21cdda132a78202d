// AVX2 + F16C fused Lion kernel; compiled with -mavx2 -mfma -mf16c (zs_isa_sources) plus
// -ffp-contract=off, and only called after memory::isa_supported(kAvx2). The last n % 8 elements go
// through the scalar kernel, which agrees with this one (and with Lion::step_reference) bit for bit.
// Operation order: see optim/fused_lion.h; bf16 rounding: Note [Rounding and NaN] in memory/dtype.cpp.
#include <immintrin.h>

#include "memory/simd_bf16.h"
#include "optim/detail/lion_kernels.h"

namespace zs::optim::detail {
namespace {

using memory::simd::bf16_round;

enum class Low { kNone, kBF16, kF16 };

template <Low kLow>
void run(const LionArrays& a, const LionConstants& k) {
  const __m256 beta1 = _mm256_set1_ps(k.beta1), beta2 = _mm256_set1_ps(k.beta2);
  const __m256 omb1 = _mm256_set1_ps(k.one_minus_beta1), omb2 = _mm256_set1_ps(k.one_minus_beta2);
  const __m256 lr = _mm256_set1_ps(k.lr), decay = _mm256_set1_ps(k.decay), grad_scale = _mm256_set1_ps(k.grad_scale);
  const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f), minus_one = _mm256_set1_ps(-1.0f);
  float* p = a.master;
  float* m = a.exp_avg;
  const float* g = a.grad;
  auto* low = static_cast<uint16_t*>(a.low_precision);
  const size_t n = a.n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 pv = _mm256_loadu_ps(p + i);
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 mv = _mm256_loadu_ps(m + i);
    const __m256 grad = _mm256_mul_ps(gv, grad_scale);
    const __m256 cv = _mm256_add_ps(_mm256_mul_ps(beta1, mv), _mm256_mul_ps(omb1, grad));
    // sign(c): +1 where c > 0, -1 where c < 0, c itself elsewhere (+-0, NaN: both compares false).
    __m256 sign = _mm256_blendv_ps(cv, one, _mm256_cmp_ps(cv, zero, _CMP_GT_OQ));
    sign = _mm256_blendv_ps(sign, minus_one, _mm256_cmp_ps(cv, zero, _CMP_LT_OQ));
    const __m256 pn = _mm256_sub_ps(_mm256_mul_ps(pv, decay), _mm256_mul_ps(lr, sign));
    const __m256 mn = _mm256_add_ps(_mm256_mul_ps(beta2, mv), _mm256_mul_ps(omb2, grad));
    _mm256_storeu_ps(m + i, mn);
    _mm256_storeu_ps(p + i, pn);
    if constexpr (kLow == Low::kBF16) {
      const __m256i r = bf16_round(pn);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(low + i),
                       _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
    } else if constexpr (kLow == Low::kF16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(low + i), _mm256_cvtps_ph(pn, _MM_FROUND_TO_NEAREST_INT));
    }
  }
  if (i < n) {
    LionArrays tail = a;
    tail.master += i;
    tail.grad += i;
    tail.exp_avg += i;
    tail.n = n - i;
    if constexpr (kLow != Low::kNone) tail.low_precision = low + i;
    fused_lion_scalar(tail, k);
  }
}

}  // namespace

void fused_lion_avx2(const LionArrays& a, const LionConstants& k) {
  if (a.low_precision == nullptr) {
    run<Low::kNone>(a, k);
  } else if (a.low_precision_dtype == memory::DType::kBF16) {
    run<Low::kBF16>(a, k);
  } else {
    run<Low::kF16>(a, k);
  }
}

}  // namespace zs::optim::detail
