// Where a tensor-parallel layer runs, and Megatron-LM's communication between its pieces
// (megatron/core/tensor_parallel/mappings.py) as plain functions on activations.
//
//   tp::TensorParallel tp{.group = &topology.tensor_parallel(), .sequence_parallel = true};
//   Tensor full = tp::gather_sequence(ctx, tp, shard, nn::MemoryUse::kScratch);    // (B, T/tp, C) -> (B, T, C)
//   Tensor part = tp::reduce_scatter_sequence(ctx, tp, y, nn::MemoryUse::kActivation);  // summed, (B, T/tp, C)
//
// A layer calls these inside its own forward and backward, each pass the other's backward:
//   Megatron's region             forward                    backward
//   copy_to_..._region            (identity)                 all_reduce
//   reduce_from_..._region        all_reduce                 (identity)
//   gather_from_sequence_...      gather_sequence            reduce_scatter_sequence
//   reduce_scatter_to_sequence_   reduce_scatter_sequence    gather_sequence
//   scatter_to_sequence_...       scatter_sequence           gather_sequence
// With tp = 1 (no group, or a group of one) every function returns its input and moves nothing.
//
// Sequence shards. With sequence_parallel, activations between a row-parallel and the next
// column-parallel layer (the layer norms, the residual stream) are split along the sequence: rank r of
// the group holds positions [r T/tp, (r + 1) T/tp) of every sample, a (B, T/tp, ...) tensor. T must be
// divisible by the group's size (a ConfigError names model.sequence_parallel). The collectives carry
// rank-major blocks; the functions reorder them into (B, T, ...) when B > 1.
//
// Collectives are the group's (comm/group.h): every tensor-parallel rank runs the same layers in the
// same order on the same micro-batch, so they match; a stalled rank ends every rank with CommError
// naming the group ("tp"). In a measuring run (the estimator's simulated group) nothing moves.
#pragma once

#include <vector>

#include "comm/group.h"
#include "memory/tensor.h"
#include "nn/context.h"
#include "nn/parameter.h"

namespace zs::tp {

struct TensorParallel {
  const comm::Group* group = nullptr;  // comm::Topology::tensor_parallel(); nullptr: tp = 1. Outlives the layers.
  bool sequence_parallel = false;      // Megatron's --sequence-parallel (model.sequence_parallel)

  int size() const { return group != nullptr ? group->size() : 1; }
  int rank() const { return group != nullptr ? group->rank() : 0; }
  // Sequence shards between the layers: sequence_parallel with more than one rank.
  bool sharded_sequence() const { return sequence_parallel && size() > 1; }
};

// Sum of `x` over the group, in place.
void all_reduce(const TensorParallel& tp, const memory::Tensor& x);

// (B, T/tp, ...) shards of every rank -> (B, T, ...), a tensor of `use`.
memory::Tensor gather_sequence(nn::Context& ctx, const TensorParallel& tp, const memory::Tensor& shard,
                               nn::MemoryUse use);

// (B, T, ...) on every rank -> this rank's (B, T/tp, ...) shard of the sum over the group, of `use`.
memory::Tensor reduce_scatter_sequence(nn::Context& ctx, const TensorParallel& tp, const memory::Tensor& full,
                                       nn::MemoryUse use);

// (B, T, ...) -> this rank's (B, T/tp, ...) shard (a copy, of `use`; no communication).
memory::Tensor scatter_sequence(nn::Context& ctx, const TensorParallel& tp, const memory::Tensor& full,
                                nn::MemoryUse use);

// T / tp, or ConfigError naming model.sequence_parallel when tp does not divide T.
int64_t sequence_shard(const TensorParallel& tp, int64_t T);

// Note [replicated gradients of sequence shards]
// With sequence parallelism a replicated parameter used on a sequence shard (a layer norm's weight and
// bias, a row-parallel layer's bias) gets on each rank the gradient of that rank's positions only; the
// sum over the group is the gradient of the whole sequence, which tp = 1 computes. Megatron sums these
// over the tensor-parallel group after the backward (finalize_model_grads); here the layer sums them
// in its own backward, so every tensor-parallel rank holds the same full gradient as soon as the
// layer's backward returns, whoever owns the gradients (nn::materialize or the engine's buffers, which
// then see nothing different from a replicated parameter). Only this backward's contribution is
// summed, not what the gradient already held (an earlier micro-batch's): while the layer computes it,
// the parameters' gradients point at one zeroed fp32 buffer; then the buffer is summed over the group
// (one all-reduce for all the listed parameters) and added into the real gradients.
//
//   tp::ReplicatedGradients rg(ctx, tp_, {&weight(), &bias()});   // redirects while sharded_sequence()
//   Tensor dx = nn::LayerNorm::backward(ctx, dy);                   // accumulates into the buffer
//   rg.reduce();                                                    // sum over tp, add, restore
//
// Not sharded (tp = 1 or sequence_parallel off): does nothing; the layer accumulates as usual.
class ReplicatedGradients {
 public:
  ReplicatedGradients(nn::Context& ctx, const TensorParallel& tp, std::vector<nn::Parameter*> params);
  ReplicatedGradients(const ReplicatedGradients&) = delete;
  ReplicatedGradients& operator=(const ReplicatedGradients&) = delete;
  // Restores the gradients' views if reduce() did not run (an exception): nothing is added.
  ~ReplicatedGradients();
  void reduce();

 private:
  void restore();
  nn::Context& ctx_;
  TensorParallel tp_;
  std::vector<nn::Parameter*> params_;
  std::vector<memory::Tensor> saved_;  // the parameters' own gradient tensors
  memory::Tensor buffer_;              // the contributions, fp32, all parameters back to back
  bool active_ = false;
};

}  // namespace zs::tp
