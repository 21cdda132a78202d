// tp::GptModel: nn::GptModel (GPT-2) split over a tensor-parallel group, Megatron-LM's way, with
// nn::GptModel's parameter full names, order and initialisation: each rank's parameter is its slice of
// the tp = 1 model's tensor (Note [tensor slices] in nn/parameter.h), so tp = 2 trains as tp = 1 does.
//
//   comm::Topology topo(world.group(), {.tensor_parallel_size = 2});
//   nn::GptConfig cfg{.n_layer = 2, .d_model = 64, .n_head = 4, .seq_len = 32, .vocab_size = 256};
//   tp::TensorParallelConfig par{.tensor_parallel_size = 2, .sequence_parallel = true};
//   tp::validate(cfg, par, world.size());                 // ConfigErrors naming the model.* keys
//   tp::GptModel model(cfg, par, &topo.tensor_parallel());
//   float loss = ctx.forward_loss(model, batch);          // every tp rank: the same batch, the same loss
//
// Layout (names as nn/gpt.h):
//   wte (vocab/tp, d)   vocab-parallel token embedding (rows; padded / tp with a padded vocabulary,
//                       tp::padded_vocab_size); with tied_embeddings also the head: each
//                       rank's logits are its vocabulary columns, fed to the vocab-parallel loss
//   wpe, ln_f, blocks.<i>.ln{1,2}   whole on every rank (replicated)
//   blocks.<i>          tp::ParallelBlock (attn.qkv, mlp.fc column-parallel; attn.proj, mlp.proj
//                       row-parallel with whole biases)
//   lm_head (vocab/tp, d)  without tied_embeddings: a column-parallel linear without bias
// The logits are never whole on one rank: (B, T, vocab/tp) into tp::VocabParallelCrossEntropy.
// Sequence parallelism: the embedding's sum is reduce-scattered to sequence shards, the blocks and ln_f
// run on shards, and the head gathers the sequence back (tp/transformer.h).
#pragma once

#include <cstdint>

#include "comm/group.h"
#include "memory/tensor.h"
#include "nn/gpt.h"
#include "nn/layers.h"
#include "nn/model.h"
#include "nn/module.h"
#include "tp/cross_entropy.h"
#include "tp/linear.h"
#include "tp/mappings.h"

namespace zs::tp {

// Megatron's names, under the config's "model" object.
struct TensorParallelConfig {
  int tensor_parallel_size = 1;    // model.tensor_parallel_size
  bool sequence_parallel = false;  // model.sequence_parallel
  // model.make_vocab_size_divisible_by (Megatron's --make-vocab-size-divisible-by, whose default is
  // 128; ours is 1, so a vocabulary divisible by tp is not padded and existing runs stay the same).
  int make_vocab_size_divisible_by = 1;
};

// Megatron's padded vocabulary: vocab rounded up to a multiple of make_vocab_size_divisible_by *
// tensor_parallel_size, at tp > 1; at tp 1 the vocabulary itself (nothing is split, so nothing to pad).
// The vocab-parallel layers hold padded / tp rows each; the padded rows are zeros whose logits are
// masked out of the softmax, and checkpoints, digests and fp32_param see the unpadded tensor (Note
// [padded vocabulary] in tp/cross_entropy.h).
int64_t padded_vocab_size(int64_t vocab, const TensorParallelConfig& par);

// nn::validate(cfg), then ConfigErrors naming the key: model.tensor_parallel_size must be >= 1 and
// divide model.n_head, the MLP width 4 * model.d_model and the world size (the vocabulary is padded
// to a multiple of it instead); model.sequence_parallel needs model.seq_len divisible by it;
// model.make_vocab_size_divisible_by >= 1.
void validate(const nn::GptConfig& cfg, const TensorParallelConfig& par, int world_size);

class GptModel : public nn::Model {
 public:
  // group: the tensor-parallel group (comm::Topology::tensor_parallel()), of par.tensor_parallel_size
  // ranks; nullptr for tp = 1. Throws as validate (with the group's world unknown: the group's size
  // stands for it) and UsageError when the group's size is not par.tensor_parallel_size.
  GptModel(const nn::GptConfig& cfg, const TensorParallelConfig& par, const comm::Group* group);
  std::string_view type_name() const override { return "TensorParallelGpt"; }
  const nn::GptConfig& config() const { return cfg_; }
  const TensorParallel& tensor_parallel() const { return tp_; }

  // As nn::GptModel::set_recompute: recomputed blocks, selective recompute of the scores.
  void set_recompute(const nn::GptRecompute& r);
  const nn::GptRecompute& recompute() const { return recompute_; }

  nn::Parameter& wte() { return wte_; }
  nn::Parameter& wpe() { return wpe_; }

 protected:
  float forward_loss(nn::Context& ctx, const nn::Batch& batch) override;
  void backward_loss(nn::Context& ctx, float grad_scale) override;
  void clear_own_saved() override;

 private:
  nn::GptConfig cfg_;
  TensorParallel tp_;
  nn::GptRecompute recompute_;
  nn::Parameter& wte_;
  nn::Parameter& wpe_;
  nn::Sequential& blocks_;
  nn::LayerNorm& ln_f_;
  int64_t padded_vocab_;
  ColumnParallelLinear* lm_head_ = nullptr;
  VocabParallelCrossEntropy loss_;
  memory::Tensor ids_;      // (B, T) int32
  memory::Tensor final_x_;  // ln_f's output (a sequence shard with sequence parallelism), for the tied head
};

}  // namespace zs::tp
