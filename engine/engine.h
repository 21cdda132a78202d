// Engine: wraps a model and a validated config, and trains it across the data-parallel ranks.
//
//   auto world = comm::World::create({.timeout_s = cfg.comm.timeout_s});  // mpirun, or a world of one
//   nn::GptModel model(*cfg.model);                       // cfg: a run::RunConfig (run/run.h); allocates nothing
//   engine::Engine engine(model, cfg, world.group());     // places and initialises the model states
//   nn::Batch batch;
//   for (int64_t step = 0; step < cfg.train_steps; ++step) {
//     for (int64_t m = 0; m < cfg.batch.gradient_accumulation_steps; ++m) {
//       fill_micro_batch(batch, step, m);                 // yours: this rank's micro-batch m of `step`
//       engine.forward(batch);
//       engine.backward();
//       engine.step();                                    // DeepSpeed style: steps at the boundary
//     }
//   }
// or, with a BatchSource, `engine.train_batch(source)` for one whole optimizer step.
// (tests/docs/usage_snippets_test.cpp compiles and runs the same lines.)
//
// Lifetime: the model and the group must outlive the engine. Destroying the engine at any point - an
// exception between forward and backward included - drops the activations the model saved and its
// parameters' views into the engine's buffers, so the model may then be destroyed or given to a new
// engine; a Tensor a model handed out keeps its bytes (Note [engine memory lifetime] in
// engine/detail/engine_context.h).
//
// What the engine owns (docs/design.md, "Model states"): flat model-state buffers in one FlatLayout -
// parameters and gradients in the compute dtype, and at the fp32 end the master weights (a separate
// buffer in bf16/fp16, the parameters themselves in fp32) and the optimizer's states - carved from
// the device arena (`device.memory_mb`) with the persistent lifetime; activations come from the same
// arena through the engine's nn::Context (saved ones with the saved lifetime, beside the model states;
// scratch and gradients from the transient pool).
//
// ZeRO stages (Note [model-state placement] in engine/placement.h):
//   0  every rank holds full replicas; at the last micro-batch of an accumulation window gradients are
//      allreduced in buckets (`reduce_bucket_size` elements) started as soon as backward has produced
//      a whole bucket (`overlap_comm`), so communication overlaps the rest of backward;
//   1  + fp32 master weights and optimizer states sharded: buckets are reduce-scattered, each rank
//      steps its shard, and the updated parameters are allgathered (`allgather_bucket_size`);
//   2  + gradients sharded: each micro-batch's buckets are reduce-scattered as they fill and added into
//      this rank's gradient shard (engine/detail/grad_reducer.h);
//   3  + parameters sharded: gathered per module just in time, prefetched, released after use
//      (engine/detail/param_gatherer.h). The model is never whole on any rank, not even at initialisation.
//
// Note [expert parameters]
// A parameter with nn::Parameter::expert_parallel_size() E > 1 (an MoE expert's; moe::MoE sets it with
// the kTagExpert tag) is held only by the ranks of its expert-data-parallel group edp = {i, i+E,
// i+2E, ...} of the data-parallel group given here (DeepSpeed's layout; the engine forms edp from that
// group with Group::split, and a world size not divisible by E is a ModelError naming both); the E
// ranks of one expert-parallel group hold different experts. The engine reads only that metadata:
//   - layouts: the dense parameters in one flat layout, the expert parameters of each distinct E in
//     their own; each has its own placement plan over its group (PlannedBuffer::group "dp" or "edp"),
//     so at stages 1-3 dense states are sharded over the W data-parallel ranks and expert states over
//     the W/E ranks of edp, exactly (model_state_bytes, the summary and the estimator add the plans);
//   - gradients: dense ones are averaged over dp as always; expert ones are averaged over edp and then
//     multiplied by 1/E. Each rank's loss is the mean over its own micro-batch, and a dense gradient is
//     averaged over all W ranks. An expert's gradient on a rank already sums what every token its
//     expert-parallel group routed to it contributed (the all-to-all's backward brings them), so the
//     model's gradient is the sum over edp divided by W, not by W/E: training is the same for every E
//     (DeepSpeed once divided by W/E and trained experts ep_size times faster);
//   - clipping and fp16 overflow: the squared norm counts every element of the world's model once:
//     at stages 1-3 each rank's shards (dense over dp, experts over edp, and EP ranks hold different
//     experts), at stage 0 each layout's whole gradients on its group's rank 0 only; one allreduce
//     over dp adds them, so every rank clips with, and skips on, the same value;
//   - ZeRO-3: expert modules are gathered over edp, just in time, with their own prefetch order; a
//     module's own parameters must all be of one E (ModelError otherwise);
//   - NVMe offload: expert states get their own swap files (`optimizer_ep<E>`, `params_ep<E>`).
// Compressed optimizers (OneBitAdam, ZeroOneAdam) are refused with expert parameters (ConfigError):
// their compressed allreduce averages one whole momentum over dp. Lamb's per-tensor sums are
// allreduced over each layout's own group. fp32_param(name) of an expert parameter is collective over
// its edp group and known only on the ranks that hold it; param_digest covers every expert of the
// model once (it exchanges per-parameter digests over dp), so it is the same for every ep_size.
//
// Note [tensor-parallel parameters]
// Tensor parallelism follows the same pattern. An engine given a tensor-parallel group of size T > 1
// (the constructor with `tensor_parallel`; comm::Topology's "tp") trains a model whose parameters
// with a non-whole nn::TensorSlice are this rank's slices of the tp = 1 model's tensors (tp/, Note
// [tensor slices] in nn/parameter.h); each slice must be of T parts, its index this rank's in the tp
// group (ModelError otherwise). Every tp rank of one data-parallel replica runs the same micro-batch,
// so the data-parallel group given here is the one the samples, the loss mean and ZeRO follow:
//   - model states: a TP shard is a parameter like any other of this rank's layout, partitioned by
//     ZeRO 1-3 over the data-parallel group only; the T ranks of a tp group hold layouts of the same
//     structure (same slots, same sizes), so their dp partitions cut at the same places. Stage-3
//     gathers and NVMe or host offload move this rank's slices only;
//   - gradient norm (clipping, fp16 overflow): every element of the tp = 1 model once: a TP shard's
//     elements on every tp rank, a parameter whose slice is whole (replicated: a norm without
//     sequence parallelism, a row layer's bias, the position embedding) on tp rank 0 only; the dp sum
//     is then summed over tp, so every rank of dp x tp clips with, and skips on, the same value. Lamb's
//     per-tensor sums are summed over tp the same way (a TP shard's), so its trust ratio is the whole
//     tensor's;
//   - replicated parameters get identical gradients on every tp rank (the layers' all-reduces make
//     their inputs and output gradients identical; with sequence parallelism a norm on sequence
//     shards sums its gradient over tp in its own backward, Note [replicated gradients of sequence
//     shards] in tp/mappings.h) and identical updates, so they stay bitwise equal; param_digest checks
//     them bitwise across tp (ModelError naming the first that differs);
//   - fp32_param(name) and param_digest see the full tp = 1 tensors (a TP shard is gathered over tp
//     into its full positions, Parameter::for_each_full_run), so tp 2 and tp 1 runs of one model give
//     the same digest; param_count counts the tp = 1 model;
//   - StepReport::tp_comm_bytes_sent: what the layers sent over the tp group during the step.
// Compressed optimizers are refused with T > 1 (ConfigError naming model.tensor_parallel_size): their
// per-chunk scales would mix TP shards and replicated parameters, so replicas would drift apart.
//
// Mixed precision follows DeepSpeed: bf16 and fp16 keep fp32 master weights; fp16 scales the loss
// dynamically and skips a step whose gradients overflow (the schedule does not advance then).
//
// Monitoring: the config's csv_monitor, tensorboard, memory_breakdown and comms_logger sections are
// acted on by the engine itself at every optimizer step, on rank 0 (engine/monitor.h); the comms_logger
// table of the whole run prints when the engine is destroyed (not while an exception unwinds). With
// flops_profiler enabled, the module hooks time each module of step `profile_step` on rank 0 and its
// profile prints when that step ends (engine/flops_profiler.h).
//
// Thread-safety: one thread drives an Engine. Every rank of the group must make the same calls.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/group.h"
#include "engine/config.h"
#include "engine/pipeline_model.h"
#include "memory/backend.h"
#include "memory/category.h"
#include "memory/tensor.h"
#include "nn/model.h"

