// Config arithmetic before anything is built: does the config's model fit at all?
//
//   run::RunConfig cfg = run::parse_run_config(doc, world.size());
//   check_config_fits(cfg, world.size(), FitCapacity::of_this_host());   // before building the model
//
// A GPT of 1e5 blocks takes 44 s to declare its module tree before the device arena's first allocation
// fails; one of 1e9 blocks never finishes. The model states' bytes follow from the parameter count by
// the estimator's own rules (tiered_state_bytes over estimate_input_for_config with a count and no
// built model), so the answer is known in microseconds. Every figure here is a lower bound of what the
// engine will allocate (the layout's per-parameter padding, activations and transient buffers only add
// to it), so a config this check refuses could never have trained; one it passes may still run out of
// memory later with the arena's own error.
//
// Refusals are ConfigErrors whose message starts with the JSON path to change and gives the bytes needed
// and the capacity:
//   model: a GPT of 1,209,091,072 parameters needs 18.0 GiB of model states per rank on the device
//          (zero_optimization.stage 0, 1 rank(s), fp32, AdamW), more than device.memory_mb gives (4.0 GiB); ...
// Thread-safety: a pure function of its arguments.
#pragma once

#include <cstdint>

#include "engine/config.h"
#include "run/run_config.h"

namespace zs::engine {

// What one rank may use, beside the config's own device.memory_mb.
struct FitCapacity {
  uint64_t host_bytes = 0;  // host memory one rank may fill with offloaded states; 0: not checked
  // The machine's physical memory (a lower bound of what would be needed is compared with it).
  static FitCapacity of_this_host();
};

// Checks the config's built-in model (`model` section; nothing to check without one) against the device
// arena and, with offload to the host, against `capacity.host_bytes`, and the smallest activation of one
// micro-batch beside the states. Throws ConfigError naming the path (model, train_micro_batch_size_per_gpu,
// zero_optimization.offload_optimizer / offload_param), the bytes needed and the capacity.
void check_config_fits(const run::RunConfig& cfg, int ranks, const FitCapacity& capacity);

// The parameter elements of the config's model that rank 0 holds before sharding: the GPT's count
// (nn::gpt_param_count) and, for model.moe, the expert MLPs of one expert-parallel rank in place of the
// dense MLPs they replace, plus the gates. Requires a validated cfg.model.
struct ConfigParamCounts {
  uint64_t dense = 0;           // parameters sharded over all ranks
  uint64_t expert = 0;          // this rank's experts, sharded over ranks / ep_size ranks
  int expert_parallel_size = 1;
};
ConfigParamCounts config_param_counts(const run::RunConfig& cfg);

}  // namespace zs::engine
