// The scalar GELU loops and the choice of form (nn/detail/gelu.h, Note [gelu kernels]).
#include "nn/detail/gelu.h"

namespace zs::nn::detail {

void gelu_forward(const float* x, int64_t i0, int64_t i1, float* y, memory::IsaLevel isa) {
  if (isa == memory::IsaLevel::kAvx512) return gelu_forward_avx512(x, i0, i1, y);
  for (int64_t i = i0; i < i1; ++i) {
    const float v = x[i];
    const float u = kGeluScale * (v + kGeluCubic * v * v * v);
    y[i] = 0.5f * v * (1.0f + fast_tanh(u));
  }
}

void gelu_backward(const float* x, const float* dy, int64_t i0, int64_t i1, float* dx, memory::IsaLevel isa) {
  if (isa == memory::IsaLevel::kAvx512) return gelu_backward_avx512(x, dy, i0, i1, dx);
  for (int64_t i = i0; i < i1; ++i) {
    const float v = x[i];
    const float u = kGeluScale * (v + kGeluCubic * v * v * v);
    const float t = fast_tanh(u);
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
}

}  // namespace zs::nn::detail
