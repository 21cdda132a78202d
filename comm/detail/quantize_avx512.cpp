// AVX-512 int8 block quantisation (comm/detail/quantize_kernels.h); compiled with -mavx512*
// (zs_isa_sources) and only called after memory::isa_supported(kAvx512). Tails use masked loads and
// stores, so every element goes through the same vector code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's AVX-512 headers (see memory/convert_avx512.cpp)
#include <immintrin.h>

#include <algorithm>
#include <cfloat>

#include "comm/detail/quantize_kernels.h"
#include "comm/quantize.h"

namespace zs::comm::detail {
namespace {
__mmask16 tail_mask(size_t left) { return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1); }
}  // namespace

void quantize_avx512(const float* x, size_t n, float* scales, int8_t* q) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512 fmax = _mm512_set1_ps(FLT_MAX);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  for (size_t b = 0; b < n; b += kQuantBlock) {
    const size_t len = std::min(kQuantBlock, n - b);
    __m512 mx = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for (size_t i = 0; i < len; i += 16) {
      const __m512 a = _mm512_and_ps(_mm512_maskz_loadu_ps(tail_mask(len - i), x + b + i), abs_mask);
      mx = _mm512_max_ps(mx, a);
      bad |= _mm512_cmp_ps_mask(a, fmax, _CMP_NLE_UQ);  // inf or NaN
    }
    const BlockScale s = block_scale(_mm512_reduce_max_ps(mx), bad != 0);
    scales[b / kQuantBlock] = s.scale;
    const __m512 inv = _mm512_set1_ps(s.inv);
    for (size_t i = 0; i < len; i += 16) {
      const __mmask16 m = tail_mask(len - i);
      __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + b + i), inv);
      if (bad) v = _mm512_setzero_ps();  // 0 * inf would be NaN, which converts to INT_MIN
      const __m512i r = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(v), lo), hi);
      _mm_mask_storeu_epi8(q + b + i, m, _mm512_cvtepi32_epi8(r));
    }
  }
}

void dequantize_avx512(const int8_t* q, const float* scales, size_t n, float* out, bool accumulate) {
  for (size_t b = 0; b < n; b += kQuantBlock) {
    const size_t len = std::min(kQuantBlock, n - b);
    const __m512 s = _mm512_set1_ps(scales[b / kQuantBlock]);
    for (size_t i = 0; i < len; i += 16) {
      const __mmask16 m = tail_mask(len - i);
      const __m512i w = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, q + b + i));
      __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(w), s);
      if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, out + b + i), v);
      _mm512_mask_storeu_ps(out + b + i, m, v);
    }
  }
}

}  // namespace zs::comm::detail
