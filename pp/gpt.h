// The built-in GPT (nn/gpt.h) as a pipeline: its blocks split over stages * chunks model chunks, the
// embeddings on the first chunk, the final norm, head and loss on the last.
//
//   pp::GptPipeline gpt(cfg, topo.pipeline_parallel(), {.pipeline = {.schedule = pp::Schedule::kOneFOneB}});
//   gpt.materialize(seed);                                  // the standalone path (tests)
//   pp::StepStats st = gpt.step(ctx, micro_batches, 1.0f / m);
//
// Every parameter keeps nn::GptModel's full name and init ("blocks.3.attn.qkv.weight" on whichever
// stage holds block 3), so pipeline_parallel_size 1 and 2 train the same model. With tied embeddings
// and more than one chunk, the last chunk declares its own "wte" (the output head), initialised like
// the first chunk's; step() sums the two gradients between the first and the last stage (Megatron's
// embedding group), so the copies get the same update and stay identical.
//
// Partition: the layers are the blocks; a block's cost is its parameter count, the first block's
// with the embeddings added and the last block's with the final norm and head
// (PartitionMethod::kParameters balances these), or its training FLOPs, the last block's with the
// head's (kCompute, Note [compute partition] in pp/gpt.cpp); kUniform splits the blocks evenly;
// kExplicit takes boundaries over the n_layer blocks, pipeline.partition_boundaries.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "comm/group.h"
#include "nn/cross_entropy.h"
#include "nn/gpt.h"
#include "pp/partition.h"
#include "pp/pipeline.h"
#include "tp/cross_entropy.h"
#include "tp/mappings.h"

namespace zs::pp {

struct GptPipelineConfig {
  int virtual_pipeline_size = 1;  // model.virtual_pipeline_size: chunks per rank (interleaved)
  PipelineConfig pipeline = {};
  PartitionConfig partition = {};
  bool recompute = false;         // every block recomputes its activations in the backward
  // Or, as nn::GptModel::set_recompute: block i (its global index) recomputed where blocks[i], and
  // selective recompute of the attention scores (activation_checkpointing.checkpoint_blocks).
  nn::GptRecompute recompute_plan = {};
  // Tensor parallelism inside every stage (tp/'s layers, TpGptStage): the "tp" group of
  // comm::Topology; nullptr: none. With it, the "pp" group links ranks of the same tp rank.
  const comm::Group* tensor_parallel_group = nullptr;
  bool sequence_parallel = false;  // model.sequence_parallel (with a tensor-parallel group)
};

// Block boundaries of the global chunks (global_chunks + 1 entries), ConfigError as pp::partition.
std::vector<int64_t> gpt_partition(const nn::GptConfig& cfg, const PartitionConfig& part, int global_chunks);
// Parameter elements pipeline rank `stage` of `stages` holds with `chunks` chunks per rank: its
// chunks' blocks, the embeddings with the first global chunk, the final norm and the head (a tied
// embedding's copy) with the last; the sizes gpt_partition balances, before any tensor-parallel
// split. ConfigError as gpt_partition.
int64_t gpt_stage_param_count(const nn::GptConfig& cfg, const PartitionConfig& part, int stages, int chunks, int stage);

// One factory per local chunk of this rank (rank r of `group` holds global chunks r, r + stages, ...),
// and the block boundaries of the global chunks into `bounds`. ConfigError as gpt_partition, or for a
// virtual_pipeline_size below 1.
std::vector<ChunkFactory> gpt_chunk_factories(const nn::GptConfig& cfg, const comm::Group& group,
                                              const GptPipelineConfig& pc, std::vector<int64_t>* bounds);

// Global chunk holding blocks [first_block, end_block) of the GPT, with the embeddings if `first`, the
// final norm, head and loss if `last`.
class GptStage : public StageModel {
 public:
  GptStage(const nn::GptConfig& cfg, int64_t first_block, int64_t end_block, bool first, bool last, bool recompute);
  std::string_view type_name() const override { return "GptStage"; }
  memory::Shape boundary_shape(int64_t batch, int64_t seq) const override { return {batch, seq, cfg_.d_model}; }
  // The token embedding (the first chunk's, or the last chunk's tied head); nullptr where neither.
  nn::Parameter* wte() { return wte_; }
  nn::Parameter* shared_embedding() override { return cfg_.tied_embeddings ? wte_ : nullptr; }
  // nn::Block (pre-norm residual sums into fresh tensors), its attention, MLP and norms, ln_f and the
  // head only read the gradients they pass on (pp/gpt.cpp, Note [stage gradients intact]).
  bool grads_intact() const override { return true; }

