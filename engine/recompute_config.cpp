#include "engine/recompute_config.h"

#include <boost/json.hpp>

#include "core/errors.h"
#include "core/json.h"

namespace zs::engine {

nn::GptRecompute gpt_recompute(const RecomputeConfig& c, int64_t n_layer) {
  using B = RecomputeConfig::Blocks;
  switch (c.blocks) {
    case B::kNone: return nn::GptRecompute::none();
    case B::kEvery: return nn::GptRecompute::every(n_layer, c.k);
    case B::kFirst: return nn::GptRecompute::first(n_layer, c.k);
    case B::kSelective: return nn::GptRecompute::scores_only();
  }
  return {};
}

std::string checkpoint_blocks_name(const RecomputeConfig& c) {
  using B = RecomputeConfig::Blocks;
  switch (c.blocks) {
    case B::kNone: return "none";
    case B::kEvery: return c.k == 1 ? "all" : fmt::format("every {}", c.k);
    case B::kFirst: return fmt::format("first {}", c.k);
    case B::kSelective: return "selective";
  }
  return "none";
}

void check_partition_activations(const RecomputeConfig& c, int tensor_parallel_size, bool sequence_parallel,
                                 std::vector<std::string>& notes) {
  if (!c.partition_activations || tensor_parallel_size <= 1) return;
  if (sequence_parallel) {
    notes.push_back(fmt::format("activation_checkpointing.partition_activations: with model.sequence_parallel every "
                                "checkpointed block keeps its input as this rank's sequence shard, 1/{} of the "
                                "activation: the split DeepSpeed's partition_activations makes, already done",
                                tensor_parallel_size));
    return;
  }
  throw ConfigError(fmt::format("activation_checkpointing.partition_activations: true at model.tensor_parallel_size {} "
                                "would split each kept activation across the tensor-parallel group, which zeroshard "
                                "does only through sequence parallelism: set model.sequence_parallel to true (each "
                                "checkpointed block then keeps its input as a 1/{} sequence shard), or set "
                                "partition_activations to false",
                                tensor_parallel_size, tensor_parallel_size));
}

namespace detail {

void read_recompute(ObjectReader& r, RecomputeConfig& c, std::vector<std::string>& notes) {
  // DeepSpeed's partition_activations splits each kept activation across the tensor-parallel group;
  // at tensor-parallel size 1 it does nothing there, and here (Megatron's DeepSpeed configs set it).
  if (r.read("partition_activations", c.partition_activations) && c.partition_activations) {
    notes.push_back(fmt::format("{}: accepted; it splits kept activations across the tensor-parallel group, so at "
                                "tensor-parallel size 1 it is a no-op (as in DeepSpeed); above 1 it needs "
                                "model.sequence_parallel, whose sequence shards are that split",
                                r.path_of("partition_activations")));
  }
  r.read("cpu_checkpointing", c.cpu_checkpointing);
  r.read("contiguous_memory_optimization", c.contiguous_memory_optimization);
  if (const boost::json::value* v = r.find("number_checkpoints"); v != nullptr && !v->is_null()) {
    from_json(*v, r.path_of("number_checkpoints"), c.number_checkpoints);
    check_range(r.path_of("number_checkpoints"), c.number_checkpoints, IntRange::positive());
    if (!c.contiguous_memory_optimization) {
      notes.push_back(fmt::format("{}: accepted; has an effect only with contiguous_memory_optimization (it sizes that "
                                  "buffer)", r.path_of("number_checkpoints")));
    }
  }
  r.read("synchronize_checkpoint_boundary", c.synchronize_checkpoint_boundary);
  r.read("profile", c.profile);
  const std::string blocks_path = r.path_of("checkpoint_blocks");
  if (const boost::json::value* v = r.find("checkpoint_blocks")) {
    using B = RecomputeConfig::Blocks;
    if (v->is_string() && v->as_string() == "none") {
      c.blocks = B::kNone;
    } else if (v->is_string() && v->as_string() == "all") {
      c.blocks = B::kEvery;
      c.k = 1;
    } else if (v->is_string() && v->as_string() == "selective") {
      c.blocks = B::kSelective;
    } else if (v->is_int64() || v->is_uint64() || v->is_double()) {
      from_json(*v, blocks_path, c.k);
      check_range(blocks_path, c.k, IntRange::positive());
      c.blocks = B::kEvery;
    } else {
      throw ConfigError(fmt::format("{}: expected \"none\", \"all\", \"selective\" or a positive integer k (every k-th "
                                    "block), got {}",
                                    blocks_path, json_describe(*v)));
    }
  }
  const std::string budget_path = r.path_of("device_budget_mb");
  if (const boost::json::value* v = r.find("device_budget_mb")) {
    if (v->is_string() && v->as_string() == "auto") {
      c.budget_auto = true;
    } else if (v->is_string()) {
      throw ConfigError(fmt::format("{}: expected a number of MiB or \"auto\" (the device arena, device.memory_mb), got "
                                    "{}", budget_path, json_describe(*v)));
    } else {
      from_json(*v, budget_path, c.device_budget_mb);
      check_range(budget_path, c.device_budget_mb, IntRange::positive());
    }
    if (c.blocks != RecomputeConfig::Blocks::kNone) {
      throw ConfigError(fmt::format("{}: the budget chooses which blocks recompute, and checkpoint_blocks names them too; "
                                    "give one of the two",
                                    budget_path));
    }
  }
}

}  // namespace detail
}  // namespace zs::engine
