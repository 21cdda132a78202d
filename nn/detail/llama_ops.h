// Internal: the LLaMA layers' computations between their linears, shared by nn::GqaAttention and
// nn::SwiGluMlp (nn/llama.h) and their tensor-parallel forms (tp/llama.h), which run them on the heads
// and MLP columns of one rank.
//
// The attention is one function pair, gqa_attention_forward/backward: the one place it is computed. It
// runs the fused flash-attention kernel (nn/fused_attention.h) with native grouped-query attention: the
// kv heads are read in place (never expanded to n_head) and neither the expanded k, v nor the T x T
// probabilities are stored.
#pragma once

#include <cstdint>
#include <vector>

#include "memory/tensor.h"
#include "nn/context.h"
#include "nn/fused_attention.h"

namespace zs::nn::detail {

// The rotary embedding's cos/sin tables (max_seq_len, hs / 2) (rope_tables in nn/detail/fused_ops.h).
struct RopeTables {
  RopeTables(int64_t max_seq_len, int64_t head_size, double theta);
  int64_t max_seq_len, hs;
  std::vector<float> cos, sin;
};

// What the attention's backward needs, kept by the caller between the passes: the kernel's inputs
// (the projections' outputs after the rotary embedding) and what it saved (out and lse).
struct GqaSaved {
  memory::Tensor q, k, v;
  memory::Tensor out, lse;
};

// q (B, T, n_head * hs), k and v (B, T, n_kv_head * hs), rotary embedding applied; query head h reads
// kv head h / (n_head / n_kv_head). compute: the projections' weight_dtype() (fused_attention_forward).
// Returns y (B, T, n_head * hs) kActivation. `saved` (training only; nullptr in eval): filled for the
// backward.
// sparsity: a block-sparse layout (nn/sparse_attention.h), as fused_attention_forward's.
memory::Tensor gqa_attention_forward(Context& ctx, const memory::Tensor& q, const memory::Tensor& k,
                                     const memory::Tensor& v, int64_t n_head, int64_t n_kv_head,
                                     memory::DType compute, GqaSaved* saved, const BlockSparsity& sparsity);

// dy (B, T, n_head * hs) -> dq (B, T, n_head * hs), dk and dv (B, T, n_kv_head * hs), kGradient.
void gqa_attention_backward(Context& ctx, const GqaSaved& saved, const memory::Tensor& dy, int64_t n_head,
                            int64_t n_kv_head, memory::DType compute, memory::Tensor* dq, memory::Tensor* dk,
                            memory::Tensor* dv, const BlockSparsity& sparsity);

// The rotary embedding in place on q (B, T, n_head * hs) and k (B, T, n_kv_head * hs) (the projections'
// fresh outputs); inverse: its backward, on dq and dk.
void rope_in_place(const RopeTables& rope, const memory::Tensor& q, const memory::Tensor& k, int64_t n_head,
                   int64_t n_kv_head, bool inverse);

// h = silu(g) * u (kActivation), and its backward into fresh dg, du (kGradient).
memory::Tensor swiglu(Context& ctx, const memory::Tensor& g, const memory::Tensor& u);
void swiglu_grad(Context& ctx, const memory::Tensor& dh, const memory::Tensor& g, const memory::Tensor& u,
                 memory::Tensor* dg, memory::Tensor* du);

}  // namespace zs::nn::detail