namespace zs::engine {

struct PendingCheckpoint;  // engine_checkpoint.cpp: an asynchronous save not yet committed
struct CheckpointAccess;   // engine/detail/engine_checkpoint.h: what the checkpoint code reaches

// Supplies micro-batches for train_batch and eval_batch: fills `batch` with the samples whose global
// indices are [first_sample, first_sample + count) of optimizer step `step` (of evaluation batch `step`
// for eval_batch). A pure function of its arguments, so the global batch is the same for every world
// size and accumulation setting. Exactly `count` samples: batch.inputs (and batch.targets, when
// defined) get `count` rows (dim 0); anything else is a UsageError naming the call, right after fill.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual void fill(nn::Batch& batch, int64_t step, int64_t first_sample, int64_t count) = 0;
};

// What one optimizer step did.
struct StepReport {
  int64_t step = 0;           // optimizer steps taken so far, this one included (skipped ones too)
  double loss = 0.0;          // mean loss over the global batch (all ranks, all micro-batches)
  double lr = 0.0;            // learning rate used
  double grad_norm = 0.0;     // global gradient norm before clipping (unscaled)
  double loss_scale = 1.0;    // fp16 loss scale used for this step
  bool skipped = false;       // fp16 overflow: parameters unchanged
  double forward_s = 0.0;     // wall time of this step's forward passes
  double backward_s = 0.0;    // backward passes, including the overlapped reductions' tail
  double optimizer_s = 0.0;   // waiting for reductions + clipping + optimizer
  bool compressed = false;    // one-bit Adam / 0/1 Adam: this step consumed local gradients and
                              // communicated compressed values instead of averaging gradients
  uint64_t comm_bytes_sent = 0;  // bytes this rank sent since the previous step ended (all collectives)
  // Of those, the gradient reductions' (averaging in communication_data_type; 0 on compressed steps).
  uint64_t grad_comm_bytes_sent = 0;
  // Of comm_bytes_sent, what went over the tensor-parallel group (the TP layers' all-reduces, or
  // reduce-scatters and all-gathers with sequence parallelism); 0 without one.
  uint64_t tp_comm_bytes_sent = 0;
  // Of comm_bytes_sent, what crossed between hosts (Note [Bytes across hosts] in comm/config.h); 0 on
  // one host.
  uint64_t comm_bytes_inter_host = 0;
  // Stage 3: the modules' parameter gathers over the partition's group since the previous step (fetches and
  // prefetches, an evaluation's between the steps included; hpZ's backward gathers from its secondary
  // copies not counted), and of them the backward passes': 0
  // where the forward kept every module for its backward (`stage3_max_reuse_distance`). Where a step's
  // gathers cross hosts (`zeroshard project`: Note [the link's bucket] in project/project_compute.cpp).
  uint64_t param_gathers = 0;
  uint64_t backward_param_gathers = 0;
  // Bytes the backend moved between host and device during this step (offload's gradient and
  // parameter traffic; what a GPU user watches on PCIe).
  memory::TransferStats transfers;
  // FLOPs nn's kernels performed on this rank for this step's micro-batches (nn/flops.h), from the
  // window's first forward to the update: the model's (model FLOPs utilisation counts these) and,
  // apart, the recomputation's (activation checkpointing re-runs, selective score recompute).
  uint64_t model_flops = 0;
  uint64_t recompute_flops = 0;
  // A pipeline stage (engine/pipeline_model.h): this rank's schedule - its time, its measured bubble
  // (1 - busy / seconds), the bytes sent to the neighbouring stages; all zero otherwise.
  PipelineRun pipeline;
  double pipeline_bubble() const { return pipeline.seconds > 0 ? 1.0 - pipeline.busy_seconds / pipeline.seconds : 0.0; }
};

