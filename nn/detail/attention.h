// Internal: the causal attention of nn::CausalSelfAttention between its two linears, on a qkv tensor,
// for every layer that computes it (nn::CausalSelfAttention, and tp::ParallelAttention on the heads
// of one tensor-parallel rank). Note [causal panels] in nn/attention.cpp describes the kernels.
#pragma once

#include <cstdint>

#include "memory/tensor.h"
#include "nn/context.h"
#include "nn/detail/gemm.h"
#include "nn/detail/parallel.h"

namespace zs::nn::detail {

// qkv (B, T, 3C): per token [q | k | v], head h at columns h*hs.. of each, hs = C / n_head. Returns y
// (B, T, C) kActivation, head h at columns h*hs... keep_probs: *probs is P (B, n_head, T, T), a
// kActivation tensor to save for the backward; otherwise *probs is the kernels' scratch (one T x T panel
// per thread), not for the backward (it recomputes P from qkv: the selective recompute). A caller
// decides when the scratch goes: nn::CausalSelfAttention drops it after its proj, as it always has, so
// the memory peaks stay what they were. `blas`, held by the caller, keeps OpenBLAS single-threaded while
// the heads run in parallel, each product on one thread (Note [compute threads] in nn/detail/parallel.h).
// nn::CausalSelfAttention holds it across its proj's forward and its qkv's backward, as it always has.
memory::Tensor causal_attention_forward(Context& ctx, const memory::Tensor& qkv, int64_t n_head, GemmPath path,
                                        bool keep_probs, memory::Tensor* probs, const SingleThreadedBlas& blas);

// The backward's scratch, handed to the caller to drop (as *probs of the forward).
struct AttentionScratch {
  memory::Tensor a, b;
};

// The backward for dy (B, T, C) with the forward's qkv and saved P (undefined: recomputed from qkv):
// returns dqkv (B, T, 3C) kGradient.
memory::Tensor causal_attention_backward(Context& ctx, const memory::Tensor& qkv, const memory::Tensor& probs,
                                         const memory::Tensor& dy, int64_t n_head, GemmPath path,
                                         AttentionScratch* scratch, const SingleThreadedBlas& blas);

}  // namespace zs::nn::detail
