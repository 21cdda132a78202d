// Internal: the per-ISA entry points behind nn/detail/fused_ops.h (defined by ZS_NN_FUSED_ENTRY_POINTS
// in nn/detail/fused_loops.h). The avx2/avx512 ones live in files compiled with their ISA flags: call
// them only where memory::isa_supported() says so.
#pragma once

#include <cstdint>

namespace zs::nn::detail {

#define ZS_NN_FUSED_DECLARE(isa)                                                                                     \
  void rms_norm_forward_##isa(const float* x, const float* w, int64_t r0, int64_t r1, int64_t d, float eps, float* y, \
                              float* rstd);                                                                         \
  void rms_norm_backward_##isa(const float* dy, const float* x, const float* w, const float* rstd, int64_t r0,     \
                               int64_t r1, int64_t d, float* dx);                                                   \
  void rms_norm_weight_grad_##isa(const float* dy, const float* x, const float* rstd, int64_t rows, int64_t d,      \
                                  int64_t c0, int64_t c1, float* dw);                                               \
  void swiglu_forward_##isa(const float* g, const float* u, int64_t i0, int64_t i1, float* h);                     \
  void swiglu_backward_##isa(const float* dh, const float* g, const float* u, int64_t i0, int64_t i1, float* dg,   \
                             float* du);                                                                            \
  void rope_apply_##isa(float* x, int64_t r0, int64_t r1, int64_t row_stride, int64_t seq, int64_t n_head,         \
                        int64_t hs, const float* cos, const float* sin, bool inverse);

ZS_NN_FUSED_DECLARE(scalar)
ZS_NN_FUSED_DECLARE(avx2)
ZS_NN_FUSED_DECLARE(avx512)

#undef ZS_NN_FUSED_DECLARE

}  // namespace zs::nn::detail