// Bytes of the flat model states of this rank, by category (the summary's model_states_bytes).
struct ModelStateBytes {
  uint64_t params = 0;     // compute-dtype parameters
  uint64_t grads = 0;      // compute-dtype gradients
  uint64_t optimizer = 0;  // fp32 master weights (when separate) and optimizer states
};

class Engine {
 public:
  Engine(nn::Model& model, const EngineConfig& config, const comm::Group& data_parallel);
  // Over a backend of the caller's (a test's guarded backend, the estimator's measuring one) instead
  // of memory::make_backend(config.device.backend); the arena takes the backend's device capacity.
  Engine(nn::Model& model, const EngineConfig& config, const comm::Group& data_parallel,
         std::unique_ptr<memory::Backend> backend);
  // Tensor parallelism (Note [tensor-parallel parameters]): `tensor_parallel` is this rank's "tp" group
  // of a comm::Topology whose "dp" group is `data_parallel`; a group of one is tp 1. The model's
  // tensor-parallel layers use the same group. Backend null: memory::make_backend, as above.
  Engine(nn::Model& model, const EngineConfig& config, const comm::Group& data_parallel,
         const comm::Group& tensor_parallel, std::unique_ptr<memory::Backend> backend = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The calls follow forward(batch), backward(), step() per micro-batch. A call out of that order is
  // a UsageError naming it, thrown before the engine changes anything (the engine stays usable):
  // forward() twice, backward() without a forward(), step() without a backward() since the last
  // step(), train_batch() in the middle of a window. A mistake inside the model (ModelError: a child
  // run without the Context, a skipped child backward, a module run twice; nn/context.h) or any other
  // exception thrown inside forward() leaves the engine as before that forward; inside backward() it
  // discards the gradients of the current accumulation window (Note [a failed pass] in
  // engine/detail/engine_impl.h). Either way the engine may go on or be destroyed.
  //
  // One micro-batch forward; returns its mean loss (this rank only).
  float forward(const nn::Batch& batch);
  // Backward of the last forward; at the accumulation boundary, starts the bucket reductions.
  void backward();
  // Call after every backward. At the accumulation boundary: finishes the reductions, clips, steps the
  // optimizer (or skips on fp16 overflow) and returns true; otherwise returns false.
  bool step();
  // gradient_accumulation_steps micro-batches from `source`, then one optimizer step.
  StepReport train_batch(BatchSource& source);
  // Evaluation: the mean loss (all ranks, all micro-batches) of one global batch of `source` - the
  // training batch shape, `source.fill(batch, index, ...)` - with no gradient. The model runs in
  // evaluation mode (nn::Context::training() false): modules save no activations, so the activation
  // peak is a forward's working set, not the whole forward's saved state; gradients, the optimizer,
  // the step count, the loss of the next training step and the training source are untouched. At ZeRO
  // stage 3 parameters are gathered per module and released as in a training forward. Collective.
  // A whole-batch call rather than a no-grad forward(): the engine's forward() is one half of a
  // training pair whose loss feeds the next step's report; evaluation shares neither, and one call
  // keeps the ranks' samples and the loss average the engine's business, as in train_batch.
  // Between a forward() and its backward() it is a UsageError; between micro-batches it is allowed.
  double eval_batch(BatchSource& source, int64_t index = 0);

  // The report of the last optimizer step (valid after step() returned true).
  const StepReport& last_step() const { return last_; }
  int64_t global_step() const { return global_step_; }
  const EngineConfig& config() const { return config_; }
  const comm::Group& group() const { return group_; }  // the data-parallel group
  // The tensor-parallel group, or nullptr for tp 1 (Note [tensor-parallel parameters]).
  const comm::Group* tensor_parallel() const { return tp_; }
  int tensor_parallel_size() const { return tp_ != nullptr ? tp_->size() : 1; }
  // The "pp" group when the model is a pipeline stage (engine/pipeline_model.h), else nullptr.
  const comm::Group* pipeline_parallel() const;
  int pipeline_parallel_size() const { return pipeline_parallel() != nullptr ? pipeline_parallel()->size() : 1; }
  nn::Model& model() const { return model_; }
  // ZeRO++'s host groups (Note [ZeRO++] in engine/detail/zeropp_gather.h): "hpz", the ranks of this
  // rank's host, and "hpz_across", this rank's peers on the other hosts; nullptr when not made (no
  // ZeRO++ key on, one rank, or one host group: then the dp group plays the host group's part).
  const comm::Group* zeropp_host() const;
  const comm::Group* zeropp_across() const;
  // The expert-data-parallel groups it made, one per expert_parallel_size of the model's expert
  // parameters (Note [expert parameters]); empty for a dense model.
  std::vector<const comm::Group*> expert_data_parallel() const;

  // Total parameter elements of the model (padding excluded), every expert counted once: a rank holds
  // 1 / expert_parallel_size of an expert set's experts; a TP shard counts its whole tp = 1 tensor.
  int64_t param_count() const;
  // The full fp32 parameters of parameter `name` (the master weights), in its flattened order; of a
  // TP shard, the whole tp = 1 tensor. Collective at ZeRO stage >= 1 (the master weights are sharded)
  // and, for a TP shard, over the tensor-parallel group: every rank must call it. A pipeline stage
  // (pipeline_parallel_size > 1) gives any parameter of the whole model: collective over the "pp"
  // group too (the first stage holding it sends it to the others); a name no stage holds is a
  // UsageError on every rank.
  std::vector<float> fp32_param(const std::string& name) const;
  // SHA-256 (hex) over the whole model: the concatenated SHA-256 digests of every parameter's full
  // fp32 values (little-endian bytes), parameters in name order (sorted by full name), each expert
  // once whichever rank holds it, each pipeline stage's parameters with a tied embedding's copies once.
  // Identical across ranks, world sizes, ep_sizes, tp, pp and ZeRO stages for equal models. Collective
  // at ZeRO stage >= 1, with expert parameters and over the "pp" group (engine/param_digest.cpp).
  std::string param_digest() const;
  ModelStateBytes model_state_bytes() const;
  // Optimizer-state bytes per parameter element this rank keeps, fp32 master excluded (Adam 8, CAdam
  // 1.125; one-bit optimizers count their whole momentum and error buffers): optimizer bytes over
  // the stepped elements.
  double optimizer_state_bytes_per_param() const;

  // ---- Checkpoints (docs/checkpoints.md). Collective: every rank calls them, between optimizer steps
  // (a UsageError in the middle of an accumulation window). An error on any rank (a file that cannot
  // be written or read, a checkpoint of another model) is agreed: every rank throws the same
  // CheckpointError, IoError or UsageError, naming the failing rank and the file; none hangs.
  //
  // Saves the model states under `dir`/`tag` (tag empty: "global_step<N>"): each rank writes its own
  // file (its shard of the master weights, the optimizer states under their own names, the parameters
  // in the training dtype), rank 0 the metadata (step counters, loss scaler, schedule position, the
  // MoE layers' random-draw counters, the config) and commits atomically, then keeps the newest
  // config.checkpoint.keep_last tags. Returns the tag.
  std::string save_checkpoint(const std::string& dir, const std::string& tag = "");
  // Loads `dir`/`tag` (tag empty: the one `dir`/latest names), re-sliced by parameter name for this
  // engine's world size, ZeRO stage, offload target and ep_size; the next train_batch continues with
  // the step and the data the saved run would have used next. A model of other parameters or shapes,
  // or an optimizer whose states cannot continue from the saved ones, is a CheckpointError saying what
  // differs. After an error while reading data (a corrupt file) the engine's states are partly
  // overwritten: load again or rebuild the engine. Returns the tag loaded.
  std::string load_checkpoint(const std::string& dir, const std::string& tag = "");
  // With checkpoint.async, save_checkpoint returns once this rank's states are copied to host memory
  // (a snapshot of its shard, taken in 4 MiB pieces); a background thread writes its file while
  // training goes on, and the save is committed (metadata, `latest`, keep_last) by this call, which the
  // next save_checkpoint and load_checkpoint make first. Collective; errors agreed as above. A save
  // never committed (the engine destroyed first) leaves the previous checkpoint as `latest`. No-op
  // when no save is pending.
  void wait_checkpoint();
  // Where this rank's last committed asynchronous save spent its time (all zero before the first):
  // wall seconds unless named cpu, the calling thread's unless named write or writer.
  struct AsyncSaveTimes {
    double save_call_s = 0, save_call_cpu_s = 0;  // save_checkpoint: the snapshot and the setup
    double write_create_s = 0;  // the writer thread: the file and its datasets created
    double write_data_s = 0;    // the writer thread: HDF5 writes and checksums (writeback started)
    double write_finish_s = 0;  // the writer thread: close, fsync (and rank 0's metadata file)
    double writer_cpu_s = 0;    // the writer thread's CPU time, all of it
    double commit_wait_s = 0;   // wait_checkpoint (or the next save) waiting for the writer
    double commit_s = 0, commit_cpu_s = 0;  // then the commit: agreement, renames, fsyncs, keep_last
  };
  const AsyncSaveTimes& last_async_save() const { return last_async_save_; }

  // Memory accounting of this rank.
  struct MemoryReport {
    ModelStateBytes model_states;
    // The same buffers by tier: device blocks at their requested size; host buffers and swap-file
    // regions at what they map or reserve (each rounded up to 4096 bytes), as estimate/estimate.h counts.
    ModelStateBytes device_states, host_states, nvme_states;
    uint64_t device_peak_bytes = 0;           // peak of allocated bytes in the device arena
    // What the device peak was made of: bytes by memory::Category (params: the shard or replica,
    // gathered and persistent parameters; grads: gradient buffers and bucket staging; optimizer;
    // activations; comm_buffers; offload_buffers) at the moment it was reached (64-byte blocks).
    std::array<uint64_t, memory::kNumCategories> device_peak_by_category{};
    uint64_t device_reserved_peak_bytes = 0;  // peak of reserved bytes (allocated + pool holes)
    uint64_t device_capacity_bytes = 0;
    uint64_t host_peak_bytes = 0;             // tracked host-tier bytes (offload buffers; 0 without offload)
    uint64_t nvme_bytes = 0;
    uint64_t activation_peak_bytes = 0;       // peak of activation bytes in the arena
    uint64_t grad_staging_peak_bytes = 0;     // stage 2+: peak of gradient bucket staging buffers
    uint64_t gathered_param_peak_bytes = 0;   // stage 3: peak of gathered (whole) parameters
    uint64_t gathered_param_bound_bytes = 0;  // stage 3: the documented bound on the above
  };
  MemoryReport memory_report() const;

  // What offload did on this rank (zeros without NVMe offload).
  struct OffloadReport {
    uint64_t host_budget_bytes = 0;  // the step swapper's host buffers, computed up front
    uint64_t bytes_read = 0;         // optimizer sub-groups and stage-3 parameter reads from NVMe
    uint64_t bytes_written = 0;
    double compute_s = 0;            // optimizer compute inside the swapper
    double io_wait_s = 0;            // the optimizer waiting for the disk
  };
  OffloadReport offload_report() const;

  // Activation checkpointing on this rank (engine/recompute_config.h): the modules marked checkpointed,
  // their re-runs so far (counts) and the seconds the re-runs took (kept inputs' restore included).
  struct RecomputeReport {
    std::string blocks;                  // checkpoint_blocks as chosen ("none", "all", "first 3", ...)
    int64_t checkpointed_modules = 0;
    int64_t recomputes = 0;
    double recompute_s = 0.0;
    uint64_t contiguous_buffer_bytes = 0;  // contiguous_memory_optimization's buffer (0: none)
  };
  RecomputeReport recompute_report() const;

 private:
  class Impl;
  friend class EngineContext;
  // What the checkpoint code may reach (engine/detail/engine_checkpoint.h): handed over, no friend.
  CheckpointAccess checkpoint_access();
  void start(std::unique_ptr<memory::Backend> backend);  // the constructors' common part
  // fp32_param of a pipeline stage: `held` where this stage has `name` (engine_pipeline.cpp).
  std::vector<float> pipeline_fp32_param(const std::string& name, bool held) const;
  nn::Model& model_;
  EngineConfig config_;
  const comm::Group& group_;
  const comm::Group* tp_ = nullptr;  // null: tp 1
  std::unique_ptr<Impl> impl_;
  StepReport last_;
  int64_t global_step_ = 0;
  AsyncSaveTimes last_async_save_;
  // Declared last, so destroyed first: joins the writer thread (shared_ptr: complete only in
  // engine_checkpoint.cpp).
  std::shared_ptr<PendingCheckpoint> pending_checkpoint_;
};

}  // namespace zs::engine
