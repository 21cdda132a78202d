// GptMoeModel: the GPT-2 architecture with the MLP of every `every_n_layers`-th block replaced by a
// moe::MoE layer (DeepSpeed's GPT-MoE: Megatron-DeepSpeed's `--num-experts` with an expert interval).
//
//   moe::GptMoeConfig cfg{.gpt = {.n_layer = 4, .d_model = 128}, .moe = {.num_experts = 8, .k = 2}};
//   comm::ExpertGroups groups = world.split_groups(cfg.moe.ep_size);
//   moe::GptMoeModel model(cfg, &groups);
//   engine::Engine engine(model, engine_config, world.group());
//
// Layout: wte and wpe embeddings (Embedding modules), blocks "blocks.<i>" = ln1, attn, ln2, then "mlp"
// (nn::Mlp) or "moe" (moe::MoE with nn::Mlp experts) for blocks i with (i + 1) % every_n_layers == 0
// (every_n_layers 2: blocks 1, 3, ...), ln_f and an untied lm_head. Training loss = cross-entropy +
// aux_loss_coef * (sum of the MoE layers' l_aux); each layer's l_aux gradient is aux_loss_coef *
// grad_scale. Evaluation (Engine::eval_batch) returns the cross-entropy alone, comparable with a
// dense GPT's. Built by `zeroshard train` from the config's `model.moe` too (docs/moe.md).
//
// Tensor parallelism (a tp::TensorParallel of more than one rank; model.tensor_parallel_size): the
// dense part is tp::GptModel's (wte vocab-parallel, attention and dense MLPs column/row-parallel,
// lm_head column-parallel, the vocab-parallel loss; layer norms on sequence shards with
// sequence_parallel), with the same parameter names as at tp = 1; the MoE layers' gate and experts
// stay whole on every tp rank (Note [experts under tensor parallelism] in moe/gpt_moe.cpp). The
// expert-parallel groups are then comm::Topology's (ep ranks of one tp rank, across replicas).
#pragma once

#include <cstdint>
#include <vector>

#include "comm/world.h"
#include "moe/moe_layer.h"
#include "nn/cross_entropy.h"
#include "nn/gpt.h"
#include "nn/layers.h"
#include "nn/model.h"
#include "tp/cross_entropy.h"
#include "tp/mappings.h"

namespace zs::moe {

struct GptMoeConfig {
  nn::GptConfig gpt;  // tied_embeddings is not supported here (the head is its own Linear)
  MoEOptions moe;
  int every_n_layers = 2;
  float aux_loss_coef = 0.01f;
  // Hidden width of each expert's MLP; 0: 4 * d_model as the dense blocks. A top-k MoE with experts of
  // 4 * d_model / k does the dense MLP's FLOPs per token (benchmarks/moe_train_bench compares so).
  int64_t expert_hidden = 0;
  // model.make_vocab_size_divisible_by: with tensor parallelism the vocabulary is padded to a multiple
  // of this times tp (tp::padded_vocab_size); no effect at tp 1.
  int make_vocab_size_divisible_by = 1;
};

// ConfigErrors naming "model.*" / "model.moe.*" keys; with tp > 1 also tp::validate's
// (model.tensor_parallel_size dividing n_head, the dense MLP width, the vocabulary, the world size).
void validate(const GptMoeConfig& cfg, int tensor_parallel_size = 1, bool sequence_parallel = false,
              int world_size = 1);

class GptMoeModel : public nn::Model {
 public:
  // tp: the tensor-parallel group (comm::Topology::tensor_parallel()) and sequence parallelism; the
  // default is tp = 1. With tp > 1 the groups must be the Topology's (ep within one tp rank's replicas).
  GptMoeModel(const GptMoeConfig& cfg, const comm::ExpertGroups* groups = nullptr, tp::TensorParallel tp = {});
  std::string_view type_name() const override { return "GptMoe"; }
  const GptMoeConfig& config() const { return cfg_; }
  const tp::TensorParallel& tensor_parallel() const { return tp_; }
  const std::vector<MoE*>& moe_layers() const { return moe_; }
  // Sum of the MoE layers' l_aux in the last forward (the loss includes aux_loss_coef times it).
  float l_aux() const { return l_aux_; }

 protected:
  float forward_loss(nn::Context& ctx, const nn::Batch& batch) override;
  void backward_loss(nn::Context& ctx, float grad_scale) override;
  void clear_own_saved() override {
    loss_.clear();
    tp_loss_.clear();
  }

 private:
  GptMoeConfig cfg_;
  tp::TensorParallel tp_;
  nn::Module& wte_;  // nn::Embedding, or tp::VocabParallelEmbedding with tp > 1
  nn::Embedding& wpe_;
  nn::Sequential& blocks_;
  nn::LayerNorm& ln_f_;
  nn::Module& lm_head_;  // nn::Linear, or tp::ColumnParallelLinear with tp > 1
  std::vector<MoE*> moe_;
  nn::SoftmaxCrossEntropy loss_;         // tp = 1
  tp::VocabParallelCrossEntropy tp_loss_;  // tp > 1: the logits are this rank's vocabulary columns
  memory::Tensor positions_;  // (B, T) int32 position ids of the last forward
  float l_aux_ = 0.0f;
};

}  // namespace zs::moe
