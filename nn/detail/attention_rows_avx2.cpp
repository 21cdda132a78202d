// The AVX2 row kernels of attention_rows.h; compiled with -mavx2 -mfma (zs_isa_sources) and only called
// where memory::isa_supported(kAvx2).
#include <immintrin.h>

#include "nn/detail/attention_rows.h"
#include "nn/detail/attention_rows_impl.h"
#include "nn/detail/ops.h"

namespace zs::nn::detail {
namespace {

struct V256 {
  using R = __m256;
  static constexpr int64_t W = 8;
  // Lanes [0, n) all ones.
  static __m256i first(int64_t n) {
    const int32_t k = static_cast<int32_t>(n < 0 ? 0 : n > 8 ? 8 : n);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static R load(const float* p) { return _mm256_loadu_ps(p); }
  static R load_n(const float* p, int64_t n) { return _mm256_maskload_ps(p, first(n)); }
  static void store(float* p, R x) { _mm256_storeu_ps(p, x); }
  static void store_n(float* p, R x, int64_t n) { _mm256_maskstore_ps(p, first(n), x); }
  static R set1(float x) { return _mm256_set1_ps(x); }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
  static R sub(R a, R b) { return _mm256_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R max(R a, R b) { return _mm256_max_ps(a, b); }
  static R keep_below(R x, int64_t k) { return _mm256_and_ps(x, _mm256_castsi256_ps(first(k))); }
  static float hsum(R x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float hmax(R x) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float exp_scalar(float x) { return fast_exp(x); }
  // detail::fast_exp on 8 lanes (Note [fast exp] in ops.h).
  static R exp(R x) {
    x = _mm256_min_ps(_mm256_max_ps(x, set1(-87.33654f)), set1(88.0f));
    const R shift = set1(12582912.0f);
    const R t = _mm256_fmadd_ps(x, set1(1.44269504088896341f), shift);
    const R n = _mm256_sub_ps(t, shift);
    R r = _mm256_fnmadd_ps(n, set1(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, set1(-2.12194440e-4f), r);
    R p = set1(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, set1(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, set1(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, set1(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, set1(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, set1(5.0000001201e-1f));
    const R e = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), set1(1.0f));
    const __m256i pow2 = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(0x4B400000)), _mm256_set1_epi32(127)),
        23);
    return _mm256_mul_ps(e, _mm256_castsi256_ps(pow2));
  }
};

}  // namespace

AttentionRowKernels attention_row_kernels_avx2() {
  return {&rows::online_softmax<V256>, &rows::softmax_grad<V256>};
}

}  // namespace zs::nn::detail
