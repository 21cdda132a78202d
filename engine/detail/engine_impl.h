// Engine::Impl: the engine's state, shared by engine.cpp (placement, forward, backward, reports),
// engine_step.cpp (the optimizer step of elementwise optimizers and the memory-reuse modes) and
// compressed_step.cpp (one-bit Adam and 0/1 Adam). Internal: not installed.
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
#include "engine/detail/engine_context.h"
#include "engine/flat_layout.h"
#include "engine/detail/grad_reducer.h"
#include "engine/detail/param_gatherer.h"
#include "engine/partition.h"
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

// Elements one optimizer piece covers: a thread converts the gradient (and, with reuse_fp32_param,
// decodes the master weights) of one piece into its own scratch, so the scratch stays in cache.
inline constexpr size_t kPieceElements = size_t{1} << 16;
// Elements initialisation and gathering convert at a time: 256 KiB of fp32 scratch.
inline constexpr size_t kChunkElements = size_t{1} << 16;
// Optimizer states an optimizer may keep (Adam 2, CAdam 2); checked when the engine is built.
inline constexpr size_t kMaxStates = 8;

// A flat model-state buffer: in the device arena, or on the host when offloaded.
struct StateBuffer {
  memory::DeviceBlock device;
  offload::AlignedBuffer host;
  void* data() const { return device.empty() ? static_cast<void*>(host.data()) : device.data(); }
  size_t size() const { return device.empty() ? host.size() : device.size(); }
  bool empty() const { return device.empty() && host.empty(); }
  memory::Tier tier() const { return host.empty() ? memory::Tier::kDevice : memory::Tier::kHost; }
};

// NVMe offload (offload_optimizer and/or offload_param device nvme): the swap files and the
// sub-groups the optimizer step streams (Note [offload] in engine_offload.cpp).
struct NvmeOffload {
  std::unique_ptr<offload::SwapSpace> optimizer_swap;  // master + optimizer states
  offload::SwapRegion master;
  std::vector<offload::SwapRegion> states;
  std::unique_ptr<offload::SwapSpace> param_swap;      // the stage-3 parameter shard
  offload::SwapRegion params;
  size_t sub_group = 0;                                // elements per sub-group
  std::unique_ptr<offload::PipelinedSwapper> swapper;  // the step's sub-groups
  size_t host_budget_bytes = 0;                        // the step swapper's buffers
};

// One-bit Adam / 0/1 Adam state (compressed_step.cpp). The momentum is whole on every rank: the
// compressed allreduce needs each rank's whole local momentum (Note [compressed optimizers]).
struct CompressedState {
  StateBuffer exp_avg;      // fp32, every element of the model (the plan's "momentum")
  StateBuffer exp_avg_sq;   // fp32, the stepped range ("variance")
  StateBuffer accumulator;  // fp32, every element: 0/1 Adam's u at stage 0 (local steps); else empty
  std::optional<comm::OneBitAllreduce> reduce;
  std::optional<optim::ZeroOneSchedule> schedule;
  bool momentum_whole = false;      // the momentum outside the stepped range is valid (gathered at freeze)
  bool errors_reset = false;        // 0/1 Adam: error buffers were zeroed when the variance froze
};

// Allgathers `all` in place, in pieces of `bucket_elements` (at least FlatLayout::kAlignElements):
// each rank contributes the part of every piece that `partition` says it owns. Collective.
void allgather_in_place(const comm::Group& group, const Partition& partition, const memory::Tensor& all,
                        size_t bucket_elements);

struct CheckpointSnapshot;  // engine/detail/engine_checkpoint.h

// One flat layout's model states, sharded over one partition group (Note [expert parameters] in
// engine/engine.h): the dense parameters over the data-parallel group, the parameters of each
// expert_parallel_size E > 1 over their expert-data-parallel group. Each set has its own placement
// plan, buffers, gradient reducer and (stage 3) parameter gatherer; the Impl's methods take the set
// they work on.
struct StateSet {
  StateSet(ParamGroup params, const comm::Group& group, const PlacementRules& rules)
      : group(group),
        layout(std::move(params.params)),
        partition(layout.total(), group.size(), group.rank()),
        plan(plan_placement(rules, layout.total(), partition, group.name())) {}

  const comm::Group& group;  // the data-parallel group, or an expert-data-parallel group the Impl owns
  FlatLayout layout;
  Partition partition;
  const PlacementPlan plan;
  StateBuffer params;            // empty with offload_param nvme
  StateBuffer grads;
  StateBuffer master;            // fp32 master of the stepped range (separate_master_, not on NVMe)
  StateBuffer residual;          // reuse_: low 16 bits of the encoded master, the stepped range
  StateBuffer grad32;            // keep_fp32_grads_: fp32 gradients of grad32_range()
  std::vector<StateBuffer> states;  // empty with offload_optimizer nvme
  std::optional<NvmeOffload> nvme;
  memory::Segment measure_param_shard;  // measuring with NVMe parameters: the gatherer's stand-in shard
  std::optional<GradReducer> reducer;
  std::optional<ParamGatherer> gatherer;

