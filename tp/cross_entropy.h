// Megatron-LM's vocab-parallel cross-entropy (megatron/core/tensor_parallel/cross_entropy.py): softmax
// cross-entropy over logits split by vocabulary columns over a tensor-parallel group, so the (N, V)
// logits are never whole on one rank. Not a Module (as nn::SoftmaxCrossEntropy): a model calls it
// inline.
//
//   tp::VocabParallelCrossEntropy ce(tp);
//   float loss = ce.forward(ctx, logits, targets);   // logits (..., V/tp): this rank's vocabulary columns
//   Tensor dlogits = ce.backward(ctx, grad_scale);   // (..., V/tp), no communication
//
// Rank r's logits are vocabulary entries [r V/tp, (r + 1) V/tp) (a column-parallel head's output, or
// the vocab-parallel embedding used as the head). Targets are N int32 ids in [0, V) (ConfigError
// otherwise, on every rank). The loss is the mean over rows, the same value on every rank of the group.
//
// Note [one gather for the loss]: Megatron all-reduces the rows' maxima, then the target logits
// (held by the rank owning the target) and the sums of exponentials: three collectives. Here each
// rank computes, per row, its local maximum m_r, its local sum s_r of exp(logit - m_r) and its target
// logit (0 unless it owns the target), and one all-gather of these 3N values gives every rank all of
// them: the row's log-sum-exp is M + log(sum_r s_r exp(m_r - M)) with M = max_r m_r, the target logit
// the sum of the gathered ones, combined in rank order on every rank (so every rank gets the same
// bits). With tp = 1 this is nn::SoftmaxCrossEntropy's arithmetic exactly. The backward is local:
// dlogit = grad_scale / N (softmax - onehot) on this rank's columns.
//
// Note [padded vocabulary]
// With a vocabulary padded to a multiple of tp (Megatron's --make-vocab-size-divisible-by,
// tp::padded_vocab_size), the logits hold padded / tp columns per rank and the columns from
// `vocab_size` on are padding: they are left out of each row's maximum and sum of exponentials (as if
// their logits were -inf, so they never win the softmax and take no probability), a target there is a
// ConfigError like any id >= vocab_size, and their gradient is zero. The padded rows of the embedding
// and head (zeros, Parameter::init_values) thus get zero gradients and stay zero under AdamW, Lamb and
// Lion; checkpoints, digests and fp32_param leave them out (Note [tensor slices] in nn/parameter.h),
// so a run resumes at any tp degree. Megatron lets the padded logits into the softmax and the loss;
// masking them makes a padded tp run train exactly as the unpadded tp = 1 model.
#pragma once

#include "memory/tensor.h"
#include "nn/context.h"
#include "tp/mappings.h"

namespace zs::tp {

class VocabParallelCrossEntropy {
 public:
  // vocab_size: the real vocabulary when the logits' columns are padded (Note [padded vocabulary]);
  // 0: every column is real (tp * the local columns).
  explicit VocabParallelCrossEntropy(TensorParallel tp, int64_t vocab_size = 0) : tp_(tp), vocab_(vocab_size) {}
  float forward(nn::Context& ctx, const memory::Tensor& logits, const memory::Tensor& targets);
  memory::Tensor backward(nn::Context& ctx, float grad_scale);
  void clear() { logits_ = targets_ = lse_ = {}; }

 private:
  // This rank's real columns of Vl: those below the vocabulary.
  int64_t real_columns(int64_t Vl) const;

  TensorParallel tp_;
  int64_t vocab_;
  memory::Tensor logits_;
  memory::Tensor targets_;
  memory::Tensor lse_;  // (N) log-sum-exp of each row over the whole vocabulary
};

}  // namespace zs::tp
