// The engine's side of pipeline parallelism (Note [pipeline stages in the engine] in
// engine/pipeline_model.h): the checks at construction, one step's schedule as the accumulation
// window, the shared parameters' gradient sums between stages, and the pp sum of the gradient norm.
#include <algorithm>

#include <fmt/format.h>

#include "core/clock.h"
#include "core/errors.h"
#include "engine/detail/engine_impl.h"
#include "nn/flops.h"

namespace zs::engine {

float PipelineModel::forward_loss(nn::Context&, const nn::Batch&) {
  throw UsageError(fmt::format("model '{}' is a pipeline stage: it runs a whole step's micro-batches under its schedule, "
                               "so train it with Engine::train_batch (Engine::forward/backward and eval_batch run one "
                               "micro-batch, which a stage cannot do alone)",
                               type_name()));
}

void PipelineModel::backward_loss(nn::Context&, float) {
  throw UsageError(fmt::format("model '{}' is a pipeline stage: train it with Engine::train_batch", type_name()));
}

const comm::Group* Engine::pipeline_parallel() const {
  return impl_->pipeline_ != nullptr ? &impl_->pipeline_->pipeline_group() : nullptr;
}

void Engine::Impl::setup_pipeline(nn::Model& model) {
  pipeline_ = dynamic_cast<PipelineModel*>(&model);
  if (pipeline_ == nullptr) return;
  const int pp = pipeline_->pipeline_group().size();
  if (stage_ == 3) {
    throw ConfigError(fmt::format(
        "zero_optimization.stage: 3 with model.pipeline_parallel_size {} is not supported: ZeRO-3 gathers each "
        "module's parameters along one recorded order per pass, while a pipeline schedule interleaves the forward and "
        "backward passes of several micro-batches (and ZB-H1 defers weight gradients); use stage 1 or 2 (optimizer "
        "states and gradients sharded over each stage's data-parallel group), or model.pipeline_parallel_size 1",
        pp));
  }
  if (cfg_.optimizer.compressed()) {
    throw ConfigError(fmt::format("optimizer.type: {} with model.pipeline_parallel_size {} is not supported: its "
                                  "compressed allreduce scales the whole momentum of one model; use Adam/AdamW, Lamb "
                                  "or Lion with pipeline parallelism",
                                  cfg_.optimizer.name(), pp));
  }
  if (has_experts()) {
    throw ModelError("a pipeline stage with expert (MoE) parameters is not supported: MoE models train with "
                     "model.pipeline_parallel_size 1");
  }
  for (const PipelineModel::Shared& sh : pipeline_->shared_params()) {
    if (!sh.counted) env_.uncounted.insert(sh.param);
  }
}

void Engine::Impl::sum_shared_grads() {
  const comm::Group& pp = pipeline_->pipeline_group();
  for (const PipelineModel::Shared& sh : pipeline_->shared_params()) {
    // Through fp32 on both stages: a + b == b + a, so both copies get the same bits in any dtype.
    memory::Tensor g = sh.param->grad();
    memory::Tensor mine = memory::Tensor::empty(g.shape(), memory::DType::kF32);
    memory::Tensor other = memory::Tensor::empty(g.shape(), memory::DType::kF32);
    mine.copy_from(g);
    pp.sendrecv(mine, sh.peer, other, sh.peer);
    std::span<float> a = mine.f32(), b = other.f32();
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    g.copy_from(mine);
  }
}

void Engine::Impl::run_pipeline_window(nn::Model& model, BatchSource& source, int64_t step) {
  const int64_t m = cfg_.batch.gradient_accumulation_steps;
  std::vector<nn::Batch> batches(static_cast<size_t>(m));
  for (int64_t k = 0; k < m; ++k) fill_micro_batch(source, batches[static_cast<size_t>(k)], step, k);
  if (!startup_logged_ && kernels()) [[unlikely]] log_startup_collectives();
  const double t0 = now_seconds();
  window_start_s_ = t0;
  window_tokens_ = 0;
  flops_at_window_start_ = nn::flops_performed();
  recomputed_at_window_start_ = nn::flops_recomputed();
  for (const nn::Batch& b : batches) {
    if (b.inputs.dtype() == memory::DType::kI32) window_tokens_ += b.inputs.numel();
  }
  set_position(step, 0, batches.front());
  memory::DeviceAccess access(*backend_);
  try {
    reductions_access_.emplace(*backend_);
    for (auto& set : sets_) {
      set->reducer->begin_backward(/*boundary=*/true, /*reduce=*/true, /*shard_zero=*/true);  // one reduction per window
      set->prefetch_states();
    }
    // ZeRO-2: every bucket's staging buffer for the whole schedule (Note [pipeline stages in the engine]).
    const std::vector<nn::Module*> modules = model.named_modules();
    for (nn::Module* mod : modules) {
      for (auto& set : sets_) set->reducer->module_starting(*mod);
    }
    const float grad_scale = static_cast<float>(scaler_.scale() / static_cast<double>(m));
    pipeline_run_ = pipeline_->run_pipeline(ctx_, batches, grad_scale);
    sum_shared_grads();
    for (auto it = modules.rbegin(); it != modules.rend(); ++it) {
      for (auto& set : sets_) set->reducer->module_done(**it);
    }
    for (auto& set : sets_) set->reducer->end_backward();
  } catch (...) {
    abandon_window(model);
    throw;
  }
  micro_step_ = m;
  loss_sum_ = static_cast<double>(pipeline_run_.loss) * static_cast<double>(m);
  backward_since_step_ = true;
  backward_s_ = now_seconds() - t0;  // the schedule interleaves forwards and backwards
}

std::vector<float> Engine::pipeline_fp32_param(const std::string& name, bool held) const {
  // Which stages hold it (the same in every pp group: stages are partitioned alike), then the first
  // one's full values to the others: its size as two 31-bit halves, then the values.
  const comm::Group& pp = *pipeline_parallel();
  int32_t mine = held ? 1 : 0;
  std::vector<int32_t> holders(static_cast<size_t>(pp.size()));
  pp.allgather(memory::Tensor(&mine, memory::DType::kI32, {1}),
               memory::Tensor(holders.data(), memory::DType::kI32, {pp.size()}));
  const auto first = std::find(holders.begin(), holders.end(), 1);
  if (first == holders.end()) {
    throw UsageError(fmt::format("Engine::fp32_param: no pipeline stage holds a parameter named '{}'; pass a full name "
                                 "of the pp = 1 model such as 'wte' or 'blocks.0.attn.qkv.weight' "
                                 "(nn::Parameter::full_name)",
                                 name));
  }
  const int root = static_cast<int>(first - holders.begin());
  std::vector<float> values;
  if (pp.rank() == root) {
    const auto& [set, slot] = impl_->slot_by_name_.at(name);
    const ModelStates& states = *impl_->sets_[set];
    const ParamSlot& s = states.layout.slots()[slot];
    values = impl_->gather_full(*s.param, impl_->gather_fp32(states, s));
  }
  const auto n = static_cast<int64_t>(values.size());
  int32_t size[2] = {static_cast<int32_t>(n & 0x7fffffff), static_cast<int32_t>(n >> 31)};
  pp.broadcast(memory::Tensor(size, memory::DType::kI32, {2}), root);
  values.resize(static_cast<size_t>(size[0] + (int64_t{size[1]} << 31)));
  pp.broadcast(memory::Tensor::of(std::span<float>(values)), root);
  return values;
}

double Engine::Impl::pipeline_sum(double sum_sq) const {
  if (pipeline_ == nullptr || pipeline_->pipeline_group().size() == 1) return sum_sq;
  float total = static_cast<float>(sum_sq);
  pipeline_->pipeline_group().allreduce(memory::Tensor::of(std::span<float>(&total, 1)));
  return total;
}

}  // namespace zs::engine
