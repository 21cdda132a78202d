// Placement plan: where every flat model-state buffer of one rank lives, and how big it is. One rule,
// two readers: the engine allocates from the plan (ModelStates::place, one per state set), and the memory
// estimator (estimate/estimate.h) adds the plan up by tier instead of restating the rules.
//
//   PlacementPlan plan = plan_placement(placement_rules(cfg), layout.total(), Partition(total, R, r), "dp",
//                                       layout.param_ranges());
//   for (const PlannedBuffer& b : plan.buffers) ... b.name, b.category, b.where, b.bytes ...
//
// Note [model-state placement]: which flat buffers are whole and which are this rank's shard.
//   stage   params        grads         fp32 master (bf16/fp16 only)   optimizer states
//   0       whole         whole         whole                          whole
//   1       whole         whole         shard                          shard
//   2       whole         shard         shard                          shard
//   3       shard         shard         shard                          shard
// In fp32 the parameters are the master weights (no separate copy) unless anything is offloaded: the
// optimizer then updates the master where it lives and the parameters are a copy. All buffers use one
// flat layout, so an element index means the same thing in each; a shard buffer starts at
// partition.mine.offset. Compressed optimizers (one-bit Adam, 0/1 Adam) keep whole gradients at every
// stage (grad_stage <= 1: their compressed phase consumes each rank's whole local gradient), a whole
// fp32 momentum, the variance of the stepped range, 0/1 Adam's whole accumulator at stage 0, and the
// compressed allreduce's error feedback (Note [compressed optimizers] in engine/compressed_step.cpp):
// Ψ + chunk fp32 with scale blocks, the padded tensors plus this rank's chunk of each per tensor.
// Memory modes (MemoryModes): release_fp32_grad off adds a persistent fp32 copy of the gradients the
// optimizer reads; reuse_fp32_param (bf16) replaces the master by a 16-bit residual beside the bf16
// parameters (Note [reuse_fp32_param] in model_states_step.cpp).
// Offload (Note [offload] in model_states_nvme.cpp): offload_optimizer (stages 1-3) moves the master and
// the optimizer states to the host (cpu) or swap files (nvme), and the gradient shard of stages 2-3
// (with its fp32 copy) to the host; offload_param (stage 3) moves the parameter shard.
// Every buffer is sharded over one partition group, named in PlannedBuffer::group: "dp" for the dense
// parameters' layout; the layout of expert parameters (expert_parallel_size E > 1) is planned by the
// same rules over its expert-data-parallel group "edp" (Note [expert parameters] in engine/engine.h):
// one plan per flat layout, and a rank's model states are the sum of its plans.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/config.h"
#include "engine/partition.h"
#include "memory/category.h"
#include "memory/shard.h"
#include "optim/optimizer.h"

namespace zs::engine {

// What decides placement: the config's settings, with the offload targets that apply at the stage.
struct PlacementRules {
  int stage = 0;
  Precision precision = Precision::kBf16;
  MemoryModes memory;
  OffloadDevice offload_optimizer = OffloadDevice::kNone;  // kNone below stage 1
  OffloadDevice offload_param = OffloadDevice::kNone;      // kNone below stage 3
  std::vector<optim::StateSpec> states;  // the elementwise optimizer's states (unused when compressed)
  bool compressed = false;               // one-bit Adam / 0/1 Adam
  bool local_steps = false;              // 0/1 Adam: a whole accumulator at stage 0
  // compression_scale "tensor": the error feedback is per parameter tensor, padded as DeepSpeed pads
  // it (comm::OneBitAllreduce::state_floats_for), rather than the flat buffer plus one server chunk.
  bool per_tensor_scales = false;
};

// The rules of a validated config (its stage, precision, memory modes, offload and optimizer).
PlacementRules placement_rules(const EngineConfig& cfg);

enum class Where : uint8_t { kDevice, kHost, kNvme };
memory::Tier tier_of(Where w);

// What a planned buffer holds. Code dispatches on the role; the name is for people (reports, logs).
enum class BufferRole : uint8_t {
  kParams,          // the training-dtype parameters ("params")
  kGrads,           // the reduced gradients ("grads")
  kFp32Grads,       // release_fp32_grad off: their persistent fp32 copy ("fp32_grads")
  kMaster,          // the separate fp32 master ("master")
  kResidual,        // reuse_fp32_param: the master's low 16 bits ("residual")
  kOptimizerState,  // one of the optimizer's states, in its state_specs() order (the state's name)
  kMomentum,        // compressed optimizers: the whole fp32 momentum ("momentum")
  kVariance,        // compressed optimizers: the variance of the stepped range ("variance")
  kAccumulator,     // 0/1 Adam at stage 0: the whole accumulator ("accumulator")
  kErrorFeedback,   // compressed optimizers: comm's error feedback ("error_feedback")
};
// The name a plan gives a buffer of `role` (kOptimizerState: the state's own name instead).
std::string_view buffer_role_name(BufferRole role);

struct PlannedBuffer {
  std::string name;           // buffer_role_name(role), or the optimizer state's name
  memory::Category category;  // params, grads or optimizer
  Where where = Where::kDevice;
  memory::ShardRange elements;  // the flat elements it holds (whole: {0, total})
  uint64_t bytes = 0;           // requested (host buffers and swap regions take it rounded to 4096)
  std::string group = "dp";     // the partition group its shard is of
  bool owned_by_comm = false;   // error feedback: held by comm::OneBitAllreduce, counted here
  BufferRole role = BufferRole::kParams;
};

struct PlacementPlan {
  int stage = 0;
  int grad_stage = 0;            // the stage whose gradient layout the reducer uses
  bool separate_master = false;  // the fp32 master is its own buffer
  bool reuse_fp32_param = false;
  bool keep_fp32_grads = false;
  memory::ShardRange stepped;    // the elements this rank's optimizer updates
  memory::ShardRange params;     // parameters held (stage 3: the shard)
  memory::ShardRange grads;      // gradients held (grad_stage >= 2: the shard)
  memory::ShardRange fp32_grads; // the persistent fp32 gradient copy, when kept
  std::vector<PlannedBuffer> buffers;

  // The buffer named `name`, or nullptr when the plan has none (e.g. no master in plain fp32).
  const PlannedBuffer* find(std::string_view name) const;
  const PlannedBuffer* find(BufferRole role) const;  // the first of `role`
  // Requested bytes of `category` at `where`; `page_rounded` rounds host and NVMe buffers to 4096.
  uint64_t bytes(memory::Category category, Where where, bool page_rounded) const;
};

// The plan of the rank `partition` describes, for a flat layout of `total` elements sharded over the
// partition group named `group` ("dp", or "edp" for expert parameters). `tensors`: the layout's
// parameter ranges (FlatLayout::param_ranges), which size a compressed optimizer's error feedback
// with per-tensor scales (ZS_ASSERT: given then); unused otherwise. Pure.
PlacementPlan plan_placement(const PlacementRules& rules, size_t total, const Partition& partition,
                             const std::string& group = "dp", std::span<const memory::ShardRange> tensors = {});

}  // namespace zs::engine
