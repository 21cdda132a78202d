// Megatron-LM's tensor-parallel linear layers (megatron/core/tensor_parallel/layers.py): y = x W^T + b
// with W (out, in) split over the ranks of a tensor-parallel group.
//
//   tp::TensorParallel tp{.group = &topology.tensor_parallel()};
//   auto& fc = add_child<tp::ColumnParallelLinear>("fc", d, 4 * d, tp);    // weight (4d/tp, d)
//   auto& proj = add_child<tp::RowParallelLinear>("proj", 4 * d, d, tp);  // weight (d, 4d/tp)
//   Tensor y = ctx.forward(proj, ctx.forward(gelu, ctx.forward(fc, x)));  // x, y (B, T, d) on every rank
//
// ColumnParallelLinear: rank r holds rows [r out/tp, (r + 1) out/tp) of W and b (with stride s: that
// piece of each of s equal blocks of rows, Megatron's partition_stride; the fused qkv has s = 3) and
// computes its columns of y: x (..., in) whole on every rank -> y (..., out/tp). Backward: dx is the sum
// of every rank's dy_r W_r (an all-reduce: Megatron's copy_to_tensor_model_parallel_region).
// RowParallelLinear: rank r holds columns [r in/tp, (r + 1) in/tp) of W, takes its piece of x (..., in/tp)
// (what a column layer before it produced) and y = sum over ranks of x_r W_r^T (an all-reduce:
// reduce_from_tensor_model_parallel_region), then + b: the bias is whole on every rank, added once
// after the sum. Backward needs no communication.
//
// Sequence parallelism (TensorParallel::sequence_parallel, tp/mappings.h): a column layer's input is
// this rank's sequence shard (B, T/tp, in), all-gathered before the product (and again in the
// backward, so only the shard is kept), and its dx is reduce-scattered back to shards; a row layer's
// output is reduce-scattered to (B, T/tp, out) instead of all-reduced, its bias gradient summed over the
// group (Note [replicated gradients of sequence shards]).
//
// Parameters keep the names and initialisation of nn::Linear ("weight" normal(0, init_std), "bias"
// zeros, tagged no_weight_decay): each sliced parameter carries its nn::TensorSlice (Note [tensor
// slices] in nn/parameter.h), so it initialises, checkpoints and names itself as its slice of the tp = 1
// model's tensor. Products are nn::Linear's (nn/detail/linear.h), bf16 weights included; with tp = 1
// both layers compute what nn::Linear does.
#pragma once

#include <cstdint>

#include "memory/tensor.h"
#include "nn/module.h"
#include "tp/mappings.h"

namespace zs::tp {

class ColumnParallelLinear : public nn::Module {
 public:
  // out_features (the full layer's) divisible by tp.size() * stride: ModelError otherwise.
  // padded_out > out_features (stride 1): the outputs are padded to padded_out (a multiple of
  // tp.size(); a padded vocabulary's head, tp::padded_vocab_size): padded_out / tp rows of the weight
  // per rank, the padding zeros, whose outputs the model keeps out of its results (Note [padded
  // vocabulary] in tp/cross_entropy.h).
  ColumnParallelLinear(int64_t in_features, int64_t out_features, TensorParallel tp, bool bias = true,
                       float init_std = 0.02f, int stride = 1, int64_t padded_out = 0);
  std::string_view type_name() const override { return "ColumnParallelLinear"; }

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }                    // the full layer's (padded_out if padded)
  int64_t local_out_features() const { return out_ / tp_.size(); }  // this rank's
  const TensorParallel& tensor_parallel() const { return tp_; }
  nn::Parameter& weight() { return weight_; }
  nn::Parameter* bias() { return bias_; }
  memory::DType weight_dtype() const { return weight_dtype_; }  // as nn::Linear::weight_dtype

 protected:
  memory::Tensor forward(nn::Context& ctx, const memory::Tensor& x) override;   // (..., in) -> (..., out/tp)
  memory::Tensor backward(nn::Context& ctx, const memory::Tensor& dy) override;
  void clear_own_saved() override { input_ = {}; }

 private:
  int64_t in_;
  int64_t out_;
  TensorParallel tp_;
  nn::Parameter& weight_;
  nn::Parameter* bias_ = nullptr;
  memory::Tensor input_;  // as given: the sequence shard with sequence parallelism
  memory::DType weight_dtype_ = memory::DType::kF32;
};

class RowParallelLinear : public nn::Module {
 public:
  // in_features (the full layer's) divisible by tp.size(): ModelError otherwise.
  RowParallelLinear(int64_t in_features, int64_t out_features, TensorParallel tp, bool bias = true,
                    float init_std = 0.02f);
  std::string_view type_name() const override { return "RowParallelLinear"; }

  int64_t in_features() const { return in_; }  // the full layer's
  int64_t local_in_features() const { return in_ / tp_.size(); }
  int64_t out_features() const { return out_; }
  const TensorParallel& tensor_parallel() const { return tp_; }
  nn::Parameter& weight() { return weight_; }
  nn::Parameter* bias() { return bias_; }
  memory::DType weight_dtype() const { return weight_dtype_; }

 protected:
  memory::Tensor forward(nn::Context& ctx, const memory::Tensor& x) override;   // (..., in/tp) -> (..., out)
  memory::Tensor backward(nn::Context& ctx, const memory::Tensor& dy) override;
  void clear_own_saved() override { input_ = {}; }

 private:
  int64_t in_;
  int64_t out_;
  TensorParallel tp_;
  nn::Parameter& weight_;
  nn::Parameter* bias_ = nullptr;
  memory::Tensor input_;
  memory::DType weight_dtype_ = memory::DType::kF32;
};

}  // namespace zs::tp
