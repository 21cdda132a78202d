// Megatron-LM's tensor-parallel transformer pieces (megatron/core/transformer: the attention with its
// heads split, the MLP, the pre-LN block), with nn's names, initialisation and arithmetic: each is its
// nn/transformer.h counterpart with the linears replaced by tp/linear.h's.
//
//   ParallelAttention: qkv = ColumnParallelLinear(C, 3C, stride 3), proj = RowParallelLinear(C, C).
//     Rank r computes heads [r H/tp, (r + 1) H/tp): stride 3 gives it the q, k and v rows of exactly its
//     heads, so its qkv output (B, T, 3C/tp) is nn's [q | k | v] layout for those heads and nn's
//     attention kernels (nn/fused_attention.h, or the plain nn/detail/attention.h when set_kernel says
//     so, as nn::CausalSelfAttention) run on it unchanged; proj sums the heads' outputs.
//   ParallelMlp: fc = ColumnParallelLinear(C, H), gelu, proj = RowParallelLinear(H, C) (H = 4C).
//   ParallelBlock: x1 = x + attn(ln1(x)), y = x1 + mlp(ln2(x1)), children ln1, attn, ln2, mlp.
//   SequenceParallelLayerNorm: nn::LayerNorm whose weight and bias gradients are summed over the
//     group when it runs on sequence shards (Note [replicated gradients of sequence shards]).
// Without sequence parallelism a block's input and output are whole (B, T, C) on every rank and each
// block runs two all-reduces forward (after attn.proj, mlp.proj) and two backward (before attn.qkv,
// mlp.fc): Megatron's four per layer. With it they are (B, T/tp, C) sequence shards, the layer norms
// and residual adds run on the shard, and each all-reduce is an all-gather plus a reduce-scatter.
// n_head and the MLP width must be divisible by tp (ModelError; tp::validate names the config keys).
// Activation recomputation (Module::set_recomputed) works as for nn's: a re-run repeats the
// collectives, on every rank of the group alike.
#pragma once

#include <cstdint>
#include <string>

#include "memory/tensor.h"
#include "nn/attention.h"
#include "nn/fused_attention.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "tp/linear.h"
#include "tp/mappings.h"

namespace zs::tp {

class SequenceParallelLayerNorm : public nn::LayerNorm {
 public:
  SequenceParallelLayerNorm(int64_t dim, TensorParallel tp, float eps = 1e-5f) : nn::LayerNorm(dim, eps), tp_(tp) {}
  std::string_view type_name() const override { return "SequenceParallelLayerNorm"; }

 protected:
  memory::Tensor backward(nn::Context& ctx, const memory::Tensor& dy) override;

 private:
  TensorParallel tp_;
};

class ParallelAttention : public nn::Module {
 public:
  ParallelAttention(int64_t d_model, int64_t n_head, TensorParallel tp, float init_std = 0.02f, float proj_std = 0.02f);
  std::string_view type_name() const override { return "ParallelAttention"; }
  ColumnParallelLinear& qkv() { return qkv_; }
  RowParallelLinear& proj() { return proj_; }
  // Selective recompute of the scores, as nn::CausalSelfAttention::set_recompute_scores.
  void set_recompute_scores(bool on) { recompute_scores_ = on; }
  bool recompute_scores() const { return recompute_scores_; }
  // The attention kernel, as nn::CausalSelfAttention::set_kernel (fused by default).
  void set_kernel(nn::AttentionKernel k) { kernel_ = k; }
  nn::AttentionKernel kernel() const { return kernel_; }
  // As nn::CausalSelfAttention::set_sparsity: the layout of all n_head heads; this rank's heads are
  // rank * n_head / tp onwards.
  void set_sparsity(std::shared_ptr<const nn::SparseLayout> layout) { sparsity_ = std::move(layout); }

 protected:
  memory::Tensor forward(nn::Context& ctx, const memory::Tensor& x) override;
  memory::Tensor backward(nn::Context& ctx, const memory::Tensor& dy) override;
  void clear_own_saved() override {
    qkv_out_ = probs_ = {};
    fused_ = {};
  }

 private:
  int64_t d_;
  int64_t local_heads_;
  ColumnParallelLinear& qkv_;
  RowParallelLinear& proj_;
  memory::Tensor qkv_out_;  // (B, T, 3C/tp)
  memory::Tensor probs_;    // plain: (B, H/tp, T, T)
  nn::FusedAttentionSaved fused_;  // fused: y and the log-sum-exp
  memory::DType compute_dtype_ = memory::DType::kF32;
  bool recompute_scores_ = false;
  nn::AttentionKernel kernel_ = nn::AttentionKernel::kFused;
  std::shared_ptr<const nn::SparseLayout> sparsity_;
  int64_t first_head_ = 0;  // this rank's first head of the model's n_head
};

class ParallelMlp : public nn::Module {
 public:
  // hidden: H, 0 for 4 * d_model.
  ParallelMlp(int64_t d_model, TensorParallel tp, float init_std = 0.02f, float proj_std = 0.02f, int64_t hidden = 0);
  std::string_view type_name() const override { return "ParallelMlp"; }

 protected:
  memory::Tensor forward(nn::Context& ctx, const memory::Tensor& x) override;
  memory::Tensor backward(nn::Context& ctx, const memory::Tensor& dy) override;

 private:
  ColumnParallelLinear& fc_;
  nn::Gelu& gelu_;
  RowParallelLinear& proj_;
};

class ParallelBlock : public nn::Module {
 public:
  ParallelBlock(int64_t d_model, int64_t n_head, TensorParallel tp, float init_std = 0.02f, float proj_std = 0.02f);
  std::string_view type_name() const override { return "ParallelBlock"; }
  ParallelAttention& attention() { return attn_; }
  // As nn::Block::set_dropped (nn/transformer.h).
  void set_dropped(bool dropped) { dropped_ = dropped; }

 protected:
  memory::Tensor forward(nn::Context& ctx, const memory::Tensor& x) override;
  memory::Tensor backward(nn::Context& ctx, const memory::Tensor& dy) override;

 private:
  nn::LayerNorm& add_norm(std::string name, int64_t d, const TensorParallel& tp);
  nn::LayerNorm& ln1_;
  ParallelAttention& attn_;
  nn::LayerNorm& ln2_;
  ParallelMlp& mlp_;
  bool dropped_ = false;
};

}  // namespace zs::tp
