// The peak probe's vdpbf16ps zmm loop (memory/detail/peak_kernels.h), compiled for AVX512-BF16.
#include <immintrin.h>

#include "memory/detail/peak_kernels.h"

namespace zs::memory::detail {

uint64_t peak_loop_avx512bf16(int64_t iterations, volatile float& sink) {
  constexpr int kChains = 16;  // as the FMA loop: latency 5-6 cycles, at most 2 per cycle
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80);  // bf16 1.0
  const __m512bh y = (__m512bh)_mm512_set1_epi16(0x3f81);  // bf16 1.0078125
  __m512 acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm512_set1_ps(static_cast<float>(j));
  for (int64_t i = 0; i < iterations; ++i) {
    for (int j = 0; j < kChains; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], x, y);
  }
  __m512 total = acc[0];
  for (int j = 1; j < kChains; ++j) total = _mm512_add_ps(total, acc[j]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, total);
  float sum = 0.0f;
  for (float v : lanes) sum += v;
  sink = sum;
  return static_cast<uint64_t>(iterations) * kChains * 32;  // 32 bf16 pairs per instruction
}

}  // namespace zs::memory::detail