  int expert_parallel_size() const { return layout.expert_parallel_size(); }
  bool expert() const { return expert_parallel_size() > 1; }
  // What the reduced (averaged over `group`) gradients are multiplied by to be averaged over the
  // data-parallel group: 1 for dense, 1/E for experts (Note [expert parameters]).
  double grad_factor() const { return 1.0 / expert_parallel_size(); }
  // The elements this rank's optimizer updates: everything at stage 0, its shard otherwise.
  memory::ShardRange step_range() const { return plan.stepped; }
  memory::ShardRange whole() const { return {0, layout.total()}; }
  memory::ShardRange grad_range() const { return plan.grads; }        // the gradient elements held
  memory::ShardRange grad32_range() const { return plan.fp32_grads; }  // what grad32 covers, when kept
  size_t params_base() const { return plan.params.offset; }
};

// Where each model-state buffer lives is the placement plan's (Note [model-state placement] in
// engine/placement.h): the constructor allocates what each set's plan lists, and the estimator reads
// the same plans.
class Engine::Impl final : public ModuleHooks {
 public:
  // `backend` null: memory::make_backend(cfg.device.backend).
  Impl(nn::Model& model, const EngineConfig& cfg, const comm::Group& group, std::unique_ptr<memory::Backend> backend);
  ~Impl() override;

  const EngineConfig& cfg_;
  const comm::Group& group_;
  // The expert-data-parallel groups, one per distinct expert_parallel_size (formed from group_ with
  // DeepSpeed's layout: {i, i+E, i+2E, ...}). Declared before sets_, which refer to them.
  std::vector<std::unique_ptr<comm::Group>> expert_groups_;
  // sets_[0]: the dense parameters (always there, possibly empty); then one per expert_parallel_size.
  // Cleared first by ~Impl: their buffers live in arena_ below.
  std::vector<std::unique_ptr<StateSet>> sets_;
  const PlacementPlan& plan_;  // sets_[0]'s; the flags below are the same in every set's plan
  const int stage_;
  const int grad_stage_;  // the stage whose gradient layout the reducer uses
  const memory::DType dtype_;
  const size_t elem_;
  const bool reuse_;            // reuse_fp32_param
  const bool keep_fp32_grads_;  // !release_fp32_grad in bf16/fp16
  const OffloadDevice offload_optimizer_;
  const OffloadDevice offload_param_;
  const bool separate_master_;  // the fp32 master is its own buffer (bf16/fp16, or anything offloaded)
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
  int64_t window_tokens_ = 0;    // token ids this rank fed in the window (integer inputs only)
  std::unique_ptr<TrainingMonitor> monitor_;  // when the config enables a monitor (engine/monitor.h)
  std::unique_ptr<FlopsProfiler> profiler_;   // flops_profiler enabled, rank 0 (engine/flops_profiler.h)
  uint64_t bytes_sent_at_step_start_ = 0;
  uint64_t grad_bytes_sent_at_step_start_ = 0;  // the reducers' bytes_sent, summed over the sets
  memory::TransferStats transfers_at_step_start_;
  std::vector<float> scratch_;                  // initialisation and gathering, one thread
  std::vector<std::vector<float>> grad_scratch_;    // per thread, kPieceElements
  std::vector<std::vector<float>> master_scratch_;  // per thread, kPieceElements (reuse_)
  // Optimizer offloaded: per thread, the updated compute-dtype parameters of a piece on the host,
  // copied to the device parameters through the backend (a counted host -> device transfer).
  std::vector<std::vector<std::byte>> low_scratch_;
  // Device access held from the boundary backward until step() has waited for its reductions:
  // nonblocking collectives write device memory in between (memory::DeviceAccess).
  std::optional<memory::DeviceAccess> reductions_access_;
  // The host copy asynchronous checkpoint saves write from, kept between saves from the first one on
  // (Note [async snapshot] in engine/engine_checkpoint.cpp).
  std::shared_ptr<CheckpointSnapshot> checkpoint_snapshot_;

  bool mixed() const { return dtype_ != memory::DType::kF32; }
  // The step runs on the host (its master and states offloaded): it reaches device gradients and
  // parameters through backend transfers.
  bool step_on_host() const { return offload_optimizer_ != OffloadDevice::kNone; }
  // False over the measuring backend (the estimator): kernels are skipped, files are not made.
  bool kernels() const { return backend_->runs_kernels(); }
  StateSet& dense() const { return *sets_.front(); }
  bool has_experts() const { return sets_.size() > 1; }
  // Flat element `i` of each buffer of set `s` (i must lie in what the buffer holds).
  char* param_at(const StateSet& s, size_t i) const {
    return static_cast<char*>(s.params.data()) + (i - s.params_base()) * elem_;
  }
  char* grad_at(const StateSet& s, size_t i) const {
    return static_cast<char*>(s.grads.data()) + (i - s.grad_range().offset) * elem_;
  }
  // fp32 master of element i of the stepped range; not with reuse_ (use with_master).
  float* master_at(const StateSet& s, size_t i) const;
  void* state_at(const StateSet& s, size_t k, size_t i) const;
  static float* f32_at(void* base, memory::ShardRange held, size_t i) {
    return static_cast<float*>(base) + (i - held.offset);
  }
  bool optimizer_on_nvme() const { return offload_optimizer_ == OffloadDevice::kNvme; }
  bool params_on_nvme() const { return offload_param_ == OffloadDevice::kNvme; }
  // Allocates `bytes` on the device arena, or on the host when `host` (an offloaded buffer).
  StateBuffer place(size_t bytes, memory::Category category, bool host);
  // The constructor's second half: every set's buffers, parameters, reducer and gatherer.
  void place_all(nn::Model& model);
  void place_buffers(StateSet& s, std::optional<CompressedState>& compressed);
  void make_reducer_and_gatherer(StateSet& s, const std::vector<nn::Module*>& modules);

