// The peak probe's vfmadd231ps zmm loop (memory/detail/peak_kernels.h), compiled for AVX-512.
#include <immintrin.h>

#include "memory/detail/peak_kernels.h"

namespace zs::memory::detail {

uint64_t peak_loop_avx512(int64_t iterations, volatile float& sink) {
  // 16 independent chains: 4-cycle latency x up to 2 FMA ports needs 8; 16 + 2 fit 32 registers.
  constexpr int kChains = 16;
  const __m512 x = _mm512_set1_ps(1.0f + 0x1p-20f);
  const __m512 y = _mm512_set1_ps(1.0f - 0x1p-20f);
  __m512 acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm512_set1_ps(static_cast<float>(j));
  for (int64_t i = 0; i < iterations; ++i) {
    for (int j = 0; j < kChains; ++j) acc[j] = _mm512_fmadd_ps(x, y, acc[j]);
  }
  __m512 total = acc[0];
  for (int j = 1; j < kChains; ++j) total = _mm512_add_ps(total, acc[j]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, total);
  float sum = 0.0f;
  for (float v : lanes) sum += v;
  sink = sum;
  return static_cast<uint64_t>(iterations) * kChains * 16;
}

}  // namespace zs::memory::detail
