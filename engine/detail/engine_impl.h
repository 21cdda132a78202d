// Engine::Impl: the engine's state, shared by engine.cpp (construction, forward, backward),
// engine_step.cpp (Engine::step's phases), engine_reports.cpp and compressed_step.cpp (one-bit Adam
// and 0/1 Adam). The model states themselves belong to one ModelStates per state set
// (engine/detail/model_states.h, Note [State owner]). Internal: not installed.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/compressed_allreduce.h"
#include "comm/shared_arena.h"
#include "engine/engine.h"
#include "engine/offload_rules.h"
#include "engine/detail/compressed_state.h"
#include "engine/detail/engine_context.h"
#include "engine/detail/model_states.h"
#include "engine/flat_layout.h"
#include "engine/detail/grad_reducer.h"
#include "engine/detail/param_gatherer.h"
#include "engine/partition.h"
#include "engine/pipeline_model.h"
#include "engine/placement.h"
#include "memory/allocator.h"
#include "memory/backend.h"
#include "memory/tracker.h"
#include "engine/flops_profiler.h"
#include "engine/monitor.h"
#include "offload/swap_space.h"
#include "offload/swapper.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/onebit_adam.h"
#include "optim/zero_one_adam.h"
#include "optim/optimizer.h"

namespace zs::engine {

struct CheckpointSnapshot;  // engine/detail/engine_checkpoint.h

// Where each model-state buffer lives is the placement plan's (Note [model-state placement] in
// engine/placement.h): each set's owner allocates what its plan lists (ModelStates::place, called by
// the constructor), and the estimator reads the same plans.
class Engine::Impl final : public ModuleHooks {
 public:
  // `backend` null: memory::make_backend(cfg.device.backend).
  // `tp` null or of one rank: tp 1.
  Impl(nn::Model& model, const EngineConfig& cfg, const comm::Group& group, const comm::Group* tp,
       std::unique_ptr<memory::Backend> backend);
  ~Impl() override;

  const EngineConfig& cfg_;
  const comm::Group& group_;
  // The tensor-parallel group when tp > 1, else null (Note [tensor-parallel parameters] in engine.h).
  const comm::Group* const tp_;
  // The expert-data-parallel groups, one per distinct expert_parallel_size (formed from group_ with
  // DeepSpeed's layout: {i, i+E, i+2E, ...}). Declared before sets_, which refer to them.
  std::vector<std::unique_ptr<comm::Group>> expert_groups_;
  // ZeRO++'s host groups over group_ (null without ZeRO++); declared before sets_, which refer to them.
  std::unique_ptr<ZeroppGroups> zeropp_groups_;
  // sets_[0]: the dense parameters (always there, possibly empty); then one per expert_parallel_size.
  // Each owns its model states (Note [State owner] in engine/detail/model_states.h). Cleared first by
  // ~Impl: their buffers live in arena_ below.
  std::vector<std::unique_ptr<ModelStates>> sets_;
  const PlacementPlan& plan_;  // sets_[0]'s; the flags below are the same in every set's plan
  const int stage_;
  const int grad_stage_;  // the stage whose gradient layout the reducer uses
  const memory::DType dtype_;
  // The device arena, shared with the activation Tensors the engine served (Note [engine memory
  // lifetime] in engine/detail/engine_context.h); the three names below are its parts.
  std::shared_ptr<DeviceArena> arena_;
  memory::MemoryTracker& tracker_;
  memory::Backend* const backend_;
  memory::DeviceAllocator* const device_;
  // The arena registered with the node's other ranks (comm.shared_arena): collectives on tensors in it
  // read the peers' tensors directly (comm/shared_arena.h). Inactive when off or not possible.
  comm::SharedArena shared_arena_;
  std::unique_ptr<optim::Optimizer> optimizer_;  // the update (Adam/AdamW/CAdam/Lion; Lamb in two passes)
  optim::LrSchedule schedule_;
  optim::LossScaler scaler_;
  // What the sets' owners share: settings, memory and per-thread scratch.
  StateEnv env_;

  std::optional<CompressedState> compressed_;
  // Full name -> (set, slot) of every parameter this rank holds.
  std::unordered_map<std::string, std::pair<size_t, size_t>> slot_by_name_;
  EngineContext ctx_;