 protected:
  float forward_loss(nn::Context& ctx, const nn::Batch& batch) override;
  void backward_loss(nn::Context& ctx, float grad_scale) override;
  void clear_own_saved() override;

 private:
  nn::GptConfig cfg_;
  bool first_, last_;
  nn::Parameter* wte_ = nullptr;
  nn::Parameter* wpe_ = nullptr;
  nn::Module* blocks_ = nullptr;
  nn::Module* ln_f_ = nullptr;
  nn::Module* lm_head_ = nullptr;
  nn::SoftmaxCrossEntropy loss_;
  memory::Tensor ids_;      // first chunk: (B, T) int32
  memory::Tensor final_x_;  // last chunk, tied head: ln_f output
};

// The same chunk of tp::GptModel (tp/gpt.h): tp::ParallelBlock blocks, the vocab-parallel embedding on
// the first chunk, ln_f (sequence-parallel with sequence_parallel), the column-parallel or tied
// vocab-parallel head and tp::VocabParallelCrossEntropy on the last. Parameters are the slices of the
// tp = 1 tensors under their full names (Note [tensor slices] in nn/parameter.h). With sequence
// parallelism the activation between chunks is this rank's sequence shard.
class TpGptStage : public StageModel {
 public:
  TpGptStage(const nn::GptConfig& cfg, tp::TensorParallel tp, int64_t first_block, int64_t end_block, bool first,
             bool last, bool recompute);
  std::string_view type_name() const override { return "TensorParallelGptStage"; }
  memory::Shape boundary_shape(int64_t batch, int64_t seq) const override;
  nn::Parameter* shared_embedding() override { return cfg_.tied_embeddings ? wte_ : nullptr; }

 protected:
  float forward_loss(nn::Context& ctx, const nn::Batch& batch) override;
  void backward_loss(nn::Context& ctx, float grad_scale) override;
  void clear_own_saved() override;

 private:
  nn::GptConfig cfg_;
  tp::TensorParallel tp_;
  bool first_, last_;
  nn::Parameter* wte_ = nullptr;  // this rank's vocabulary rows
  nn::Parameter* wpe_ = nullptr;
  nn::Module* blocks_ = nullptr;
  nn::Module* ln_f_ = nullptr;
  nn::Module* lm_head_ = nullptr;
  tp::VocabParallelCrossEntropy loss_;
  int64_t batch_ = 0, seq_ = 0;
  memory::Tensor ids_;
  memory::Tensor final_x_;
};

class GptPipeline {
 public:
  // `group`: the "pp" group; this rank holds global chunks rank, rank + stages, ...
  GptPipeline(const nn::GptConfig& cfg, const comm::Group& group, const GptPipelineConfig& pc);

  Pipeline& pipeline() { return *pipe_; }
  // Block boundaries of the global chunks.
  const std::vector<int64_t>& boundaries() const { return bounds_; }
  // Every parameter of this rank's chunks, chunk by chunk in canonical order.
  std::vector<nn::Parameter*> params();
  // nn::materialize of every chunk (standalone storage).
  void materialize(uint64_t seed, memory::DType dtype = memory::DType::kF32);
  // One step (Pipeline::run), then the tied embedding's gradient summed between first and last stage.
  StepStats step(nn::Context& ctx, std::span<const nn::Batch> micro_batches, float grad_scale);

 private:
  nn::GptConfig cfg_;
  const comm::Group& group_;
  std::vector<int64_t> bounds_;
  std::unique_ptr<Pipeline> pipe_;
};

}  // namespace zs::pp
