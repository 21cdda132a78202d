// Memory estimator: bytes per rank of the model states (parameters, gradients, optimizer states) at
// each ZeRO stage and on each tier (device, host, NVMe), plus the NVMe offload's host buffers and upper
// bounds of the transient buffers, with the formula behind every number. It reproduces the engine's own
// allocation rules (docs/memory.md), so for a known model the figures equal what the engine allocates
// (Engine::memory_report(): model_states, device/host/nvme_states, host_peak_bytes, nvme_bytes).
//
//   // From a parameter count alone (Ψ = N rounded up to kAlignElements):
//   EstimateInput in = estimate_input_for_params(1'500'000'000, /*ranks=*/8, Precision::kBf16);
//   in.offload_optimizer = in.offload_param = OffloadDevice::kNvme;   // ZeRO-Infinity (optional)
//   // Or from a validated config with a `model` section (exact layout, activations, offload keys):
//   EstimateInput in = estimate_input_for_config(cfg, /*ranks=*/8);
//   MemoryEstimate est = estimate_memory(in, {0, 1, 2, 3});
//   std::puts(format_estimate(est).c_str());          // human table + multipliers
//   boost::json::object j = estimate_to_json(est);    // machine-readable
//
// The rules (Ψ flat elements, R ranks, S_r = memory::shard_of(Ψ, R, r, 32).size; b bytes per element of
// the compute dtype, m = 4 for the fp32 master copy in bf16/fp16 and 0 in fp32, k optimizer state bytes
// per element, 8 for Adam):
//   params     stage 0,1,2: b Ψ      stage 3: b S_r
//   grads      stage 0,1:   b Ψ      stage 2,3: b S_r
//   optimizer  stage 0:  (m + k) Ψ   stage 1,2,3: (m + k) S_r
// Offload (Note [offload] in engine/model_states_nvme.cpp; Note [estimated offload] in estimate_offload.cpp):
// offload_optimizer (stages 1-3) moves the fp32 master (then separate even in fp32: m = 4) and the
// optimizer states to the host (cpu) or a swap file (nvme), and the gradient shard of stages 2-3 (with
// its persistent fp32 copy) to the host; offload_param (stage 3) moves the parameter shard. Host
// buffers and swap-file regions are counted as allocated: each rounded up to 4096 bytes.
// Everything here is a pure function of its arguments (thread-safe); only estimate_input_for_config
// builds a model, which declares parameters but allocates none.
#pragma once

#include <boost/json/object.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/config.h"
#include "engine/engine.h"
#include "memory/shard.h"
#include "run/run_config.h"
#include "engine/placement.h"
#include "estimate/measure.h"
#include "memory/backend.h"
#include "memory/category.h"
#include "nn/model.h"
#include "optim/optimizer.h"