  // Gradients [i, i+n) of set s in fp32 (n <= kPieceElements): grad32 itself, the buffer itself in
  // fp32, or converted into thread `t`'s scratch.
  std::span<const float> grad_f32(const StateSet& s, size_t i, size_t n, int t);
  // Calls fn(master, low_precision) for the stepped elements [i, i+n) of set s (n <= kPieceElements):
  // the master pointer is the fp32 master (or the parameters in fp32) and low_precision the bf16/fp16
  // parameters to write (nullptr in fp32); with reuse_, the master is decoded into thread t's scratch
  // first and encoded back after, and low_precision is nullptr (the encoding writes the parameters).
  template <typename F>
  void with_master(const StateSet& s, size_t i, size_t n, int t, F&& fn);
  // fn(at, n, apply_weight_decay, thread) over `range` of set s, slot by slot, pieces of at most
  // kPieceElements starting at multiples of 32 from the slot part's start, spread over the rank's
  // threads. fn must only touch elements [at, at + n) of the buffers.
  template <typename F>
  void for_each_piece(const StateSet& s, memory::ShardRange range, F&& fn);
  // fn(at, n, thread) over `range` cut into pieces of `piece` elements (the last may be shorter),
  // spread over the rank's threads; the cut does not depend on the thread count.
  template <typename F>
  void for_each_span(memory::ShardRange range, size_t piece, F&& fn) const;

  void place_parameters(StateSet& s);
  void initialise(StateSet& s);
  void init_f32(const StateSet& s, float* dst, memory::ShardRange range) const;
  void allgather_params(StateSet& s);
  std::vector<float> gather_fp32(const StateSet& s, const ParamSlot& slot);
  // The fp32 master of [range) (within the stepped range) into dst.
  void read_master(const StateSet& s, memory::ShardRange range, float* dst);

  // engine_offload.cpp
  void init_nvme(StateSet& s);
  // Runs the step of set s's stepped elements, streaming sub-groups through the swapper when states
  // or parameters are on NVMe.
  void step_offloaded(StateSet& s, const optim::StepContext& ctx);
  uint64_t nvme_bytes() const;
  void read_nvme_master(const StateSet& s, memory::ShardRange range, float* dst);
  // engine_step.cpp
  void fill_grad32(StateSet& s);
  // This rank's part of the squared gradient norm of set s, over the elements it counts (the stepped
  // range, or the local gradients), in the reduced gradients' scale times grad_factor().
  double grad_sum_of_squares(const StateSet& s, memory::ShardRange range);
  void step_set(StateSet& s, const optim::StepContext& ctx);
  void step_elementwise(StateSet& s, const optim::StepContext& ctx);
  // The two-pass step of an optimizer with tensor_sums() > 0 (Note [two-pass step] in engine_step.cpp):
  // collective at stages 1-3 (one allreduce of the per-tensor sums over the set's group).
  void step_tensorwise(StateSet& s, const optim::StepContext& ctx);
  // One optimizer call on the stepped elements [at, at+n): gradients converted in thread t's scratch;
  // `low` (nullptr: none) receives the updated bf16/fp16 parameters, or in fp32 a copy of the master.
  void step_piece(const StateSet& s, const optim::StepContext& ctx, size_t at, size_t n, bool decay, int t,
                  float* master, std::span<void* const> states, void* low);
  // compressed_step.cpp (dense parameters only: experts are refused with compressed optimizers)
  void init_compressed(CompressedState state);  // the placed buffers
  bool exact_gradients(int64_t step) const;  // false: the step consumes local gradients
  void step_compressed(const optim::StepContext& ctx);
  void gather_momentum();
  uint64_t compressed_state_bytes() const;

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
      s->reducer->module_starting(m);
    }
    if (profiling()) profiler_->enter(m);
  }
  void after_backward(nn::Module& m) override {
    if (profiling()) profiler_->leave(m, FlopsProfiler::Pass::kBackward);
    for (auto& s : sets_) {
      s->reducer->module_done(m);
      if (s->gatherer) s->gatherer->release(m);
    }
  }
};

}  // namespace zs::engine

#include "engine/detail/engine_impl_inl.h"
