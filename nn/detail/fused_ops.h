// Internal: the LLaMA layers' fused elementwise kernels (MindSpeed's fused RMSNorm, SwiGLU and rotary
// embedding), each one pass over its rows with its own backward, in AVX-512, AVX2 and scalar forms
// chosen at run time (memory::best_isa(); tests pass every supported IsaLevel). One implementation,
// nn/detail/fused_loops.h, is compiled once per ISA (fused_ops_avx512.cpp, fused_ops_avx2.cpp,
// fused_ops.cpp); the vector forms differ from the scalar one only in summation order and FMA
// contraction. The kernels work on a range of rows so callers spread them with detail::parallel_for
// (which also turns them off in a measuring run, Note [measuring run]); every sum stays inside one
// row or one column, so results do not depend on the thread count.
//
// All pointers are fp32, row-major, and must not alias unless stated.
#pragma once

#include <cstdint>

#include "memory/cpu_features.h"

namespace zs::nn::detail {

// RMSNorm (LLaMA): y = w * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps), over rows [r0, r1) of length d.
// Writes y and rstd[r] (saved for the backward).
void rms_norm_forward(const float* x, const float* w, int64_t r0, int64_t r1, int64_t d, float eps, float* y,
                      float* rstd, memory::IsaLevel isa = memory::best_isa());
// dx for rows [r0, r1): dx = rstd * (g - xhat * mean(g * xhat)), g = dy * w, xhat = x * rstd.
void rms_norm_backward(const float* dy, const float* x, const float* w, const float* rstd, int64_t r0, int64_t r1,
                       int64_t d, float* dx, memory::IsaLevel isa = memory::best_isa());
// dw[c] += sum over rows r < rows of dy[r, c] * x[r, c] * rstd[r], for columns [c0, c1), rows in order.
void rms_norm_weight_grad(const float* dy, const float* x, const float* rstd, int64_t rows, int64_t d, int64_t c0,
                          int64_t c1, float* dw, memory::IsaLevel isa = memory::best_isa());

// SwiGLU (LLaMA's MLP between its linears): h = silu(g) * u, silu(g) = g * sigmoid(g), elements [i0, i1).
void swiglu_forward(const float* g, const float* u, int64_t i0, int64_t i1, float* h,
                    memory::IsaLevel isa = memory::best_isa());
// dg = dh * u * sigmoid(g) * (1 + g * (1 - sigmoid(g))), du = dh * silu(g), elements [i0, i1).
void swiglu_backward(const float* dh, const float* g, const float* u, int64_t i0, int64_t i1, float* dg, float* du,
                     memory::IsaLevel isa = memory::best_isa());

// Rotary position embedding in place, Hugging Face's convention (rotate_half): in each head of hs
// values, element j < hs/2 pairs with j + hs/2 and rotates by the angle pos * theta^(-2j/hs):
//   a' = a cos - b sin,  b' = b cos + a sin              (inverse: the transpose, sin -> -sin)
// Rows [r0, r1) of x, each at x + r * row_stride holding n_head heads of hs (even) values; row r is
// position r % seq. cos/sin: (seq, hs/2) tables (rope_tables). The inverse is the backward.
void rope_apply(float* x, int64_t r0, int64_t r1, int64_t row_stride, int64_t seq, int64_t n_head, int64_t hs,
                const float* cos, const float* sin, bool inverse, memory::IsaLevel isa = memory::best_isa());
// cos/sin (seq, hs/2) as Hugging Face's LlamaRotaryEmbedding computes them in fp32: inv_freq_j =
// 1 / theta^(2j/hs) and angle = pos * inv_freq_j rounded to fp32, then cos and sin of that angle.
void rope_tables(int64_t seq, int64_t hs, double theta, float* cos, float* sin);

}  // namespace zs::nn::detail