  int64_t micro_step_ = 0;   // micro-batches since the last optimizer step
  bool backward_since_step_ = false;  // a backward() ran since the last step() (misuse check)
  int64_t steps_taken_ = 0;  // updates applied: the schedule's and the optimizer's step count
  double loss_sum_ = 0.0;
  double forward_s_ = 0.0, backward_s_ = 0.0;
  double window_start_s_ = 0.0;  // now_seconds() at the accumulation window's first forward
  bool startup_logged_ = false;  // log_startup_collectives ran
  int64_t window_tokens_ = 0;    // token ids this rank fed in the window (integer inputs only)
  std::unique_ptr<TrainingMonitor> monitor_;  // when the config enables a monitor (engine/monitor.h)
  std::unique_ptr<FlopsProfiler> profiler_;   // flops_profiler enabled, rank 0 (engine/flops_profiler.h)
  uint64_t bytes_sent_at_step_start_ = 0;
  uint64_t inter_host_at_step_start_ = 0;  // the World's bytes_sent_inter_host
  uint64_t grad_bytes_sent_at_step_start_ = 0;  // the reducers' bytes_sent, summed over the sets
  uint64_t tp_bytes_at_step_start_ = 0;          // the tp group's bytes_sent
  uint64_t gathers_at_step_start_ = 0;           // the gatherers' gathers() less their hpZ secondary ones
  uint64_t backward_gathers_at_step_start_ = 0;  // the gatherers' backward_gathers()
  memory::TransferStats transfers_at_step_start_;
  uint64_t flops_at_window_start_ = 0, recomputed_at_window_start_ = 0;  // nn/flops.h's counters
  // Device access held from the boundary backward until step() has waited for its reductions:
  // nonblocking collectives write device memory in between (memory::DeviceAccess).
  std::optional<memory::DeviceAccess> reductions_access_;
  // The host copy asynchronous checkpoint saves write from, kept between saves from the first one on
  // (Note [async snapshot] in engine/engine_checkpoint.cpp).
  std::shared_ptr<CheckpointSnapshot> checkpoint_snapshot_;

  bool mixed() const { return dtype_ != memory::DType::kF32; }
  // False over the measuring backend (the estimator): kernels are skipped, files are not made.
  bool kernels() const { return backend_->runs_kernels(); }
  ModelStates& dense() const { return *sets_.front(); }
  bool has_experts() const { return sets_.size() > 1; }
  // Every rank of the job takes one bf16 product path (Note [ranks agree the bf16 path] in nn/layers.h):
  // a collective over the data-, tensor- and pipeline-parallel groups, in that order.
  void agree_bf16_products();
  // The constructor's second half: every set's buffers, parameters, reducer and gatherer.
  void place_all(nn::Model& model);
  // The fp32 values of one parameter, whole, on every rank of the set's group. Collective over it.
  std::vector<float> gather_fp32(const ModelStates& s, const ParamSlot& slot);
  // A TP shard's values (`local`, gathered over dp) into the full tp = 1 tensor, on every tp rank;
  // anything else as it is. Collective over the tp group for a TP shard.
  std::vector<float> gather_full(const nn::Parameter& p, std::vector<float> local) const;
  int tp_size() const { return tp_ != nullptr ? tp_->size() : 1; }

  // engine_step.cpp: Engine::step's phases, in order.
  // Waits for the boundary backward's gradient reductions (and releases the device access they held).
  void wait_reductions();
  // The loss total and the squared gradient norm (through fp32), agreed over the ranks in one
  // allreduce; `local`: the gradients are each rank's own (a compressing step). fp32 gradient copies
  // are filled first when kept.
  struct LossAndNorm {
    float loss_total = 0.0f;
    double sum_sq = 0.0;
  };
  LossAndNorm agree_loss_and_norm(bool local);
  // This rank's part of the squared gradient norm of set s, over the elements it counts (the stepped
  // range, or the local gradients), in the reduced gradients' scale times grad_factor().
  double grad_sum_of_squares(const ModelStates& s, memory::ShardRange range);
  // The optimizer's step context for update t: the unscaled, clipped gradient scale.
  optim::StepContext clipped_step(int64_t t, const StepReport& report, double unscale) const;
  // One update of every set (or the compressed optimizers' step).
  void update(const optim::StepContext& ctx);
  // After an update: stages 1-2 gather the updated shards, stage 3 drops what its gatherer holds.
  void gather_updated_params();
  // The step's timings and traffic into `report`.
  void finish_report(StepReport& report, double t0);
  // The accumulation window's counters back to zero (a step is complete).
  void restart_window();
  // Once, at the first forward of a training engine: logs how many collectives the start-up took
  // (issue #32; every group of the World, counted since it started).
  void log_startup_collectives();
  // The monitor's and the flops profiler's view of a finished step (last: they may throw IoError).
  void publish(nn::Model& model, const StepReport& report, double step_end);

