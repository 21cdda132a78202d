// ModelStates: the owner of one state set's model states (the dense parameters, or the parameters
// of one expert_parallel_size): its placement plan's buffers, where each lives and how the fp32 master
// is encoded. Internal: not installed.
//
//   ModelStates& s = ...;                               // one per state set, made by the engine
//   s.place(env, compressed);                           // the plan's buffers, in its order
//   s.read_master({at, n}, host_floats);                // any tier, any encoding
//   s.with_master(at, n, thread, [&](float* master, void* low) { ... });
//   s.step(optimizer, ctx);                             // every stepped piece, streamed from NVMe if there
//
// Note [State owner]
// Where the fp32 master of an element lives depends on the precision, the memory modes and the
// offload targets: the parameters themselves (fp32, nothing offloaded), a separate fp32 buffer on the
// device or the host (bf16/fp16, or anything offloaded), a swap-file region (offload_optimizer nvme),
// or nowhere as such (reuse_fp32_param: the bf16 parameter's bits plus a 16-bit residual, Note
// [reuse_fp32_param] in model_states_step.cpp). The low-precision parameters the model computes with
// live on the device, the host or in a swap file (offload_param), and the optimizer states beside
// the master. This class is the only code that knows those tiers and encodings: the engine's step,
// its reports, its digest and the checkpoint code reach the states through the operations below (read
// or write a range's master, run a function over a piece's master, step each piece, move bytes of a
// named buffer), so a new tier or encoding changes this class and nothing else. The buffers are the
// placement plan's (Note [model-state placement] in engine/placement.h), told apart by their
// BufferRole, never by name; the names written into checkpoint files are the checkpoint code's own
// (Note [checkpoint buffers] in engine_checkpoint_items.cpp). One owner per state set: the expert
// sets are planned, placed and stepped by the same code over their expert-data-parallel groups.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_set>
#include <vector>

#include "comm/group.h"
#include "engine/config.h"
#include "engine/engine.h"
#include "engine/detail/grad_reducer.h"
#include "engine/detail/param_gatherer.h"
#include "engine/flat_layout.h"
#include "engine/offload_rules.h"
#include "engine/partition.h"
#include "engine/placement.h"
#include "memory/allocator.h"
#include "memory/backend.h"
#include "memory/tracker.h"
#include "offload/swap_space.h"
#include "offload/swapper.h"
#include "optim/optimizer.h"

namespace zs::engine {

// Elements one optimizer piece covers: a thread converts the gradient (and, with reuse_fp32_param,
// decodes the master weights) of one piece into its own scratch, so the scratch stays in cache.
inline constexpr size_t kPieceElements = size_t{1} << 16;
// Elements initialisation and gathering convert at a time: 256 KiB of fp32 scratch.
inline constexpr size_t kChunkElements = size_t{1} << 16;
// Optimizer states an optimizer may keep (Adam 2, CAdam 2); checked when the engine is built.
inline constexpr size_t kMaxStates = 8;

// reuse_fp32_param's encoding (Note [reuse_fp32_param] in model_states_step.cpp): the master's bits u
// are stored as w = u + 0x8000, upper half in the bf16 parameter, lower half in the residual.
void encode_master(const float* master, uint16_t* param_bf16, uint16_t* residual, size_t n);
void decode_master(const uint16_t* param_bf16, const uint16_t* residual, float* master, size_t n);

// Allgathers `all` in place, in pieces of `bucket_elements` (at least FlatLayout::kAlignElements):
// each rank contributes the part of every piece that `partition` says it owns. Collective.
void allgather_in_place(const comm::Group& group, const Partition& partition, const memory::Tensor& all,
                        size_t bucket_elements);

// A flat model-state buffer: in the device arena, or on the host when offloaded.
struct StateBuffer {
  memory::DeviceBlock device;
  offload::AlignedBuffer host;
  void* data() const { return device.empty() ? static_cast<void*>(host.data()) : device.data(); }
  size_t size() const { return device.empty() ? host.size() : device.size(); }
  bool empty() const { return device.empty() && host.empty(); }
  memory::Tier tier() const { return host.empty() ? memory::Tier::kDevice : memory::Tier::kHost; }
};

// The compressed optimizers' buffers (one-bit Adam, 0/1 Adam), placed by the dense set's owner from
// its plan and then held by the engine's CompressedState (engine_impl.h).
struct CompressedBuffers {
  StateBuffer momentum;     // BufferRole::kMomentum
  StateBuffer variance;     // BufferRole::kVariance
  StateBuffer accumulator;  // BufferRole::kAccumulator (0/1 Adam at stage 0), else empty
};

// What every set's owner shares with the engine: its settings, memory and per-thread scratch.
struct StateEnv {
  StateEnv(const EngineConfig& cfg, memory::Backend& backend, memory::DeviceAllocator& device,
           memory::MemoryTracker& tracker, const optim::Optimizer* optimizer, int rank, int threads,
           const comm::Group* tp = nullptr);

