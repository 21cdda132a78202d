// Internal: GELU (tanh form) over a range of elements, forward and backward, for nn::Gelu.
//
// Note [gelu kernels]: the loop is Note [fast tanh]'s arithmetic (layers.cpp before this file), which
// the baseline build vectorises 4 wide. On an AVX-512 CPU it now runs 16 wide (gelu_avx512.cpp):
// the same multiplies, adds and divide in the same order, compiled with -ffp-contract=off so no
// multiply-add is fused, and the clamps as compare-and-blend (NaN passes through, as the scalar
// selects let it): the results are the scalar loop's bit for bit (tests/nn/ops_test.cpp compares
// them over a sweep and the special values). The profile of the large GPT gave GELU 2.9% of an fp32
// and 3.9% of a bf16 step's CPU (docs/benchmarks.md, "Where np 1's step goes").
#pragma once

#include <cstdint>

#include "memory/cpu_features.h"

namespace zs::nn::detail {

inline constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluCubic = 0.044715f;
inline constexpr float kTanhClamp = 7.90531110763549805f;

// Note [fast tanh]: std::tanh is a scalar libm call (~20 ns) and made GELU cost as much as all the
// block's matmuls. This is Eigen's rational approximation (generic_fast_tanh_float, a 13/6
// minimax fit on [-7.9, 7.9], a few ulp from tanh; beyond the clamp tanh is +-1 in fp32): plain
// arithmetic that GCC vectorises. The double-precision reference tests hold it to 1e-4 relative.
inline float fast_tanh(float x) {
  x = x > kTanhClamp ? kTanhClamp : x;  // two plain selects: GCC if-converts them (a nested ?: it does not)
  x = x < -kTanhClamp ? -kTanhClamp : x;
  const float x2 = x * x;
  float p = x2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
  p = p * x2 + -8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  p = p * x;
  float q = x2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  return p / q;
}

// y[i] = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) for i in [i0, i1).
void gelu_forward(const float* x, int64_t i0, int64_t i1, float* y, memory::IsaLevel isa = memory::best_isa());
// dx[i] = dy[i] * GELU'(x[i]) for i in [i0, i1).
void gelu_backward(const float* x, const float* dy, int64_t i0, int64_t i1, float* dx,
                   memory::IsaLevel isa = memory::best_isa());

// The AVX-512 forms (gelu_avx512.cpp): call only where memory::isa_supported(kAvx512).
void gelu_forward_avx512(const float* x, int64_t i0, int64_t i1, float* y);
void gelu_backward_avx512(const float* x, const float* dy, int64_t i0, int64_t i1, float* dx);

}  // namespace zs::nn::detail