  // compressed_step.cpp (dense parameters only: experts are refused with compressed optimizers)
  void init_compressed(CompressedState state);  // the placed buffers
  bool exact_gradients(int64_t step) const;  // false: the step consumes local gradients
  void step_compressed(const optim::StepContext& ctx);
  void gather_momentum();
  uint64_t compressed_state_bytes() const;

  // engine_pipeline.cpp (Note [pipeline stages in the engine] in engine/pipeline_model.h).
  PipelineModel* pipeline_ = nullptr;  // the model, when it is a pipeline stage
  PipelineRun pipeline_run_;           // the last step's schedule on this rank
  // The constructor's checks of a pipeline stage (ZeRO-3, compressed optimizers, experts refused).
  void setup_pipeline(nn::Model& model);
  // One step's micro-batches through the schedule, the gradients reduced: the whole window.
  void run_pipeline_window(nn::Model& model, BatchSource& source, int64_t step);
  void sum_shared_grads();
  // The squared gradient norm of this stage summed over the pipeline (identity without one).
  double pipeline_sum(double sum_sq) const;

  // recompute.cpp: cfg_.recompute applied to the model and ctx_.
  void setup_recompute(nn::Model& model);
  int64_t checkpointed_modules_ = 0;

  // Note [a failed pass]: an exception inside a forward leaves the engine as before that forward
  // (abandon_forward); one inside a backward discards the accumulation window's gradients
  // (abandon_window): part of them may already be reduced into other buckets or shards, so the window
  // cannot be resumed, but the engine is consistent and the next forward starts a fresh window.
  void abandon_forward(nn::Model& model);
  void abandon_window(nn::Model& model);
  // Fills micro-batch `m` of optimizer step `step` from `source` (this rank's samples) and checks
  // that the source filled exactly the rows it was asked for (UsageError otherwise).
  void fill_micro_batch(BatchSource& source, nn::Batch& batch, int64_t step, int64_t m);
  // Global index of this rank's first sample in micro-batch m of a step of `rows` samples per rank
  // (BatchSource's numbering); sets the context's nn::BatchPosition for the forward about to run.
  int64_t first_sample(int64_t m, int64_t rows) const { return (m * group_.size() + group_.rank()) * rows; }
  void set_position(int64_t step, int64_t m, const nn::Batch& batch);
  // fp16.auto_cast: `batch` with its floating-point tensors converted to the compute dtype (into
  // activation memory the model may keep for its backward); `batch` itself without auto_cast.
  nn::Batch cast_batch(const nn::Batch& batch);

  // Each set's gatherer and reducer handle the modules whose own parameters are in its layout. The
  // profiler times a module from its gathered parameters to its release (evaluation excluded).
  bool profiling() const { return profiler_ && profiler_->recording() && ctx_.training(); }
  void before_forward(nn::Module& m) override {
    for (auto& s : sets_) {
      if (s->gatherer) s->gatherer->fetch(m);
    }
    if (profiling()) profiler_->enter(m);
  }
  void after_forward(nn::Module& m) override {
    if (profiling()) profiler_->leave(m, FlopsProfiler::Pass::kForward);
    for (auto& s : sets_) {
      if (s->gatherer) s->gatherer->release(m);
    }
  }
  void before_backward(nn::Module& m) override {
    for (auto& s : sets_) {
      if (s->gatherer) s->gatherer->fetch(m);
      if (pipeline_ == nullptr) s->reducer->module_starting(m);  // a pipeline's: run_pipeline_window
    }
    if (profiling()) profiler_->enter(m);
  }
  void after_backward(nn::Module& m) override {
    if (profiling()) profiler_->leave(m, FlopsProfiler::Pass::kBackward);
    for (auto& s : sets_) {
      if (pipeline_ == nullptr) s->reducer->module_done(m);
      if (s->gatherer) s->gatherer->release(m);
    }
  }
};

}  // namespace zs::engine


