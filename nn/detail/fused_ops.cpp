// The scalar forms of the fused LLaMA kernels and the run-time choice among the ISA forms
// (nn/detail/fused_ops.h).
#include "nn/detail/fused_ops.h"

#include <cmath>

#include "nn/detail/fused_kernels.h"
#include "nn/detail/fused_loops.h"

namespace zs::nn::detail {

ZS_NN_FUSED_ENTRY_POINTS(scalar, ScalarVec)

using memory::IsaLevel;

// Each entry point takes the widest form the caller allows (best_isa() by default; tests pass each
// supported level).
#define ZS_NN_DISPATCH(name, ...)                                         \
  switch (isa) {                                                          \
    case IsaLevel::kAvx512: return name##_avx512(__VA_ARGS__);            \
    case IsaLevel::kAvx2: return name##_avx2(__VA_ARGS__);                \
    case IsaLevel::kScalar: return name##_scalar(__VA_ARGS__);            \
  }

void rms_norm_forward(const float* x, const float* w, int64_t r0, int64_t r1, int64_t d, float eps, float* y,
                      float* rstd, IsaLevel isa) {
  ZS_NN_DISPATCH(rms_norm_forward, x, w, r0, r1, d, eps, y, rstd)
}

void rms_norm_backward(const float* dy, const float* x, const float* w, const float* rstd, int64_t r0, int64_t r1,
                       int64_t d, float* dx, IsaLevel isa) {
  ZS_NN_DISPATCH(rms_norm_backward, dy, x, w, rstd, r0, r1, d, dx)
}

void rms_norm_weight_grad(const float* dy, const float* x, const float* rstd, int64_t rows, int64_t d, int64_t c0,
                          int64_t c1, float* dw, IsaLevel isa) {
  ZS_NN_DISPATCH(rms_norm_weight_grad, dy, x, rstd, rows, d, c0, c1, dw)
}

void swiglu_forward(const float* g, const float* u, int64_t i0, int64_t i1, float* h, IsaLevel isa) {
  ZS_NN_DISPATCH(swiglu_forward, g, u, i0, i1, h)
}

void swiglu_backward(const float* dh, const float* g, const float* u, int64_t i0, int64_t i1, float* dg, float* du,
                     IsaLevel isa) {
  ZS_NN_DISPATCH(swiglu_backward, dh, g, u, i0, i1, dg, du)
}

void rope_apply(float* x, int64_t r0, int64_t r1, int64_t row_stride, int64_t seq, int64_t n_head, int64_t hs,
                const float* cos, const float* sin, bool inverse, IsaLevel isa) {
  ZS_NN_DISPATCH(rope_apply, x, r0, r1, row_stride, seq, n_head, hs, cos, sin, inverse)
}

#undef ZS_NN_DISPATCH

void rope_tables(int64_t seq, int64_t hs, double theta, float* cos, float* sin) {
  const int64_t half = hs / 2;
  const float base = static_cast<float>(theta);
  for (int64_t j = 0; j < half; ++j) {
    // fp32 throughout, as torch computes inv_freq and the angles (cos/sin of the rounded angle).
    const float inv_freq = 1.0f / std::pow(base, static_cast<float>(2 * j) / static_cast<float>(hs));
    for (int64_t t = 0; t < seq; ++t) {
      const float angle = static_cast<float>(t) * inv_freq;
      cos[t * half + j] = static_cast<float>(std::cos(static_cast<double>(angle)));
      sin[t * half + j] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
}

}  // namespace zs::nn::detail
