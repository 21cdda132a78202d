#include "run/gpt_pipeline.h"

namespace zs::run {

pp::GptPipelineConfig gpt_pipeline_config(const RunConfig& cfg, const comm::Group* tp) {
  pp::GptPipelineConfig pc;
  pc.virtual_pipeline_size = cfg.pipeline.virtual_pipeline_size;
  pc.pipeline.schedule = cfg.pipeline.schedule;
  pc.partition = cfg.pipeline.partition;
  if (cfg.model) pc.recompute_plan = engine::gpt_recompute(cfg.recompute, cfg.model->n_layer);
  pc.tensor_parallel_group = tp != nullptr && tp->size() > 1 ? tp : nullptr;
  pc.sequence_parallel = pc.tensor_parallel_group != nullptr && cfg.tensor_parallel.sequence_parallel;
  return pc;
}

GptPipelineModel::GptPipelineModel(const nn::GptConfig& cfg, const comm::Group& pipeline,
                                   const pp::GptPipelineConfig& pc)
    : cfg_(cfg), group_(pipeline) {
  std::vector<pp::ChunkFactory> factories = pp::gpt_chunk_factories(cfg, pipeline, pc, &bounds_);
  // The first instance of every chunk is a part of this model (the engine places its parameters);
  // the pipeline builds the further instances for micro-batches in flight.
  std::vector<pp::StageModel*> first;
  for (const pp::ChunkFactory& f : factories) {
    std::unique_ptr<pp::StageModel> chunk = f();
    first.push_back(chunk.get());
    adopt_part(std::move(chunk));
  }
  nn::assign_names(*this);
  pipe_ = std::make_unique<pp::Pipeline>(pipeline, pc.pipeline, std::move(factories), std::move(first));
}

engine::PipelineRun GptPipelineModel::run_pipeline(nn::Context& ctx, std::span<const nn::Batch> micro_batches,
                                                   float grad_scale) {
  const pp::StepStats st = pipe_->run(ctx, micro_batches, grad_scale);
  return {.loss = st.loss,
          .seconds = st.seconds,
          .busy_seconds = st.busy_seconds,
          .ideal_bubble = st.ideal_bubble,
          .bytes_sent = st.bytes_sent,
          .max_in_flight = st.max_in_flight};
}

std::vector<engine::PipelineModel::Shared> GptPipelineModel::shared_params() {
  const int p = group_.size(), v = pipe_->chunks(), r = group_.rank();
  if (!cfg_.tied_embeddings || p == 1) return {};  // pp 1: one chunk (virtual chunks need pp > 1)
  // Megatron's embedding group: the first chunk's wte (stage 0) and the last chunk's head copy
  // (stage p - 1); stage 0's is counted in the gradient norm.
  if (r == 0) return {{.param = pipe_->chunk(0).shared_embedding(), .peer = p - 1, .counted = true}};
  if (r == p - 1) return {{.param = pipe_->chunk(v - 1).shared_embedding(), .peer = 0, .counted = false}};
  return {};
}

}  // namespace zs::run