namespace zs::engine {

// DeepSpeed's ZeRO limits that size the transient buffers and the offload sub-groups, in elements
// unless said otherwise (ZeroConfig's defaults).
struct ZeroLimits {
  int64_t reduce_bucket_size = 500'000'000;
  int64_t allgather_bucket_size = 500'000'000;
  int64_t stage3_prefetch_bucket_size = 50'000'000;
  int64_t stage3_param_persistence_threshold = 100'000;
  int64_t stage3_max_live_parameters = 1'000'000'000;
  int64_t sub_group_size = 1'000'000'000;            // elements the NVMe step streams at a time
  int64_t offload_optimizer_buffer_count = 4;        // sub-group host buffers (optimizer states on NVMe)
  int64_t offload_param_buffer_count = 5;            // ... when only the parameters are on NVMe
  int64_t offload_param_buffer_size = 100'000'000;   // x buffer_count: the stage-3 NVMe read window
  int64_t offload_param_max_in_cpu = 1'000'000'000;  // caps that window too (parameters in host memory)
  bool overlap_comm = true;                          // stage 2+: a full bucket is reduced during backward
};
// The limits a ZeroConfig holds.
ZeroLimits zero_limits_of(const ZeroConfig& zero);

// What the estimator knows about the model. With only a parameter count, exact_layout is false and
// only param_elements / flat_elements are set; the transient bounds then use the generic formulas.
struct ModelFacts {
  bool exact_layout = false;
  std::string description;               // "GPT n_layer 2 d_model 64 ..." or "--params 125000000"
  uint64_t param_elements = 0;           // parameters, padding excluded
  uint64_t flat_elements = 0;            // Ψ: FlatLayout::total() of the dense parameters, padding included
  // The dense parameters' ranges in that layout (FlatLayout::param_ranges): per-tensor compression
  // scales size their error feedback by them. With --params alone, one tensor of param_elements.
  std::vector<memory::ShardRange> tensors;
  // Expert parameters (MoE; Note [expert parameters] in engine/engine.h): one layout per distinct
  // expert_parallel_size E, this rank's experts only, sharded over the E-strided expert-data-parallel
  // group of ranks / E ranks (rank r is its rank r / E). The transient bounds below count the dense
  // layout only.
  struct ExpertLayout {
    int expert_parallel_size = 1;
    uint64_t flat_elements = 0;  // Ψ_E: FlatLayout::total() of this rank's expert parameters of that E
  };
  std::vector<ExpertLayout> experts;
  uint64_t largest_param_elements = 0;   // unpadded elements of the largest parameter
  // Stage 3 (engine/detail/param_gatherer.h): a module's own parameters are gathered as one range; modules
  // whose range is below stage3_param_persistence_threshold stay gathered (persistent).
  std::string gather_chain_module;       // deepest module of the largest chain of running modules
  uint64_t gather_chain_elements = 0;    // the largest sum of non-persistent own ranges along a chain
  uint64_t nonpersistent_elements = 0;   // all non-persistent ranges together
  uint64_t persistent_elements = 0;      // all persistent ranges together
  uint64_t persistent_modules = 0;       // how many modules stay gathered
  std::vector<uint64_t> module_elements;  // every module's own range (persistent too), ascending
  // Stage 2/3 gradient staging (engine/detail/grad_reducer.h, Note [staging bound] in estimate.cpp).
  uint64_t bucket_count = 0;             // buckets of plan_buckets(reduce_bucket_size)
  uint64_t staging_buckets = 0;          // K: buckets that can hold staging buffers at once
  uint64_t staging_elements = 0;         // the K largest buckets together
};

// Facts of a model from its FlatLayout, module tree and gradient bucket plan (the transient bounds).
// `model` must have its parameters declared (constructing nn::GptModel is enough); nothing is allocated.
ModelFacts model_facts(nn::Model& model, const ZeroLimits& limits);

struct EstimateInput {
  ModelFacts model;
  int ranks = 1;
  Precision precision = Precision::kBf16;
  std::string optimizer = "AdamW";
  // The optimizer's states per stepped element (Adam: two fp32; CAdam: int8 + one fp32 per 32).
  std::vector<optim::StateSpec> optimizer_states = {{"exp_avg"}, {"exp_avg_sq"}};
  // OneBitAdam / ZeroOneAdam (Note [compressed optimizers] in engine/compressed_step.cpp): whole
  // gradients, a whole momentum, the variance per stepped element, the error-feedback buffers, and
  // for ZeroOneAdam at stage 0 a whole accumulator. optimizer_states is then unused. All three from
  // the optimizer's registry entry (optim::CompressedTraits; zero_one: local_steps).
  bool compressed = false;
  bool zero_one = false;
  double compressed_state_bytes = 12.0;  // the reports' bytes per element (CompressedTraits)
  bool per_tensor_scales = false;        // compression_scale "tensor" (PlacementRules::per_tensor_scales)
  MemoryModes memory;                  // release_fp32_grad / reuse_fp32_param
  ZeroLimits zero;
  int config_stage = -1;               // the config's zero_optimization.stage; -1 without a config
  // Where the model states go, at the stages that allow it (stage_offload): the optimizer's at
  // stages 1-3, the parameters' at stage 3. Compressed optimizers and reuse_fp32_param cannot be
  // combined with optimizer offload (ConfigError, as parse_config says).
  OffloadDevice offload_optimizer = OffloadDevice::kNone;
  OffloadDevice offload_param = OffloadDevice::kNone;
  // What the device peak is measured on (estimate/measure.h): the model, the batches and the config
  // (its stage, precision, memory modes and offload targets replaced per stage by the fields above).
  // Absent with --params alone: the device peak then does not apply.
  struct MeasureTarget {
    std::shared_ptr<nn::Model> model;
    std::shared_ptr<BatchSource> source;
    EngineConfig config;
    MeasureGroups groups;  // the model's own simulated groups (kept alive by `model`) and the dp hosts
  };
  std::shared_ptr<const MeasureTarget> measure;
  // Pipeline parallelism (model.pipeline_parallel_size > 1; docs/pipeline_parallel.md): the figures
  // are of one stage - its own parameters, sharded over its data-parallel group of `ranks`, and the
  // activations of the micro-batches its schedule holds in flight (measured: the stage's schedule runs).
  struct PipelineStage {
    int stage = 0;            // this stage, 0..stages-1
    int stages = 1;           // model.pipeline_parallel_size
    std::string schedule;     // pipeline.schedule ("1f1b", ...)
    int64_t micro_batches = 0;  // of one step (gradient_accumulation_steps)
    int chunks = 1;             // model.virtual_pipeline_size (interleaved)
    int in_flight = 0;          // micro-batches the stage holds at once, per chunk summed: pp::max_in_flight
  };
  PipelineStage pipeline;
};

// The offload targets that apply at `stage` (the engine refuses the others in the config).
struct StageOffload {
  OffloadDevice optimizer = OffloadDevice::kNone;  // stages 1-3
  OffloadDevice param = OffloadDevice::kNone;      // stage 3
  bool any() const { return optimizer != OffloadDevice::kNone || param != OffloadDevice::kNone; }
  bool nvme() const { return optimizer == OffloadDevice::kNvme || param == OffloadDevice::kNvme; }
};
StageOffload stage_offload(const EstimateInput& in, int stage);

// Ψ = n_params rounded up to FlatLayout::kAlignElements. Throws ConfigError for n_params < 1 or
// ranks < 1. The optimizer is Adam (k = 8).
EstimateInput estimate_input_for_params(uint64_t n_params, int ranks, Precision precision);
// From a validated config: precision, optimizer, ZeRO limits, offload targets (offload_optimizer,
// offload_param; sub_group_size and buffer counts in `zero`) and, when cfg.model is set, the built-in
// GPT's exact layout and a measure target (the GPT on the built-in corpus). Without a model section,
// `n_params` must be given (else ConfigError); with one, n_params must be empty.
// With model.pipeline_parallel_size P > 1 the input is of pipeline stage `pipeline_stage` (0..P-1;
// ConfigError otherwise) and `ranks` the world (tp x dp x pp ranks): the figures are per rank of that
// stage. Each stage is estimated on its own (zeroshard estimate prints all, the largest as the figure).
// `ranks_per_host` (0: one host; the projection) places the ranks on hosts of that many consecutive world
// ranks (estimate/measure.h's HostLayout), so the measured groups count their bytes across hosts.
EstimateInput estimate_input_for_config(const run::RunConfig& cfg, int ranks,
                                        std::optional<uint64_t> n_params = std::nullopt, int pipeline_stage = 0,
                                        int ranks_per_host = 0);
// The same for a user's own model (any nn::Model) trained from `source`: exact layout and measured
// device peak. `model` and `source` must outlive the input and every estimate made from it. `cfg` is
// the engine's part of the config (a run::RunConfig whose program builds its own model has no `model`).
EstimateInput estimate_input_for_model(nn::Model& model, BatchSource& source, const EngineConfig& cfg, int ranks,
                                       std::string description);

// Bytes of each model-state category, on one tier.
struct StateBytes {
  uint64_t params = 0;
  uint64_t grads = 0;
  uint64_t optimizer = 0;
  uint64_t total() const { return params + grads + optimizer; }
  StateBytes operator+(const StateBytes& o) const { return {params + o.params, grads + o.grads, optimizer + o.optimizer}; }
  bool operator==(const StateBytes&) const = default;
};

// Model states by tier: device blocks at their requested size; host buffers (page-mapped) and swap-file
// regions at what they take, each buffer or region rounded up to 4096 bytes.
struct TieredStateBytes {
  StateBytes device;
  StateBytes host;
  StateBytes nvme;
  StateBytes total() const { return device + host + nvme; }
};

// A figure with how it was computed: a transient buffer's bound, or the NVMe offload's host buffers
// (exact). Absent (bytes 0, applies false) when the stage has no such buffer; applies false with a
// formula when it cannot be computed from what is known.
struct TransientBound {
  bool applies = false;
  uint64_t bytes = 0;
  std::string formula;
};

// The device arena's peak on one rank, measured by running the engine's own code over the measuring
// backend (estimate/measure.h, Note [measured estimate]): its allocated bytes at their highest, and
// what they were made of. Needs a model (a config's model section, or a user's model through
// estimate_input_for_model); applies false otherwise, with the reason in `formula`.
struct DevicePeak {
  bool applies = false;
  uint64_t bytes = 0;                // allocated bytes (64-byte blocks) at the peak
  uint64_t reserved_bytes = 0;       // the arena's reserved peak (allocated + holes between blocks)
  std::array<uint64_t, memory::kNumCategories> by_category{};  // at the peak, by memory::Category
  uint64_t activations = 0;          // by_category's activations, for the report
  uint64_t activation_peak = 0;      // the activations' own peak (not necessarily at the device peak)
  uint64_t capacity = 0;             // device.memory_mb of the config
  memory::TransferStats transfers;   // host <-> device bytes of one step
  uint64_t comm_bytes_sent = 0;      // bytes one step sends
  int micro_batches_in_flight = 0;   // a pipeline stage: the most its schedule held at once (0 otherwise)
  std::string formula;
};

// Consecutive ranks whose shards have the same size (so the same bytes).
struct ShardGroup {
  int first_rank = 0;
  int last_rank = 0;
  uint64_t shard_elements = 0;  // S_r
  StateBytes device;
  StateBytes host;              // offload: host-resident model states (4096-rounded buffers)
  StateBytes nvme;              // offload: swap-file regions (4096-rounded)
  TransientBound offload_buffers;  // NVMe offload: the step swapper's host buffers (exact, persistent)
  DevicePeak device_peak;          // the device arena's predicted peak on these ranks
  uint64_t total() const { return device.total() + host.total() + nvme.total(); }
  uint64_t host_total() const { return host.total() + offload_buffers.bytes; }  // host tier, all persistent
};

struct StageEstimate {
  int stage = 0;
  StageOffload offload;            // what is offloaded at this stage
  uint64_t master_bytes_per_element = 0;  // m at this stage (4 in fp32 too once anything is offloaded)
  std::vector<ShardGroup> shards;  // covers ranks 0..R-1 in order
  // The formula of each category, in the input's numbers ("(4 master + 8 Adam) x S_r"), and the
  // ZeRO paper's form ("4Ψ + 12Ψ/R").
  std::string params_formula, grads_formula, optimizer_formula, paper_formula;
  TransientBound grad_buckets;      // stage 2/3: up to 3 gradient buckets staged for reduce-scatter
  TransientBound gathered_params;   // stage 3: parameters gathered for the running module + prefetch
  TransientBound persistent_params; // stage 3: small parameters kept whole on every rank
  TransientBound activations_peak;  // measured: the activations' peak on rank 0 (needs a model)
  TransientBound nvme_param_staging;  // stage 3, parameters on NVMe: host buffers the gathers read into
  std::string offload_buffers_formula;  // the formula of ShardGroup::offload_buffers, in symbols

