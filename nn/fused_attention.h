// Fused causal attention: softmax(q k^T / sqrt(head_dim)) v, block by block with an online softmax
// (FlashAttention's algorithm on the CPU), never holding the T x T scores. The forward saves the output
// and each row's log-sum-exp; the backward recomputes the scores block by block from them. Grouped-query
// attention is native: q has n_head heads, k and v n_kv_head heads (n_kv_head divides n_head; query
// head h reads kv head h / (n_head / n_kv_head), as Hugging Face's repeat_kv).
//
//   // GPT's packed qkv (B, T, 3C), H heads of hd = C / H: views, no copies
//   auto s = nn::fused_attention_forward(ctx, {qkv, 0, H}, {qkv, C, H}, {qkv, 2 * C, H}, hd, DType::kF32);
//   y = proj(s.out);                                      // s.out (B, T, H * hd)
//   ...
//   Tensor dqkv = ctx.allocate(qkv.shape(), DType::kF32, MemoryUse::kGradient);
//   nn::fused_attention_backward(ctx, {qkv, 0, H}, {qkv, C, H}, {qkv, 2 * C, H}, s, dy, hd, DType::kF32,
//                                {dqkv, 0, H}, {dqkv, C, H}, {dqkv, 2 * C, H});
//
// Numbers: fp32 accumulation throughout; compute = kBF16 rounds the operands of the products to bf16
// as nn::Linear's bf16 products do (nn/detail/gemm.h, Note [bf16 products]). The results differ from
// the plain attention (nn::CausalSelfAttention with AttentionKernel::kPlain) in summation order only:
// fp32 within ~1e-6 relative, bf16 within bf16 rounding. The kernels are chosen once per process by
// memory::best_isa() (AVX-512, AVX2 or scalar), and work is spread over the rank's compute threads
// (nn/detail/parallel.h): results do not depend on the thread count. Note [fused attention] in
// fused_attention.cpp has the algorithm and blocking.
#pragma once

#include <cstdint>

#include "memory/tensor.h"
#include "nn/context.h"
#include "nn/sparse_attention.h"

namespace zs::nn {

// Heads inside a (B, T, W) activation: head h of token t in batch row b is the head_dim elements at
// tensor[b, t, col + h * head_dim ...]. `tensor` is contiguous; fp32 or bf16 for q, k, v; fp32 for
// gradients.
struct AttentionHeads {
  memory::Tensor tensor;
  int64_t col = 0;
  int64_t heads = 0;
};

// What the forward saves for the backward: out (B, T, n_head * head_dim) fp32 kActivation (the
// attention's output; an output projection saves it anyway) and lse (B, n_head, T) fp32 kActivation,
// the log-sum-exp of each row's scaled scores.
struct FusedAttentionSaved {
  memory::Tensor out;
  memory::Tensor lse;
};

// compute: the projection's weight_dtype(): kBF16 takes bf16 products, any other (fp32, fp16) fp32
// products, as nn::Linear chooses (nn/detail/gemm.h). sparsity: a block-sparse layout
// (nn/sparse_attention.h) whose masked tiles are skipped; none: the dense causal attention. Throws
// ModelError for views that do not fit (shapes, head counts, dtypes), naming the operand.
FusedAttentionSaved fused_attention_forward(Context& ctx, const AttentionHeads& q, const AttentionHeads& k,
                                            const AttentionHeads& v, int64_t head_dim, memory::DType compute,
                                            const BlockSparsity& sparsity = {});

// dout (B, T, n_head * head_dim) fp32 contiguous. Overwrites the heads' columns of dq, dk, dv (fp32
// tensors the caller allocated; their other columns are not touched). Its scratch (O(T) per thread,
// plus n_head * T * head_dim for dk, dv under grouped-query attention) is freed before it returns.
// sparsity: the forward's.
void fused_attention_backward(Context& ctx, const AttentionHeads& q, const AttentionHeads& k, const AttentionHeads& v,
                              const FusedAttentionSaved& saved, const memory::Tensor& dout, int64_t head_dim,
                              memory::DType compute, const AttentionHeads& dq, const AttentionHeads& dk,
                              const AttentionHeads& dv, const BlockSparsity& sparsity = {});

}  // namespace zs::nn
