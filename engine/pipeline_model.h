// PipelineModel: a model the engine trains as one stage of a pipeline (pipeline parallelism, issue
// #35; docs/pipeline_parallel.md). The model is this rank's part of the whole model - its chunks'
// parameters under their full names - and it runs a whole step's micro-batches itself under its
// schedule, exchanging activations and their gradients with the other stages over its "pp" group
// (run::GptPipelineModel, run/gpt_pipeline.h, is the built-in GPT's; pp::Pipeline does the work).
//
//   run::GptPipelineModel stage(cfg, topology, ...);        // an engine::PipelineModel
//   engine::Engine engine(stage, cfg, topology.data_parallel(), topology.tensor_parallel());
//   engine.train_batch(source);                              // the schedule's micro-batches, one update
//
// Note [pipeline stages in the engine]
// The engine finds a pipeline by the model's type (dynamic_cast) and then:
//   - train_batch fills the step's gradient_accumulation_steps micro-batches and hands them to
//     run_pipeline at once: accumulation is the schedule's. forward()/backward() and eval_batch are
//     UsageErrors (a stage cannot run one micro-batch alone);
//   - the module hooks do not drive the gradient reducer while the schedule runs (several instances
//     of a chunk accumulate into one gradient, and ZB-H1 defers weight gradients to its W passes);
//     the buckets are reduced over the stage's data-parallel group when run_pipeline has returned,
//     after shared_params' gradients are summed between their stages. ZeRO-0 and 1 accumulate into
//     the full gradient buffer as usual. ZeRO-2 stages the whole stage's gradient (every bucket's
//     staging buffer, in the compute dtype) during the step and reduce-scatters each bucket into the
//     shard after the schedule - one stage's gradients, 1/pp of the model, instead of ZeRO-2's two
//     buckets: a bucket's gradient is complete only after its last micro-batch's backward, which for
//     the first stage's buckets is the step's end. ZeRO-3 is refused (ConfigError naming
//     zero_optimization.stage and model.pipeline_parallel_size): its gathers follow one module order
//     per pass, and a schedule interleaves the passes of several micro-batches;
//   - the gradient norm (clipping, fp16 overflow) is the whole model's: each stage's sum over dp (and
//     tp) is summed over the pp group, a shared parameter counted on one stage only; so every rank of
//     dp x tp x pp clips with, and skips on, the same value;
//   - the loss comes from the last stage (run_pipeline gives every stage the mean);
//   - checkpoints are per stage (this rank's parameters, by full name); fp32_param and param_digest
//     are the whole model's, collective over the pp group too (a stage holding the name sends its
//     values; the digests of every stage's parameters are exchanged, a tied copy counted once), so
//     they equal pp = 1's for equal parameters (Note [whole-model digest] in engine/param_digest.cpp).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "comm/group.h"
#include "nn/context.h"
#include "nn/model.h"

namespace zs::engine {

// What one run_pipeline did on this rank.
struct PipelineRun {
  float loss = 0.0f;          // mean over the micro-batches, the same on every stage
  double seconds = 0.0;       // the schedule's wall time on this rank
  double busy_seconds = 0.0;  // in forward, backward and weight-gradient passes
  double ideal_bubble = 0.0;  // this rank's idle fraction with unit pass times (pp::plan)
  int64_t bytes_sent = 0;     // activations and their gradients sent to the neighbouring stages
  int max_in_flight = 0;      // micro-batches held at once
};

class PipelineModel : public nn::Model {
 public:
  // The "pp" group: this rank is stage pipeline_group().rank().
  virtual const comm::Group& pipeline_group() const = 0;
  // Forward and backward of every micro-batch under the schedule: every parameter's grad +=
  // grad_scale * d(micro-batch mean loss), deferred weight gradients included, before it returns.
  virtual PipelineRun run_pipeline(nn::Context& ctx, std::span<const nn::Batch> micro_batches, float grad_scale) = 0;
  // A parameter this stage holds a copy of beside another stage (a tied embedding): after the
  // schedule the engine sets each copy's gradient to the sum of both (pipeline group ranks `peer`
  // and this), and counts it in sums over the model only where `counted`.
  struct Shared {
    nn::Parameter* param;
    int peer;
    bool counted;
  };
  virtual std::vector<Shared> shared_params() = 0;

 protected:
  float forward_loss(nn::Context& ctx, const nn::Batch& batch) override;
  void backward_loss(nn::Context& ctx, float grad_scale) override;
};

}  // namespace zs::engine
