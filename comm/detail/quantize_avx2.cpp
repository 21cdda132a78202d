// AVX2 int8 block quantisation (comm/detail/quantize_kernels.h); compiled with -mavx2 (zs_isa_sources)
// and -ffp-contract=off, only called after memory::isa_supported(kAvx2). Whole vectors of 8 elements
// in AVX2; a block's last few elements in the same scalar operations as quantize_scalar.
#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "comm/detail/quantize_kernels.h"
#include "comm/quantize.h"

namespace zs::comm::detail {

void quantize_avx2(const float* x, size_t n, float* scales, int8_t* q) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 fmax = _mm256_set1_ps(FLT_MAX);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  for (size_t b = 0; b < n; b += kQuantBlock) {
    const size_t len = std::min(kQuantBlock, n - b);
    const size_t body = len / 8 * 8;
    __m256 mx = _mm256_setzero_ps();
    int bad = 0;
    for (size_t i = 0; i < body; i += 8) {
      const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + b + i), abs_mask);
      mx = _mm256_max_ps(mx, a);
      bad |= _mm256_movemask_ps(_mm256_cmp_ps(a, fmax, _CMP_NLE_UQ));
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, mx);
    float absmax = 0.0f;
    for (float l : lanes) absmax = l > absmax ? l : absmax;
    for (size_t i = body; i < len; ++i) {
      const float a = std::fabs(x[b + i]);
      bad |= !(a <= FLT_MAX);
      absmax = a > absmax ? a : absmax;
    }
    const BlockScale s = block_scale(absmax, bad != 0);
    scales[b / kQuantBlock] = s.scale;
    const __m256 inv = _mm256_set1_ps(s.inv);
    for (size_t i = 0; i < body; i += 8) {
      __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + b + i), inv);
      if (bad) v = _mm256_setzero_ps();
      const __m256i r = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(v), lo), hi);
      const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(q + b + i), _mm_packs_epi16(w16, w16));
    }
    for (size_t i = body; i < len; ++i) {
      const float r = bad ? 0.0f : std::nearbyint(x[b + i] * s.inv);
      q[b + i] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
    }
  }
}

void dequantize_avx2(const int8_t* q, const float* scales, size_t n, float* out, bool accumulate) {
  for (size_t b = 0; b < n; b += kQuantBlock) {
    const size_t len = std::min(kQuantBlock, n - b);
    const size_t body = len / 8 * 8;
    const float scale = scales[b / kQuantBlock];
    const __m256 s = _mm256_set1_ps(scale);
    for (size_t i = 0; i < body; i += 8) {
      const __m128i w8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + b + i));
      __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(w8)), s);
      if (accumulate) v = _mm256_add_ps(_mm256_loadu_ps(out + b + i), v);
      _mm256_storeu_ps(out + b + i, v);
    }
    for (size_t i = body; i < len; ++i) {
      const float v = static_cast<float>(q[b + i]) * scale;
      out[b + i] = accumulate ? out[b + i] + v : v;
    }
  }
}

}  // namespace zs::comm::detail