  const ShardGroup& group_of(int rank) const;
  uint64_t max_model_state_bytes() const;  // the largest rank's model states, all tiers
};

struct MemoryEstimate {
  EstimateInput input;
  uint64_t bytes_per_element = 0;      // b
  uint64_t master_bytes_per_element = 0;  // m
  std::vector<StageEstimate> stages;
};

// The engine's placement plan (engine/placement.h) for rank `rank` at `stage` under the input's rules:
// of the dense layout over the ranks.
PlacementPlan placement_plan(const EstimateInput& in, int stage, int rank);
// Every plan of rank `rank`: the dense one, then one per expert layout over its expert-data-parallel
// group (ranks / E ranks, rank r / E), as the engine plans them. Throws ConfigError when an
// expert_parallel_size does not divide the ranks.
std::vector<PlacementPlan> placement_plans(const EstimateInput& in, int stage, int rank);
// Model states of rank `rank` at `stage` on each tier: its placement plans added up (dense part over
// the ranks, expert part over the expert-data-parallel group).
TieredStateBytes tiered_state_bytes(const EstimateInput& in, int stage, int rank);
// The same summed over the tiers, by category (without offload: the device's).
StateBytes model_state_bytes(const EstimateInput& in, int stage, int rank);
// NVMe offload at `stage`: bytes of the step swapper's host buffers on rank `rank` (exact; applies
// false without NVMe), with the formula in this rank's numbers.
TransientBound offload_buffer_bytes(const EstimateInput& in, int stage, int rank);
StageEstimate estimate_stage(const EstimateInput& in, int stage);
// Throws ConfigError for a stage outside 0..3, ranks < 1, Ψ == 0, or optimizer offload at a stage >= 1
// with a compressed optimizer or reuse_fp32_param.
MemoryEstimate estimate_memory(const EstimateInput& in, const std::vector<int>& stages);

// Human-readable report: one row per stage and shard size, transient bounds, then every multiplier.
std::string format_estimate(const MemoryEstimate& est);
// JSON form (docs/memory.md lists the fields).
boost::json::object estimate_to_json(const MemoryEstimate& est);
// "1.23 GiB", "512.0 MiB", "96 B": binary units.
std::string format_bytes(uint64_t bytes);
// "1.32 GB", "536.9 MB", "96 B": decimal units (10^3 steps), the ones papers and vendors quote.
std::string format_bytes_si(uint64_t bytes);

}  // namespace zs::engine
