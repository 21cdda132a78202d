// Causal multi-head self-attention (GPT-2), on (B, T, C) activations.
//
//   qkv = x Wqkv^T + bqkv                      (B, T, 3C): per token [q | k | v], head h at columns h*hs..
//   P_bh = softmax(mask(q_bh k_bh^T / sqrt(hs))) (T, T), row i attends to positions j <= i
//   y_bh = P_bh v_bh                           written into (B, T, C) at columns h*hs..
//   out = y Wproj^T + bproj                    (B, T, C)
// Children: qkv = Linear(C, 3C), proj = Linear(C, C). Two kernels compute the attention between them
// (set_kernel; models take it from the config key model.attention):
//  - AttentionKernel::kFused (the default): nn/fused_attention.h, block by block with an online softmax,
//    never holding P. Saves qkv, y (which proj saves anyway) and a log-sum-exp per row
//    (B*n_head*T floats); the backward recomputes the scores block by block.
//  - AttentionKernel::kPlain, the reference: every matmul is an nn::detail::gemm on strided views of
//    qkv (no head-split copies), computing only the causal row panels (Note [causal panels] in
//    attention.cpp); heads run in parallel, each product single-threaded. Saves qkv and P
//    (B*n_head*T*T floats; only the causal panels are written). Selective recompute
//    (set_recompute_scores(true), Megatron's "selective" activation recompute): P is not saved;
//    backward recomputes each row panel's scores and softmax from the saved qkv (the same products on
//    the same operands, so the same P).
// The fused kernel never saves P, so set_recompute_scores changes nothing under it (it is kept so
// configs that ask for selective recompute still run). With bf16 weights both kernels' products take the
// bf16 path as the Linears do (Note [bf16 products]): P, dS and the q/k/v operands are rounded to bf16
// as they are packed (as PyTorch's autocast rounds them). The two agree to fp32 rounding (summation
// order), not bit for bit.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "memory/tensor.h"
#include "nn/fused_attention.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace zs::nn {

enum class AttentionKernel : uint8_t { kFused, kPlain };
std::string_view attention_kernel_name(AttentionKernel k);  // "fused", "plain"

class CausalSelfAttention : public Module {
 public:
  // init_std for qkv.weight, proj_std for proj.weight (GPT-2 scales residual projections).
  CausalSelfAttention(int64_t d_model, int64_t n_head, float init_std = 0.02f, float proj_std = 0.02f);
  std::string_view type_name() const override { return "CausalSelfAttention"; }
  Linear& qkv() { return qkv_; }
  Linear& proj() { return proj_; }
  void set_recompute_scores(bool on) { recompute_scores_ = on; }
  bool recompute_scores() const { return recompute_scores_; }
  // Between steps only (not between a forward and its backward).
  void set_kernel(AttentionKernel k) { kernel_ = k; }
  AttentionKernel kernel() const { return kernel_; }
  // A block-sparse layout (nn/sparse_attention.h, DeepSpeed's sparse_attention) for the fused kernel,
  // whose masked blocks it skips; null (the default): dense causal attention. Between steps only. The
  // plain kernel has no sparse path: a forward with both is a ModelError.
  void set_sparsity(std::shared_ptr<const SparseLayout> layout) { sparsity_ = std::move(layout); }

 protected:
  memory::Tensor forward(Context& ctx, const memory::Tensor& x) override;   // (B, T, C) -> (B, T, C)
  memory::Tensor backward(Context& ctx, const memory::Tensor& dy) override;
  void clear_own_saved() override {
    qkv_out_ = probs_ = {};
    fused_ = {};
  }

 private:
  int64_t d_;
  int64_t n_head_;
  Linear& qkv_;
  Linear& proj_;
  memory::Tensor qkv_out_;  // (B, T, 3C)
  memory::Tensor probs_;    // plain: (B, n_head, T, T): rows' causal panels, zero above the diagonal within them
  FusedAttentionSaved fused_;  // fused: y and the log-sum-exp
  memory::DType compute_dtype_ = memory::DType::kF32;  // qkv's weight dtype in the forward: picks the products
  bool recompute_scores_ = false;
  AttentionKernel kernel_ = AttentionKernel::kFused;
  std::shared_ptr<const SparseLayout> sparsity_;
};

}  // namespace zs::nn
