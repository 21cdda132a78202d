// Internal to nn/detail/gemm.cpp: the per-ISA product kernels it dispatches to.
#pragma once

#include <cstdint>

#include "nn/detail/gemm.h"

namespace zs::nn::detail {

// gemm() on path kAvx512Bf16 (gemm_avx512bf16.cpp, compiled with -mavx512bf16): call only where
// memory::cpu_has_avx512_bf16(). Same contract as gemm(), without the kernels-off check.
void gemm_avx512bf16(int64_t m, int64_t n, int64_t k, float alpha, const Matrix& a, const Matrix& b, float beta,
                     float* c, int64_t ldc, const float* bias);

}  // namespace zs::nn::detail
