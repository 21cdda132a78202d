// Internal to nn/fused_attention.cpp: the row-wise parts of the fused attention's blocks (Note [fused
// attention] in fused_attention.cpp), one kernel per instruction set. The block products run in
// detail::gemm; these kernels do the online softmax between them.
//
// A block is `rows` query rows by `cols` key columns of scores at s (row stride ld, already scaled by
// 1/sqrt(head_dim)). Causal mask: row i sees columns j < i + diag (clamped to [0, cols]), where
// diag = first query position - first key position + 1; masked entries come out as 0.
#pragma once

#include <cstdint>

#include "memory/cpu_features.h"

namespace zs::nn::detail {

struct AttentionRowKernels {
  // Forward: P = exp(S - m_new) in place, with m_new = max(m, row max) per row; l = l * exp(m - m_new)
  // + rowsum(P); m = m_new; the row's output accumulator o (stride ldo, hd columns) scaled by
  // exp(m - m_new). m starts at -inf, l and o at 0. A row that sees no column is left as it was.
  void (*online_softmax)(float* s, int64_t ld, int64_t rows, int64_t cols, int64_t diag, float* m, float* l, float* o,
                         int64_t ldo, int64_t hd);
  // Backward: P = exp(S - lse) in place (the forward's P, from its log-sum-exp), and dS = P (dP - d)
  // in place of dP (row stride ld too), d the row's rowsum(dO * O).
  void (*softmax_grad)(float* s, float* dp, int64_t ld, int64_t rows, int64_t cols, int64_t diag, const float* lse,
                       const float* d);
};

// The kernels of `isa` (memory::isa_supported(isa) must hold).
const AttentionRowKernels& attention_row_kernels(memory::IsaLevel isa);

AttentionRowKernels attention_row_kernels_scalar();
AttentionRowKernels attention_row_kernels_avx2();    // attention_rows_avx2.cpp, -mavx2 -mfma
AttentionRowKernels attention_row_kernels_avx512();  // attention_rows_avx512.cpp, -mavx512f...

}  // namespace zs::nn::detail