  const EngineConfig& cfg;
  memory::Backend& backend;
  memory::DeviceAllocator& device;
  memory::MemoryTracker& tracker;
  const optim::Optimizer* optimizer;  // nullptr: a compressed optimizer (no elementwise states)
  const int rank;                     // this rank in the data-parallel group (names the swap files)
  // The tensor-parallel group when tp > 1, else null (Note [tensor-parallel parameters] in
  // engine/engine.h): TP shards' per-tensor sums are summed over it.
  const comm::Group* const tp;
  const memory::DType dtype;          // the training dtype
  const size_t elem;                  // its bytes
  std::span<const optim::StateSpec> specs;  // the optimizer's states (empty when compressed)
  std::vector<float> scratch;                    // initialisation and gathering, one thread
  std::vector<std::vector<float>> grad_scratch;      // per thread, kPieceElements
  std::vector<std::vector<float>> master_scratch;    // per thread, kPieceElements (reuse_fp32_param)
  // Optimizer offloaded: per thread, the updated compute-dtype parameters of a piece on the host,
  // copied to the device parameters through the backend (a counted host -> device transfer).
  std::vector<std::vector<std::byte>> low_scratch;

  int threads() const { return static_cast<int>(grad_scratch.size()); }
  // Whether this rank counts parameter `p` in sums over the whole model (the gradient norm): a TP
  // shard on every tp rank, a replicated parameter on tp rank 0 only.
  // A pipeline stage's copy of a parameter another stage counts (a tied embedding) is not counted.
  bool counts(const nn::Parameter& p) const {
    return (tp == nullptr || tp->rank() == 0 || !p.tensor_slice().whole()) && !uncounted.contains(&p);
  }
  std::unordered_set<const nn::Parameter*> uncounted;
  bool mixed() const { return dtype != memory::DType::kF32; }
  // False over the measuring backend (the estimator): kernels are skipped, files are not made.
  bool kernels() const { return backend.runs_kernels(); }
};

// NVMe offload (offload_optimizer and/or offload_param device nvme): the swap files and the
// sub-groups the optimizer step streams (Note [offload] in model_states_nvme.cpp).
struct NvmeOffload {
  std::unique_ptr<offload::SwapSpace> optimizer_swap;  // master + optimizer states
  offload::SwapRegion master;
  std::vector<offload::SwapRegion> states;
  std::unique_ptr<offload::SwapSpace> param_swap;      // the stage-3 parameter shard
  offload::SwapRegion params;
  NvmeSubGroupItems items;                             // what each sub-group holds, by name
  size_t sub_group = 0;                                // elements per sub-group
  std::unique_ptr<offload::PipelinedSwapper> swapper;  // the step's sub-groups
  size_t host_budget_bytes = 0;                        // the step swapper's buffers
};

// One flat layout's model states, sharded over one partition group (Note [expert parameters] in
// engine/engine.h): the dense parameters over the data-parallel group, the parameters of each
// expert_parallel_size E > 1 over their expert-data-parallel group. Each set has its own placement
// plan, buffers, gradient reducer and (stage 3) parameter gatherer (Note [State owner]).
class ModelStates {
 public:
  ModelStates(ParamGroup params, const comm::Group& group, const PlacementRules& rules)
      : group(group),
        layout(std::move(params.params)),
        partition(layout.total(), group.size(), group.rank()),
        plan(plan_placement(rules, layout.total(), partition, group.name(), layout.param_ranges())) {}
  ModelStates(const ModelStates&) = delete;
  ModelStates& operator=(const ModelStates&) = delete;

  const comm::Group& group;  // the data-parallel group, or an expert-data-parallel group the Impl owns
  const FlatLayout layout;
  const Partition partition;
  const PlacementPlan plan;
  std::optional<GradReducer> reducer;
  std::optional<ParamGatherer> gatherer;
  // ZeRO++'s host groups over `group` (Note [ZeRO++] in engine/detail/zeropp_gather.h), set before
  // initialise_and_bind; null without ZeRO++ (or with one rank).
  const ZeroppGroups* zeropp = nullptr;

