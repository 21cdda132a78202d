// tp::LlamaModel: nn::LlamaModel split over a tensor-parallel group, Megatron-LM's way, with
// nn::LlamaModel's parameter full names, order and initialisation (each rank's parameter is its slice of
// the tp = 1 tensor: Note [tensor slices] in nn/parameter.h), so tp = 2 trains as tp = 1 does.
//
//   comm::Topology topo(world.group(), {.tensor_parallel_size = 2});
//   tp::LlamaModel model(cfg, &topo.tensor_parallel());   // cfg: nn::LlamaConfig
//
// Layout (names as nn/llama.h):
//   wte (vocab/tp, d)            vocab-parallel token embedding (rows), summed over the group
//   blocks.<i>.ln{1,2}, ln_f     RMSNorm, whole on every rank (replicated)
//   blocks.<i>.attn.{q,k,v}      column-parallel: rank r computes query heads [r H/tp, (r+1) H/tp) and
//                                kv heads [r K/tp, (r+1) K/tp), exactly the kv heads its query heads
//                                read (query head h reads kv head h / (H / K)); attn.proj row-parallel
//   blocks.<i>.mlp.{gate,up}     column-parallel (the SwiGLU product is elementwise on each rank's
//                                columns); mlp.proj row-parallel
//   lm_head (vocab/tp, d)        column-parallel, into tp::VocabParallelCrossEntropy
// n_head, n_kv_head, d_ff and vocab_size must be divisible by tp (validate_llama names the key). No
// sequence parallelism yet (a ConfigError naming model.sequence_parallel).
#pragma once

#include <cstdint>
#include <memory>

#include "comm/group.h"
#include "memory/tensor.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "nn/model.h"
#include "nn/module.h"
#include "tp/cross_entropy.h"
#include "tp/linear.h"
#include "tp/mappings.h"

namespace zs::nn::detail {
struct RopeTables;
}

namespace zs::tp {

// nn::validate(cfg), then ConfigErrors naming the key: tensor_parallel_size must divide model.n_head,
// model.n_kv_head, the MLP width (model.d_ff), model.vocab_size and world_size; no sequence parallelism.
void validate_llama(const nn::LlamaConfig& cfg, int tensor_parallel_size, bool sequence_parallel, int world_size);

// GqaAttention (nn/llama.h) on this rank's heads.
class ParallelGqaAttention : public nn::Module {
 public:
  ParallelGqaAttention(const nn::LlamaConfig& cfg, TensorParallel tp);
  ~ParallelGqaAttention() override;
  std::string_view type_name() const override { return "ParallelGqaAttention"; }
  // As nn::GqaAttention::set_sparsity: the layout of all n_head heads; this rank's start at rank * n_head / tp.
  void set_sparsity(std::shared_ptr<const nn::SparseLayout> layout) { sparsity_ = std::move(layout); }

 protected:
  memory::Tensor forward(nn::Context& ctx, const memory::Tensor& x) override;
  memory::Tensor backward(nn::Context& ctx, const memory::Tensor& dy) override;
  void clear_own_saved() override { saved_q_ = saved_k_ = saved_v_ = saved_out_ = saved_lse_ = {}; }

 private:
  int64_t heads_, kv_heads_;  // this rank's
  ColumnParallelLinear& q_;
  ColumnParallelLinear& k_;
  ColumnParallelLinear& v_;
  RowParallelLinear& proj_;
  std::unique_ptr<nn::detail::RopeTables> rope_;
  memory::Tensor saved_q_, saved_k_, saved_v_, saved_out_, saved_lse_;  // nn::detail::GqaSaved
  memory::DType compute_dtype_ = memory::DType::kF32;
  std::shared_ptr<const nn::SparseLayout> sparsity_;
  int64_t first_head_ = 0;  // this rank's first head of the model's n_head
};

// SwiGluMlp (nn/llama.h) on this rank's d_ff / tp columns.
class ParallelSwiGluMlp : public nn::Module {
 public:
  ParallelSwiGluMlp(const nn::LlamaConfig& cfg, TensorParallel tp);
  std::string_view type_name() const override { return "ParallelSwiGluMlp"; }

 protected:
  memory::Tensor forward(nn::Context& ctx, const memory::Tensor& x) override;
  memory::Tensor backward(nn::Context& ctx, const memory::Tensor& dy) override;
  void clear_own_saved() override { g_ = u_ = {}; }

 private:
  ColumnParallelLinear& gate_;
  ColumnParallelLinear& up_;
  RowParallelLinear& proj_;
  memory::Tensor g_, u_;
};

// nn::LlamaBlock with the parallel attention and MLP (children ln1, attn, ln2, mlp).
class ParallelLlamaBlock : public nn::Module {
 public:
  ParallelLlamaBlock(const nn::LlamaConfig& cfg, TensorParallel tp);
  std::string_view type_name() const override { return "ParallelLlamaBlock"; }
  ParallelGqaAttention& attention() { return attn_; }
  // As nn::Block::set_dropped (nn/transformer.h).
  void set_dropped(bool dropped) { dropped_ = dropped; }

 protected:
  memory::Tensor forward(nn::Context& ctx, const memory::Tensor& x) override;
  memory::Tensor backward(nn::Context& ctx, const memory::Tensor& dy) override;

 private:
  nn::RmsNorm& ln1_;
  ParallelGqaAttention& attn_;
  nn::RmsNorm& ln2_;
  ParallelSwiGluMlp& mlp_;
  bool dropped_ = false;
};

class LlamaModel : public nn::Model {
 public:
  // group: the tensor-parallel group (comm::Topology::tensor_parallel()); nullptr for tp = 1. Throws as
  // validate_llama (the group's size standing for the world).
  LlamaModel(const nn::LlamaConfig& cfg, const comm::Group* group);
  std::string_view type_name() const override { return "TensorParallelLlama"; }
  const nn::LlamaConfig& config() const { return cfg_; }
  void set_recompute(const nn::GptRecompute& r);  // as nn::LlamaModel::set_recompute

 protected:
  float forward_loss(nn::Context& ctx, const nn::Batch& batch) override;
  void backward_loss(nn::Context& ctx, float grad_scale) override;
  void clear_own_saved() override;

 private:
  nn::LlamaConfig cfg_;
  TensorParallel tp_;
  nn::Parameter& wte_;
  nn::Sequential& blocks_;
  nn::RmsNorm& ln_f_;
  ColumnParallelLinear& lm_head_;
  VocabParallelCrossEntropy loss_;
  memory::Tensor ids_;
};

}  // namespace zs::tp
