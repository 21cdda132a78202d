// Memory estimator: bytes per rank of the model states (parameters, gradients, optimizer states) at
// each ZeRO stage, plus upper bounds of the transient buffers, with the formula behind every number.
// It reproduces the engine's own allocation rules (docs/memory.md), so for a known model the model-state
// bytes equal what `zeroshard train --summary` reports as memory.per_rank[r].model_states_bytes.
//
//   // From a parameter count alone (Ψ = N rounded up to kAlignElements):
//   EstimateInput in = estimate_input_for_params(1'500'000'000, /*ranks=*/8, Precision::kBf16);
//   // Or from a validated config with a `model` section (exact layout, activations too):
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
// Everything here is a pure function of its arguments (thread-safe); only estimate_input_for_config
// builds a model, which declares parameters but allocates none.
//
// Offload (extension point): EstimateInput carries offload targets and every figure is split by tier
// (device, host, nvme). This build places every model state on the device; any other target is a
// ConfigError, until the offload engine lands and fills the host/nvme columns.
#pragma once

#include <boost/json/object.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/config.h"
#include "nn/model.h"
#include "optim/optimizer.h"

namespace zs::engine {

enum class OffloadTarget { kNone, kCpu, kNvme };
std::string offload_target_name(OffloadTarget t);

// DeepSpeed's ZeRO limits that size the transient buffers, in elements (ZeroConfig's defaults).
struct ZeroLimits {
  int64_t reduce_bucket_size = 500'000'000;
  int64_t allgather_bucket_size = 500'000'000;
  int64_t stage3_prefetch_bucket_size = 50'000'000;
  int64_t stage3_param_persistence_threshold = 100'000;
  int64_t stage3_max_live_parameters = 1'000'000'000;
};
// The limits a ZeroConfig holds (the stage-3 keys keep their defaults where this build's ZeroConfig
// does not have them yet).
ZeroLimits zero_limits_of(const ZeroConfig& zero);

// Activation shape of the built-in GPT for one micro-batch.
struct GptActivationShape {
  nn::GptConfig model;
  int64_t micro_batch = 1;  // B: samples per rank per micro-batch
  int64_t seq_len = 0;      // T: tokens per sample (zeroshard train uses model.seq_len)
};

// What the estimator knows about the model. With only a parameter count, exact_layout is false and
// only param_elements / flat_elements are set; the transient bounds then use the generic formulas.
struct ModelFacts {
  bool exact_layout = false;
  std::string description;               // "GPT n_layer 2 d_model 64 ..." or "--params 125000000"
  uint64_t param_elements = 0;           // parameters, padding excluded
  uint64_t flat_elements = 0;            // Ψ: FlatLayout::total(), padding included
  uint64_t largest_param_elements = 0;   // unpadded elements of the largest parameter
  // Stage 3 (engine/param_gatherer.h): a module's own parameters are gathered as one range; modules
  // whose range is below stage3_param_persistence_threshold stay gathered (persistent).
  std::string gather_chain_module;       // deepest module of the largest chain of running modules
  uint64_t gather_chain_elements = 0;    // the largest sum of non-persistent own ranges along a chain
  uint64_t nonpersistent_elements = 0;   // all non-persistent ranges together
  uint64_t persistent_elements = 0;      // all persistent ranges together
  uint64_t persistent_modules = 0;       // how many modules stay gathered
  // Stage 2/3 gradient staging (engine/grad_reducer.h, Note [staging bound] in estimate.cpp).
  uint64_t bucket_count = 0;             // buckets of plan_buckets(reduce_bucket_size)
  uint64_t staging_buckets = 0;          // K: buckets that can hold staging buffers at once
  uint64_t staging_elements = 0;         // the K largest buckets together
  std::optional<GptActivationShape> activations;
};

// Facts of a model from its FlatLayout and gradient bucket plan. `model` must have its parameters
// declared (constructing nn::GptModel is enough); nothing is allocated.
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
  // for ZeroOneAdam at stage 0 a whole accumulator. optimizer_states is then unused.
  bool compressed = false;
  bool zero_one = false;
  MemoryModes memory;                  // release_fp32_grad / reuse_fp32_param
  ZeroLimits zero;
  int config_stage = -1;               // the config's zero_optimization.stage; -1 without a config
  OffloadTarget offload_optimizer = OffloadTarget::kNone;
  OffloadTarget offload_param = OffloadTarget::kNone;
};