  int expert_parallel_size() const { return layout.expert_parallel_size(); }
  bool expert() const { return expert_parallel_size() > 1; }
  // What the reduced (averaged over `group`) gradients are multiplied by to be averaged over the
  // data-parallel group: 1 for dense, 1/E for experts (Note [expert parameters]).
  double grad_factor() const { return 1.0 / expert_parallel_size(); }
  // The elements this rank's optimizer updates: everything at stage 0, its shard otherwise.
  memory::ShardRange step_range() const { return plan.stepped; }
  memory::ShardRange whole() const { return {0, layout.total()}; }
  memory::ShardRange grad_range() const { return plan.grads; }  // the gradient elements held

  // --- Placement and initialisation (model_states.cpp, model_states_nvme.cpp) ---
  // Allocates the plan's buffers in its order (swap-file regions come with initialise_and_bind, the
  // error feedback with comm's compressed allreduce); the compressed optimizers' into `compressed`.
  void place(StateEnv& env, CompressedBuffers* compressed);
  // Points the model's parameters at their buffers, writes the initial values (into memory and swap
  // files; nothing over the measuring backend) and makes the reducer and the gatherer.
  void initialise_and_bind(const std::vector<nn::Module*>& modules);

  // --- The master, any tier and encoding ---
  // The fp32 master of `range` (within the stepped range) into host memory `dst`.
  void read_master(memory::ShardRange range, float* dst) const;
  // Sets the master of `range` from host memory `src`, and the training-dtype parameters with it (the
  // master rounded, as every step writes them).
  void write_master(memory::ShardRange range, const float* src);
  // Calls fn(master, low_precision) for the stepped elements [i, i+n) (n <= kPieceElements) on
  // thread t: the master pointer is the fp32 master (or the parameters in fp32) and low_precision the
  // bf16/fp16 parameters to write (nullptr in fp32); with reuse_fp32_param, the master is decoded
  // into thread t's scratch first and encoded back after, and low_precision is nullptr (the encoding
  // writes the parameters). Not with the optimizer on NVMe (the step streams it: step()).
  template <typename F>
  void with_master(size_t i, size_t n, int t, F&& fn) const;
  // The fp32 master of the stepped elements [i, i+n), read only (decoded into thread t's scratch
  // with reuse_fp32_param). Not with the optimizer on NVMe.
  const float* master_view(size_t i, size_t n, int t) const;
  // The optimizer state k's values for stepped element i (block-quantised: i's block).
  void* state_at(size_t k, size_t i) const;

  // --- Gradients ---
  // Gradients [i, i+n) in fp32 (n <= kPieceElements): the fp32 copy, the buffer itself in fp32, or
  // converted into thread t's scratch.
  std::span<const float> grad_f32(size_t i, size_t n, int t) const;
  // release_fp32_grad off: the persistent fp32 copy from the reduced gradients (else nothing).
  void fill_fp32_grads();
  void zero_grads();       // the gradient buffer
  void zero_fp32_grads();  // the persistent fp32 copy, when kept

  // --- The step (model_states_step.cpp, model_states_nvme.cpp) ---
  // One update of every stepped element by an elementwise optimizer, streamed through the swap files
  // when states or parameters are on NVMe; the two-pass one of an optimizer with tensor_sums() > 0
  // (Note [two-pass step]; collective over `group` at stages 1-3).
  void step(optim::Optimizer& optimizer, const optim::StepContext& ctx);
  // Stages 1-2: gathers the other ranks' updated shards of the parameters, in place. Collective.
  void allgather_params();
  // The first sub-groups of NVMe optimizer states are read while the last backward runs.
  void prefetch_states();
  // Runs fn(at, n, thread) over `range` cut into pieces of `piece` elements (the last may be shorter),
  // spread over the rank's threads; the cut does not depend on the thread count.
  template <typename F>
  void for_each_span(memory::ShardRange range, size_t piece, F&& fn) const;
  // fn(at, n, apply_weight_decay, thread) over `range`, slot by slot, pieces of at most
  // kPieceElements starting at multiples of 32 from the slot part's start, spread over the threads.
  // fn must only touch elements [at, at + n) of the buffers.
  template <typename F>
  void for_each_piece(memory::ShardRange range, F&& fn) const;

