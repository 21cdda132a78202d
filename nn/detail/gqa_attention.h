// Internal: causal grouped-query attention for nn::GqaAttention, the one place its attention is
// computed (so the fused flash-attention kernel replaces these two functions and nothing else).
// Today: the kv heads are expanded into nn/detail/attention.h's packed qkv layout and the plain
// causal kernels run on it; the backward sums the expanded heads' dk, dv back per kv head.
#pragma once

#include <cstdint>

#include "memory/tensor.h"
#include "nn/context.h"
#include "nn/detail/gemm.h"

namespace zs::nn::detail {

// What the backward needs, kept by the caller between the passes.
struct GqaSaved {
  memory::Tensor qkv;    // the packed, expanded (B, T, 3 * n_head * hs)
  memory::Tensor probs;  // P (B, n_head, T, T), or undefined: recomputed in backward
};

// q (B, T, n_head * hs), k and v (B, T, n_kv_head * hs), rotary embedding applied; query head h reads
// kv head h / (n_head / n_kv_head). Returns y (B, T, n_head * hs) kActivation. `saved` (training
// only; nullptr in eval): filled for the backward, P kept unless keep_probs is false.
memory::Tensor gqa_attention_forward(Context& ctx, const memory::Tensor& q, const memory::Tensor& k,
                                     const memory::Tensor& v, int64_t n_head, int64_t n_kv_head, GemmPath path,
                                     bool keep_probs, GqaSaved* saved);

// dy (B, T, n_head * hs) -> dq (B, T, n_head * hs), dk and dv (B, T, n_kv_head * hs), kGradient.
void gqa_attention_backward(Context& ctx, const GqaSaved& saved, const memory::Tensor& dy, int64_t n_head,
                            int64_t n_kv_head, GemmPath path, memory::Tensor* dq, memory::Tensor* dk,
                            memory::Tensor* dv);

}  // namespace zs::nn::detail
