// GptPipelineModel: this rank's stage of the built-in GPT under pipeline parallelism, as the model an
// engine trains (engine::PipelineModel, Note [pipeline stages in the engine] in
// engine/pipeline_model.h). Its parts are the rank's chunks (pp::GptStage, or pp::TpGptStage with a
// tensor-parallel group) under nn::GptModel's full names, so the engine places, shards and names
// them as the pp = 1 model's; pp::Pipeline runs the schedule over them.
//
//   comm::Topology topo(world, {.tensor_parallel_size = tp, .pipeline_parallel_size = pp});
//   run::GptPipelineModel stage(*cfg.model, topo.pipeline_parallel(), run::gpt_pipeline_config(cfg, tp_group));
//   engine::Engine engine(stage, cfg, topo.data_parallel(), topo.tensor_parallel());
#pragma once

#include <memory>
#include <vector>

#include "engine/pipeline_model.h"
#include "pp/pp.h"
#include "run/run_config.h"

namespace zs::run {

// The pp module's settings from a run config: schedule, partition, virtual chunks, recomputed blocks
// (activation_checkpointing.checkpoint_blocks), tensor parallelism inside the stages (`tp`: the "tp"
// group, or nullptr at tp 1).
pp::GptPipelineConfig gpt_pipeline_config(const RunConfig& cfg, const comm::Group* tp);

class GptPipelineModel final : public engine::PipelineModel {
 public:
  GptPipelineModel(const nn::GptConfig& cfg, const comm::Group& pipeline, const pp::GptPipelineConfig& pc);
  std::string_view type_name() const override { return "GptPipelineStage"; }
  const comm::Group& pipeline_group() const override { return group_; }
  engine::PipelineRun run_pipeline(nn::Context& ctx, std::span<const nn::Batch> micro_batches, float grad_scale) override;
  std::vector<Shared> shared_params() override;
  // Block boundaries of the global chunks (stages x virtual_pipeline_size + 1 entries).
  const std::vector<int64_t>& boundaries() const { return bounds_; }
  pp::Pipeline& pipeline() { return *pipe_; }

 private:
  nn::GptConfig cfg_;
  const comm::Group& group_;
  std::vector<int64_t> bounds_;
  std::unique_ptr<pp::Pipeline> pipe_;
};

}  // namespace zs::run