// Ψ = n_params rounded up to FlatLayout::kAlignElements. Throws ConfigError for n_params < 1 or
// ranks < 1. The optimizer is Adam (k = 8).
EstimateInput estimate_input_for_params(uint64_t n_params, int ranks, Precision precision);
// From a validated config: precision, optimizer, ZeRO limits and, when cfg.model is set, the exact
// layout and GPT activations (micro-batch = cfg.batch.micro_batch_per_rank). Without a model section,
// `n_params` must be given (else ConfigError); with one, n_params must be empty.
EstimateInput estimate_input_for_config(const EngineConfig& cfg, int ranks,
                                        std::optional<uint64_t> n_params = std::nullopt);

// Bytes of each model-state category, on one tier.
struct StateBytes {
  uint64_t params = 0;
  uint64_t grads = 0;
  uint64_t optimizer = 0;
  uint64_t total() const { return params + grads + optimizer; }
  bool operator==(const StateBytes&) const = default;
};

// Consecutive ranks whose shards have the same size (so the same bytes).
struct ShardGroup {
  int first_rank = 0;
  int last_rank = 0;
  uint64_t shard_elements = 0;  // S_r
  StateBytes device;
  StateBytes host;              // offload tiers: zero in this build
  StateBytes nvme;
  uint64_t total() const { return device.total() + host.total() + nvme.total(); }
};

// A transient buffer bound: bytes and how they were computed. Absent (bytes 0, applies false) when
// the stage has no such buffer.
struct TransientBound {
  bool applies = false;
  uint64_t bytes = 0;
  std::string formula;
};

struct StageEstimate {
  int stage = 0;
  std::vector<ShardGroup> shards;  // covers ranks 0..R-1 in order
  // The formula of each category, in the input's numbers ("(4 master + 8 Adam) x S_r"), and the
  // ZeRO paper's form ("4Ψ + 12Ψ/R").
  std::string params_formula, grads_formula, optimizer_formula, paper_formula;
  TransientBound grad_buckets;      // stage 2/3: up to 3 gradient buckets staged for reduce-scatter
  TransientBound gathered_params;   // stage 3: parameters gathered for the running module + prefetch
  TransientBound persistent_params; // stage 3: small parameters kept whole on every rank
  TransientBound activations_saved; // one micro-batch's tensors saved for backward (known GPT only)
  TransientBound activations_peak;  // saved + the working set at the busiest point (estimate)

  const ShardGroup& group_of(int rank) const;
  uint64_t max_model_state_bytes() const;  // the largest rank's model states, all tiers
};

struct MemoryEstimate {
  EstimateInput input;
  uint64_t bytes_per_element = 0;      // b
  uint64_t master_bytes_per_element = 0;  // m
  std::vector<StageEstimate> stages;
};

// Model states of rank `rank` at `stage`, by the rules above (device tier only in this build).
StateBytes model_state_bytes(const EstimateInput& in, int stage, int rank);
StageEstimate estimate_stage(const EstimateInput& in, int stage);
// Throws ConfigError for a stage outside 0..3, ranks < 1, Ψ == 0 or an offload target other than none.
MemoryEstimate estimate_memory(const EstimateInput& in, const std::vector<int>& stages);

// The GPT's activation bytes for one micro-batch (fp32): tensors saved for backward, and the peak.
struct ActivationEstimate {
  uint64_t saved_bytes = 0;
  uint64_t peak_bytes = 0;
  std::string saved_formula;
  std::string peak_formula;
};
ActivationEstimate gpt_activation_bytes(const GptActivationShape& shape, Precision precision);

// Human-readable report: one row per stage and shard size, transient bounds, then every multiplier.
std::string format_estimate(const MemoryEstimate& est);
// JSON form (docs/memory.md lists the fields).
boost::json::object estimate_to_json(const MemoryEstimate& est);
// "1.23 GiB", "512.0 MiB", "96 B": binary units.
std::string format_bytes(uint64_t bytes);

}  // namespace zs::engine
