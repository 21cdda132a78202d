// AVX2 forms of the fused LLaMA kernels (nn/detail/fused_ops.h); compiled with -mavx2 -mfma -mf16c
// (zs_isa_sources) and only called after memory::isa_supported(kAvx2).
#include <immintrin.h>

#include "nn/detail/fused_kernels.h"
#include "nn/detail/fused_loops.h"

namespace zs::nn::detail {
namespace {

struct Avx2Vec {
  using R = __m256;
  static constexpr int64_t kWidth = 8;
  static R load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, R v) { _mm256_storeu_ps(p, v); }
  static R set1(float f) { return _mm256_set1_ps(f); }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
  static R sub(R a, R b) { return _mm256_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R div(R a, R b) { return _mm256_div_ps(a, b); }
  static R min(R a, R b) { return _mm256_min_ps(a, b); }
  static R max(R a, R b) { return _mm256_max_ps(a, b); }
  static float hsum(R a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static R pow2_shifted(R t) {
    const __m256i bits = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(0x4B400000 - 127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(bits, 23));
  }
};

}  // namespace

ZS_NN_FUSED_ENTRY_POINTS(avx2, Avx2Vec)

}  // namespace zs::nn::detail
