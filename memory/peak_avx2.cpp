// The peak probe's vfmadd231ps ymm loop (memory/detail/peak_kernels.h), compiled for AVX2 + FMA.
#include <immintrin.h>

#include "memory/detail/peak_kernels.h"

namespace zs::memory::detail {

uint64_t peak_loop_avx2(int64_t iterations, volatile float& sink) {
  // 12 chains + 2 constants stay within the 16 ymm registers (a spill would time loads, not FMAs);
  // 12 covers 4-5 cycles of latency at 2 FMAs per cycle.
  constexpr int kChains = 12;
  const __m256 x = _mm256_set1_ps(1.0f + 0x1p-20f);
  const __m256 y = _mm256_set1_ps(1.0f - 0x1p-20f);
  __m256 acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm256_set1_ps(static_cast<float>(j));
  for (int64_t i = 0; i < iterations; ++i) {
    for (int j = 0; j < kChains; ++j) acc[j] = _mm256_fmadd_ps(x, y, acc[j]);
  }
  __m256 total = acc[0];
  for (int j = 1; j < kChains; ++j) total = _mm256_add_ps(total, acc[j]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, total);
  float sum = 0.0f;
  for (float v : lanes) sum += v;
  sink = sum;
  return static_cast<uint64_t>(iterations) * kChains * 8;
}

}  // namespace zs::memory::detail
