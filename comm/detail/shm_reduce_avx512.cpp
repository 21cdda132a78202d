// AVX-512 sums for the shared-memory collectives (comm/detail/shm_reduce.h); compiled with -mavx512*
// (zs_isa_sources) and only called after memory::isa_supported(kAvx512). Tails use masked loads and
// stores, so every element goes through the same vector code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's AVX-512 headers (see memory/convert_avx512.cpp)
#include <immintrin.h>

#include <cstdint>

#include "comm/detail/shm_reduce.h"
#include "memory/simd_bf16.h"

namespace zs::comm::detail {
namespace {

using memory::DType;

template <DType S>
inline __m512 load(const void* p, size_t i, __mmask16 m) {
  if constexpr (S == DType::kF32) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
  } else {
    __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i);
    if constexpr (S == DType::kBF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    else return _mm512_cvtph_ps(h);
  }
}

template <DType D>
inline void store(void* p, size_t i, __m512 v, __mmask16 m) {
  if constexpr (D == DType::kF32) {
    _mm512_mask_storeu_ps(static_cast<float*>(p) + i, m, v);
  } else if constexpr (D == DType::kBF16) {
    _mm512_mask_cvtepi32_storeu_epi16(static_cast<uint16_t*>(p) + i, m, memory::simd::bf16_round(v));
  } else {
    _mm256_mask_storeu_epi16(static_cast<uint16_t*>(p) + i, m,
                             _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

template <DType S, DType D>
void kernel(const void* const* srcs, size_t n_src, void* dst, size_t n, float divisor) {
  const bool divide = divisor != 1.0f;
  const __m512 d = _mm512_set1_ps(divisor);
  const __mmask16 all = 0xFFFF;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {  // two accumulators: the adds of one element chain, not of two vectors
    __m512 a = load<S>(srcs[0], i, all);
    __m512 b = load<S>(srcs[0], i + 16, all);
    for (size_t s = 1; s < n_src; ++s) {
      a = _mm512_add_ps(a, load<S>(srcs[s], i, all));
      b = _mm512_add_ps(b, load<S>(srcs[s], i + 16, all));
    }
    if (divide) {
      a = _mm512_div_ps(a, d);
      b = _mm512_div_ps(b, d);
    }
    store<D>(dst, i, a, all);
    store<D>(dst, i + 16, b, all);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? all : static_cast<__mmask16>((1u << (n - i)) - 1u);
    __m512 a = load<S>(srcs[0], i, m);
    for (size_t s = 1; s < n_src; ++s) a = _mm512_add_ps(a, load<S>(srcs[s], i, m));
    if (divide) a = _mm512_div_ps(a, d);
    store<D>(dst, i, a, m);
  }
}

}  // namespace

void reduce_sum_avx512(const void* const* srcs, size_t n_src, DType src_type, void* dst, DType dst_type, size_t n,
                       float divisor) {
  for_float_type_pair(src_type, dst_type, [&]<DType S, DType D>() { kernel<S, D>(srcs, n_src, dst, n, divisor); });
}

}  // namespace zs::comm::detail
