// AVX-512 forms of the fused LLaMA kernels (nn/detail/fused_ops.h); compiled with -mavx512f/bw/vl/dq
// (zs_isa_sources) and only called after memory::isa_supported(kAvx512).
// GCC 12's AVX-512 intrinsics trip -Wmaybe-uninitialized in the header (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "nn/detail/fused_kernels.h"
#include "nn/detail/fused_loops.h"

namespace zs::nn::detail {
namespace {

struct Avx512Vec {
  using R = __m512;
  static constexpr int64_t kWidth = 16;
  static R load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, R v) { _mm512_storeu_ps(p, v); }
  static R set1(float f) { return _mm512_set1_ps(f); }
  static R add(R a, R b) { return _mm512_add_ps(a, b); }
  static R sub(R a, R b) { return _mm512_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static R div(R a, R b) { return _mm512_div_ps(a, b); }
  static R min(R a, R b) { return _mm512_min_ps(a, b); }
  static R max(R a, R b) { return _mm512_max_ps(a, b); }
  static float hsum(R a) { return _mm512_reduce_add_ps(a); }
  static R pow2_shifted(R t) {
    const __m512i bits = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x4B400000 - 127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(bits, 23));
  }
};

}  // namespace

ZS_NN_FUSED_ENTRY_POINTS(avx512, Avx512Vec)

}  // namespace zs::nn::detail
