// The `activation_checkpointing` section: DeepSpeed's keys plus zeroshard's checkpoint_blocks (the
// built-in GPT) and device_budget_mb (the recompute choice made from a memory budget). What each does:
// docs/memory.md, "Activation checkpointing"; the mechanism: Activation checkpointing in nn/module.h.
//
//   "activation_checkpointing": {"checkpoint_blocks": "all", "cpu_checkpointing": true, "profile": true}
//   "activation_checkpointing": {"device_budget_mb": "auto"}   // the fewest blocks that fit the arena
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/gpt.h"

namespace zs {
class ObjectReader;
}

namespace zs::engine {

struct RecomputeConfig {
  // Which blocks of the built-in GPT recompute (checkpoint_blocks). A program's own model marks its
  // modules itself (nn::Module::set_recomputed); the storage keys below apply to any checkpointed module.
  enum class Blocks {
    kNone,
    kEvery,      // "all" (k = 1) or an integer k: blocks 0, k, 2k, ...
    kFirst,      // the first k blocks: what device_budget_mb resolves to (resolve_recompute_budget)
    kSelective,  // no block; every attention recomputes its score/softmax part
  };
  Blocks blocks = Blocks::kNone;
  int64_t k = 1;
  // DeepSpeed's keys.
  bool cpu_checkpointing = false;               // kept inputs on the host tier, copied back for the re-run
  bool contiguous_memory_optimization = false;  // kept inputs in slots of one preallocated buffer
  int64_t number_checkpoints = 0;               // its slots; 0: the number of checkpointed modules
  bool synchronize_checkpoint_boundary = false; // the device backend synchronizes at each kept input and re-run
  bool profile = false;                         // log each step's recompute time (rank 0)
  // Kept activations split across the tensor-parallel group: a no-op at tp 1; above, what sequence
  // parallelism does (check_partition_activations).
  bool partition_activations = false;
  // The program applied `blocks` to its model itself (zeroshard train's tensor-parallel GPT, whose
  // set_recompute the engine does not know): the engine then only counts the marked modules.
  bool applied_by_program = false;
  // device_budget_mb: MiB the predicted device peak must fit, or "auto" (device.memory_mb); 0: none.
  // Resolved into kFirst before the engine is built (estimate/recompute_budget.h); the engine refuses
  // an unresolved one.
  int64_t device_budget_mb = 0;
  bool budget_auto = false;
  bool budget() const { return device_budget_mb > 0 || budget_auto; }
};

// The built-in GPT's recompute for `n_layer` blocks under `c` (blocks and selective).
nn::GptRecompute gpt_recompute(const RecomputeConfig& c, int64_t n_layer);
// "none", "all", "every 2", "first 3", "selective": the choice in words (logs and the summary).
std::string checkpoint_blocks_name(const RecomputeConfig& c);

// activation_checkpointing.partition_activations at a tensor-parallel size above 1: with sequence
// parallelism the checkpointed blocks' kept inputs are sequence shards already (a note); without it a
// ConfigError naming the key. Read by the program that builds the tensor-parallel model (zeroshard
// train, through run::parse_run_config): the engine keeps what the model gives it.
void check_partition_activations(const RecomputeConfig& c, int tensor_parallel_size, bool sequence_parallel,
                                 std::vector<std::string>& notes);

namespace detail {
// Reads the section (declaring its keys to `r`); notes get a line per accepted key without effect.
void read_recompute(ObjectReader& r, RecomputeConfig& c, std::vector<std::string>& notes);
}  // namespace detail

}  // namespace zs::engine
