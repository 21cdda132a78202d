#include "tp/transformer.h"

#include "core/errors.h"
#include "nn/detail/attention.h"
#include "nn/detail/ops.h"
#include "nn/detail/parallel.h"
#include "nn/detail/pre_norm_block.h"

namespace zs::tp {

using memory::DType;
using memory::Tensor;
using nn::MemoryUse;

// ---- SequenceParallelLayerNorm ----

Tensor SequenceParallelLayerNorm::backward(nn::Context& ctx, const Tensor& dy) {
  ReplicatedGradients replicated(ctx, tp_, {&weight(), &bias()});
  Tensor dx = nn::LayerNorm::backward(ctx, dy);
  replicated.reduce();
  return dx;
}

namespace {

int64_t heads_per_rank(int64_t d_model, int64_t n_head, int parts) {
  ZS_MODEL_CHECK(n_head > 0 && d_model % n_head == 0, "d_model {} not divisible by n_head {}", d_model, n_head);
  ZS_MODEL_CHECK(n_head % parts == 0, "ParallelAttention: {} heads do not split over the tensor-parallel size {}",
                 n_head, parts);
  return n_head / parts;
}

}  // namespace

// ---- ParallelAttention ----

ParallelAttention::ParallelAttention(int64_t d_model, int64_t n_head, TensorParallel tp, float init_std, float proj_std)
    : d_(d_model),
      local_heads_(heads_per_rank(d_model, n_head, tp.size())),
      qkv_(add_child<ColumnParallelLinear>("qkv", d_model, 3 * d_model, tp, true, init_std, /*stride=*/3)),
      proj_(add_child<RowParallelLinear>("proj", d_model, d_model, tp, true, proj_std)),
      first_head_(tp.rank() * local_heads_) {}

Tensor ParallelAttention::forward(nn::Context& ctx, const Tensor& x) {
  ZS_MODEL_CHECK(x.dim() == 3 && x.size(2) == d_, "ParallelAttention: expected (B, T, {}), got {}", d_,
                 memory::shape_string(x.shape()));
  const bool train = ctx.training();
  Tensor qkv = ctx.forward(qkv_, x);  // (B, T, 3C/tp): [q | k | v] of this rank's heads
  compute_dtype_ = qkv_.weight_dtype();
  ZS_MODEL_CHECK(sparsity_ == nullptr || kernel_ == nn::AttentionKernel::kFused,
                 "ParallelAttention: a block-sparse layout needs the fused kernel (the plain one has no sparse path); "
                 "remove model.attention \"plain\" or the sparse_attention section");
  if (kernel_ == nn::AttentionKernel::kFused) {
    const int64_t c = qkv.size(2) / 3, hs = c / local_heads_;
    nn::FusedAttentionSaved saved = nn::fused_attention_forward(ctx, {qkv, 0, local_heads_}, {qkv, c, local_heads_},
                                                                {qkv, 2 * c, local_heads_}, hs, compute_dtype_,
                                                                {sparsity_.get(), first_head_});
    Tensor y = saved.out;
    if (train) {
      qkv_out_ = qkv;
      fused_ = std::move(saved);
    }
    return ctx.forward(proj_, y);
  }
  const bool keep = train && !recompute_scores_;
  Tensor y;
  {
    nn::detail::SingleThreadedBlas blas;
    Tensor probs;
    y = nn::detail::causal_attention_forward(ctx, qkv, local_heads_, nn::detail::gemm_path_for(compute_dtype_), keep,
                                             &probs, blas);
    if (keep) probs_ = probs;
  }
  if (train) qkv_out_ = qkv;
  return ctx.forward(proj_, y);
}

Tensor ParallelAttention::backward(nn::Context& ctx, const Tensor& dout) {
  ZS_ASSERT(qkv_out_.raw() != nullptr, "ParallelAttention backward without saved state");
  Tensor dy = ctx.backward(proj_, dout);  // (B, T, C/tp)
  Tensor dqkv;
  if (kernel_ == nn::AttentionKernel::kFused) {
    const Tensor& qkv = qkv_out_;
    const int64_t c = qkv.size(2) / 3, hs = c / local_heads_, H = local_heads_;
    dqkv = ctx.allocate(qkv.shape(), memory::DType::kF32, nn::MemoryUse::kGradient);
    nn::fused_attention_backward(ctx, {qkv, 0, H}, {qkv, c, H}, {qkv, 2 * c, H}, fused_, dy, hs, compute_dtype_,
                                 {dqkv, 0, H}, {dqkv, c, H}, {dqkv, 2 * c, H}, {sparsity_.get(), first_head_});
  } else {
    nn::detail::SingleThreadedBlas blas;
    nn::detail::AttentionScratch scratch;
    dqkv = nn::detail::causal_attention_backward(ctx, qkv_out_, probs_, dy, local_heads_,
                                                 nn::detail::gemm_path_for(compute_dtype_), &scratch, blas);
  }
  clear_own_saved();
  dy = {};
  return ctx.backward(qkv_, dqkv);
}

// ---- ParallelMlp ----

ParallelMlp::ParallelMlp(int64_t d_model, TensorParallel tp, float init_std, float proj_std, int64_t hidden)
    : fc_(add_child<ColumnParallelLinear>("fc", d_model, hidden > 0 ? hidden : 4 * d_model, tp, true, init_std)),
      gelu_(add_child<nn::Gelu>("gelu")),
      proj_(add_child<RowParallelLinear>("proj", hidden > 0 ? hidden : 4 * d_model, d_model, tp, true, proj_std)) {}

Tensor ParallelMlp::forward(nn::Context& ctx, const Tensor& x) {
  Tensor h = ctx.forward(fc_, x);
  h = ctx.forward(gelu_, h);
  return ctx.forward(proj_, h);
}

Tensor ParallelMlp::backward(nn::Context& ctx, const Tensor& dy) {
  Tensor dh = ctx.backward(proj_, dy);
  dh = ctx.backward(gelu_, dh);
  return ctx.backward(fc_, dh);
}

// ---- ParallelBlock ----

nn::LayerNorm& ParallelBlock::add_norm(std::string name, int64_t d, const TensorParallel& tp) {
  // On sequence shards the norm's gradients are partial: summed over the group in its backward.
  if (tp.sharded_sequence()) return add_child<SequenceParallelLayerNorm>(std::move(name), d, tp);
  return add_child<nn::LayerNorm>(std::move(name), d);
}

ParallelBlock::ParallelBlock(int64_t d_model, int64_t n_head, TensorParallel tp, float init_std, float proj_std)
    : ln1_(add_norm("ln1", d_model, tp)),
      attn_(add_child<ParallelAttention>("attn", d_model, n_head, tp, init_std, proj_std)),
      ln2_(add_norm("ln2", d_model, tp)),
      mlp_(add_child<ParallelMlp>("mlp", d_model, tp, init_std, proj_std)) {}

Tensor ParallelBlock::forward(nn::Context& ctx, const Tensor& x) {
  if (dropped_) return nn::detail::dropped_block_forward(ctx, x, ln1_, attn_, ln2_, mlp_);
  return nn::detail::pre_norm_block_forward(ctx, x, ln1_, attn_, ln2_, mlp_);
}

Tensor ParallelBlock::backward(nn::Context& ctx, const Tensor& dy) {
  if (dropped_) return nn::detail::dropped_block_backward(ctx, dy, ln1_, attn_, ln2_, mlp_);
  return nn::detail::pre_norm_block_backward(ctx, dy, ln1_, attn_, ln2_, mlp_);
}

}  // namespace zs::tp
