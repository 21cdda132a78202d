// AVX2 (+F16C) sums for the shared-memory collectives (comm/detail/shm_reduce.h); compiled with -mavx2
// -mf16c (zs_isa_sources) and only called after memory::isa_supported(kAvx2). Whole vectors of 8 only:
// the dispatcher hands the tail to the scalar kernel (same bits).
#include <immintrin.h>

#include <cstdint>

#include "comm/detail/shm_reduce.h"
#include "memory/simd_bf16.h"

namespace zs::comm::detail {
namespace {

using memory::DType;

template <DType S>
inline __m256 load(const void* p, size_t i) {
  if constexpr (S == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(p) + i);
  } else {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i));
    if constexpr (S == DType::kBF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    else return _mm256_cvtph_ps(h);
  }
}

template <DType D>
inline void store(void* p, size_t i, __m256 v) {
  if constexpr (D == DType::kF32) {
    _mm256_storeu_ps(static_cast<float*>(p) + i, v);
  } else if constexpr (D == DType::kBF16) {
    __m256i r = memory::simd::bf16_round(v);  // 8 x 32-bit lanes holding bf16 in the low halves
    __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(p) + i), packed);
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(p) + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

template <DType S, DType D>
void block(const void* const* srcs, size_t n_src, void* dst, size_t i, bool divide, __m256 d) {
  __m256 a = load<S>(srcs[0], i);
  for (size_t s = 1; s < n_src; ++s) a = _mm256_add_ps(a, load<S>(srcs[s], i));
  if (divide) a = _mm256_div_ps(a, d);
  store<D>(dst, i, a);
}

template <DType S, DType D>
void kernel(const void* const* srcs, size_t n_src, void* dst, size_t n, float divisor) {
  const bool divide = divisor != 1.0f;
  const __m256 d = _mm256_set1_ps(divisor);
  for (size_t i = 0; i + 8 <= n; i += 8) block<S, D>(srcs, n_src, dst, i, divide, d);
}

}  // namespace

void reduce_sum_avx2(const void* const* srcs, size_t n_src, DType src_type, void* dst, DType dst_type, size_t n,
                     float divisor) {
  for_float_type_pair(src_type, dst_type, [&]<DType S, DType D>() { kernel<S, D>(srcs, n_src, dst, n, divisor); });
}

}  // namespace zs::comm::detail
