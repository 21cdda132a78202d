// The AVX-512 GELU loops (nn/detail/gelu.h, Note [gelu kernels]): the scalar loops' operations in
// their order, 16 lanes at a time; compiled with -mavx512f and -ffp-contract=off (nn/CMakeLists.txt)
// and only called after memory::isa_supported(kAvx512). The tail runs the scalar loop.
// GCC 12's AVX-512 intrinsics trip -Wmaybe-uninitialized in the header (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "nn/detail/gelu.h"

namespace zs::nn::detail {
namespace {

inline __m512 set1(float f) { return _mm512_set1_ps(f); }
inline __m512 mul(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
inline __m512 add(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }

// fast_tanh, lane by lane. The clamps are the scalar selects: a lane takes the bound only where the
// comparison holds, so NaN stays NaN (min/max would turn it into the bound).
inline __m512 tanh16(__m512 x) {
  x = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, set1(kTanhClamp), _CMP_GT_OQ), x, set1(kTanhClamp));
  x = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, set1(-kTanhClamp), _CMP_LT_OQ), x, set1(-kTanhClamp));
  const __m512 x2 = mul(x, x);
  __m512 p = add(mul(x2, set1(-2.76076847742355e-16f)), set1(2.00018790482477e-13f));
  p = add(mul(p, x2), set1(-8.60467152213735e-11f));
  p = add(mul(p, x2), set1(5.12229709037114e-08f));
  p = add(mul(p, x2), set1(1.48572235717979e-05f));
  p = add(mul(p, x2), set1(6.37261928875436e-04f));
  p = add(mul(p, x2), set1(4.89352455891786e-03f));
  p = mul(p, x);
  __m512 q = add(mul(x2, set1(1.19825839466702e-06f)), set1(1.18534705686654e-04f));
  q = add(mul(q, x2), set1(2.26843463243900e-03f));
  q = add(mul(q, x2), set1(4.89352518554385e-03f));
  return _mm512_div_ps(p, q);
}

// kGeluScale * (v + kGeluCubic * v * v * v), evaluated left to right as the scalar expression is.
inline __m512 gelu_arg(__m512 v) {
  return mul(set1(kGeluScale), add(v, mul(mul(mul(set1(kGeluCubic), v), v), v)));
}

}  // namespace

void gelu_forward_avx512(const float* x, int64_t i0, int64_t i1, float* y) {
  int64_t i = i0;
  for (; i + 16 <= i1; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m512 t = tanh16(gelu_arg(v));
    _mm512_storeu_ps(y + i, mul(mul(set1(0.5f), v), add(set1(1.0f), t)));  // 0.5f * v * (1.0f + t)
  }
  gelu_forward(x, i, i1, y, memory::IsaLevel::kScalar);
}

void gelu_backward_avx512(const float* x, const float* dy, int64_t i0, int64_t i1, float* dx) {
  constexpr float k3c = 3.0f * kGeluCubic;  // the scalar expression's first product, folded in fp32 as GCC does
  int64_t i = i0;
  for (; i + 16 <= i1; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m512 t = tanh16(gelu_arg(v));
    const __m512 du = mul(set1(kGeluScale), add(set1(1.0f), mul(mul(set1(k3c), v), v)));
    const __m512 a = mul(set1(0.5f), add(set1(1.0f), t));                                   // 0.5f * (1.0f + t)
    // 0.5f * v * (1.0f - t * t) * du
    const __m512 b = mul(mul(mul(set1(0.5f), v), _mm512_sub_ps(set1(1.0f), mul(t, t))), du);
    _mm512_storeu_ps(dx + i, mul(_mm512_loadu_ps(dy + i), add(a, b)));
  }
  gelu_backward(x, dy, i, i1, dx, memory::IsaLevel::kScalar);
}

}  // namespace zs::nn::detail
