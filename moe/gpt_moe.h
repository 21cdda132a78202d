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
#pragma once

#include <cstdint>
#include <vector>

#include "comm/world.h"
#include "moe/moe_layer.h"
#include "nn/cross_entropy.h"
#include "nn/gpt.h"
#include "nn/layers.h"
#include "nn/model.h"

namespace zs::moe {

struct GptMoeConfig {
  nn::GptConfig gpt;  // tied_embeddings is not supported here (the head is its own Linear)
  MoEOptions moe;
  int every_n_layers = 2;
  float aux_loss_coef = 0.01f;
  // Hidden width of each expert's MLP; 0: 4 * d_model as the dense blocks. A top-k MoE with experts of
  // 4 * d_model / k does the dense MLP's FLOPs per token (benchmarks/moe_train_bench compares so).
  int64_t expert_hidden = 0;
};

// ConfigErrors naming "model.*" / "model.moe.*" keys.
void validate(const GptMoeConfig& cfg);

class GptMoeModel : public nn::Model {
 public:
  GptMoeModel(const GptMoeConfig& cfg, const comm::ExpertGroups* groups = nullptr);
  std::string_view type_name() const override { return "GptMoe"; }
  const GptMoeConfig& config() const { return cfg_; }
  const std::vector<MoE*>& moe_layers() const { return moe_; }
  // Sum of the MoE layers' l_aux in the last forward (the loss includes aux_loss_coef times it).
  float l_aux() const { return l_aux_; }

 protected:
  float forward_loss(nn::Context& ctx, const nn::Batch& batch) override;
  void backward_loss(nn::Context& ctx, float grad_scale) override;
  void clear_own_saved() override { loss_.clear(); }

 private:
  GptMoeConfig cfg_;
  nn::Embedding& wte_;
  nn::Embedding& wpe_;
  nn::Sequential& blocks_;
  nn::LayerNorm& ln_f_;
  nn::Linear& lm_head_;
  std::vector<MoE*> moe_;
  nn::SoftmaxCrossEntropy loss_;
  memory::Tensor positions_;  // (B, T) int32 position ids of the last forward
  float l_aux_ = 0.0f;
};

}  // namespace zs::moe