  // --- Named buffers by bytes (the checkpoint code) ---
  // The training-dtype parameters [range) into host memory (NVMe or memory).
  void read_params(memory::ShardRange range, void* dst) const;
  // Bytes [offset, offset + bytes) of optimizer state k, from its stepped range's start.
  void read_state(size_t k, size_t offset, void* dst, size_t bytes) const;
  void write_state(size_t k, size_t offset, const void* src, size_t bytes);
  // Bytes [offset, offset + bytes) of a buffer the owner placed (the compressed buffers).
  void read_bytes(const StateBuffer& b, size_t offset, void* dst, size_t bytes) const;
  void write_bytes(const StateBuffer& b, size_t offset, const void* src, size_t bytes) const;

  // --- Reports ---
  void add_state_bytes(ModelStateBytes& b) const;  // model_state_bytes(): byte sums by category
  void add_tier_bytes(Engine::MemoryReport& r) const;  // the device/host/NVMe sums of memory_report()
  uint64_t optimizer_state_bytes() const;  // the optimizer's states (master excluded)
  void add_offload(Engine::OffloadReport& r) const;
  uint64_t nvme_bytes() const;  // the swap files' size

 private:
  // Flat element i of the parameters / gradients (i must lie in what the buffer holds).
  char* param_at(size_t i) const { return static_cast<char*>(params_.data()) + (i - plan.params.offset) * env_->elem; }
  char* grad_at(size_t i) const { return static_cast<char*>(grads_.data()) + (i - plan.grads.offset) * env_->elem; }
  // fp32 master of element i of the stepped range, in memory; not with reuse_fp32_param.
  float* master_at(size_t i) const;
  uint16_t* residual_at(size_t i) const { return static_cast<uint16_t*>(residual_.data()) + (i - plan.stepped.offset); }
  static float* f32_at(void* base, memory::ShardRange held, size_t i) { return static_cast<float*>(base) + (i - held.offset); }
  bool mixed() const { return env_->mixed(); }
  bool optimizer_on_nvme() const { return cfg().zero.offload_optimizer.device == OffloadDevice::kNvme && plan.stage >= 1; }
  bool params_on_nvme() const { return cfg().zero.offload_param.device == OffloadDevice::kNvme && plan.stage == 3; }
  // The step runs on the host (its master and states offloaded): it reaches device gradients and
  // parameters through backend transfers.
  bool step_on_host() const { return cfg().zero.offload_optimizer.device != OffloadDevice::kNone && plan.stage >= 1; }
  const EngineConfig& cfg() const { return env_->cfg; }
  memory::Backend& backend() const { return env_->backend; }

  StateBuffer allocate(size_t bytes, memory::Category category, bool host) const;
  void bind_parameters();
  void make_reducer_and_gatherer(const std::vector<nn::Module*>& modules);
  void init_f32(float* dst, memory::ShardRange range) const;
  void initialise();
  // model_states_nvme.cpp
  void init_nvme();
  void step_streamed(optim::Optimizer& optimizer, const optim::StepContext& ctx);
  void nvme_io(offload::SwapSpace& swap, const offload::SwapRegion& region, uint64_t offset, void* host, size_t bytes,
               bool write) const;
  // model_states_step.cpp
  void step_elementwise(optim::Optimizer& optimizer, const optim::StepContext& ctx);
  void step_tensorwise(optim::Optimizer& optimizer, const optim::StepContext& ctx);
  void step_piece(optim::Optimizer& optimizer, const optim::StepContext& ctx, size_t at, size_t n, bool decay,
                  int t, float* master, std::span<void* const> states, void* low) const;

  StateEnv* env_ = nullptr;      // set by place()
  StateBuffer params_;           // empty with offload_param nvme
  StateBuffer grads_;
  StateBuffer master_;           // fp32 master of the stepped range (plan.separate_master, not on NVMe)
  StateBuffer residual_;         // reuse_fp32_param: low 16 bits of the encoded master, the stepped range
  StateBuffer grad32_;           // keep_fp32_grads: fp32 gradients of plan.fp32_grads
  std::vector<StateBuffer> states_;  // empty with offload_optimizer nvme
  std::optional<NvmeOffload> nvme_;
  memory::Segment measure_param_shard_;  // measuring with NVMe parameters: the gatherer's stand-in shard
};

}  // namespace zs::engine

#include "engine/detail/model_states_inl.h"
