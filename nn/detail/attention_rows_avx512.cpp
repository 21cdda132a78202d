// The AVX-512 row kernels of attention_rows.h; compiled with the avx512 flags (zs_isa_sources) and only
// called where memory::isa_supported(kAvx512).
#include <immintrin.h>

#include "nn/detail/attention_rows.h"
#include "nn/detail/attention_rows_impl.h"
#include "nn/detail/ops.h"

// GCC 12 reports the undefined upper halves inside its own AVX-512 intrinsics as maybe-uninitialized: a
// false positive of the headers (as in gemm_avx512bf16.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace zs::nn::detail {
namespace {

struct V512 {
  using R = __m512;
  static constexpr int64_t W = 16;
  static __mmask16 first(int64_t n) {
    return n >= 16 ? static_cast<__mmask16>(0xFFFF) : n <= 0 ? 0 : static_cast<__mmask16>((1u << n) - 1);
  }
  static R load(const float* p) { return _mm512_loadu_ps(p); }
  static R load_n(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(first(n), p); }
  static void store(float* p, R x) { _mm512_storeu_ps(p, x); }
  static void store_n(float* p, R x, int64_t n) { _mm512_mask_storeu_ps(p, first(n), x); }
  static R set1(float x) { return _mm512_set1_ps(x); }
  static R add(R a, R b) { return _mm512_add_ps(a, b); }
  static R sub(R a, R b) { return _mm512_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static R max(R a, R b) { return _mm512_max_ps(a, b); }
  static R keep_below(R x, int64_t k) { return _mm512_maskz_mov_ps(first(k), x); }
  static float hmax(R x) { return _mm512_reduce_max_ps(x); }
  static float hsum(R x) { return _mm512_reduce_add_ps(x); }
  static float exp_scalar(float x) { return fast_exp(x); }
  // detail::fast_exp on 16 lanes (Note [fast exp] in ops.h).
  static R exp(R x) {
    x = _mm512_min_ps(_mm512_max_ps(x, set1(-87.33654f)), set1(88.0f));
    const R shift = set1(12582912.0f);
    const R t = _mm512_fmadd_ps(x, set1(1.44269504088896341f), shift);
    const R n = _mm512_sub_ps(t, shift);
    R r = _mm512_fnmadd_ps(n, set1(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, set1(-2.12194440e-4f), r);
    R p = set1(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, set1(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, set1(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, set1(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, set1(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, set1(5.0000001201e-1f));
    const R e = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), set1(1.0f));
    const __m512i pow2 = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x4B400000)), _mm512_set1_epi32(127)),
        23);
    return _mm512_mul_ps(e, _mm512_castsi512_ps(pow2));
  }
};

}  // namespace

AttentionRowKernels attention_row_kernels_avx512() {
  return {&rows::online_softmax<V512>, &rows::softmax_grad<V512>};
}

}  // namespace zs::nn::detail
