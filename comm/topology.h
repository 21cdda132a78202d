// Topology: every process group of a run, built once from the world and the parallel degrees, in
// Megatron-LM's rank order (megatron/core/parallel_state.py, initialize_model_parallel).
//
//   comm::Topology topo(world.group(), {.tensor_parallel_size = 2, .pipeline_parallel_size = 2});
//   topo.data_parallel().allreduce(grads, comm::ReduceOp::kAverage);   // "dp"
//   topo.pipeline_parallel().send(activations, topo.pipeline_rank() + 1);  // "pp"
//
// Rank order: tensor-parallel ranks are consecutive, then data-parallel, then pipeline stages:
//   world rank = tp_rank + tp * (dp_rank + dp * pp_rank),   dp = world / (tp * pp).
// The groups (each a Group::split of the world, named so error messages say which):
//   "tp"  : same dp and pp rank           {r0, r0+1, ..., r0+tp-1}
//   "dp"  : same tp and pp rank           ranks tp apart within one pipeline stage
//   "pp"  : same tp and dp rank           ranks tp*dp apart
//   "mp"  : same dp rank (model parallel, tp x pp), ordered by world rank
//   "ep"  : ep consecutive members of one dp group (dp ranks k*ep .. k*ep+ep-1)
//   "edp" : members of one dp group with the same dp rank % ep (expert data parallel)
// With tp = pp = 1, dp is every rank and ep/edp are DeepSpeed's layout (World::split_groups).
// Validation (ConfigError naming the config key and the world size): every degree >= 1, tp * pp
// divides the world size, ep divides dp.
// Collective over `world` (every rank constructs it with the same degrees); six splits
// (make_expert_data_parallel: one, for the edp group alone).
#pragma once

#include <string>

#include "comm/group.h"

namespace zs::comm {

struct TopologyConfig {
  int tensor_parallel_size = 1;    // model.tensor_parallel_size
  int pipeline_parallel_size = 1;  // model.pipeline_parallel_size
  int expert_parallel_size = 1;    // model.moe.ep_size
};

class Topology {
 public:
  Topology(const Group& world, const TopologyConfig& degrees);
  Topology(Topology&&) noexcept = default;
  Topology& operator=(Topology&&) noexcept = default;

  // Throws ConfigError unless the degrees fit a world of `world_size` ranks (what the constructor checks).
  static void validate(const TopologyConfig& degrees, int world_size);
  // Collective over `world`: only the "edp" group of Topology(world, degrees), made by one split
  // instead of six (the engine's expert groups; each start-up collective costs a handshake).
  static Group make_expert_data_parallel(const Group& world, const TopologyConfig& degrees);

  // ZeRO++'s hierarchy over a data-parallel group `dp` (DeepSpeed's: a host is `host_size`
  // consecutive ranks): "hpz", the ranks of this rank's host (dp ranks k*h .. k*h+h-1, inner rank
  // dp rank % h), and "hpz_across", the ranks with the same inner rank on every host (outer rank
  // dp rank / h). `host_size` divides dp.size() (the caller's ConfigError names its key). Collective
  // over `dp` (two splits); a simulated `dp` (the estimator) gets simulated groups of the same
  // members and hosts (Group::simulated_subgroup).
  struct HostGroups {
    Group host;
    Group across;
  };
  static HostGroups make_host_groups(const Group& dp, int host_size);

  const Group& data_parallel() const { return dp_; }
  const Group& tensor_parallel() const { return tp_; }
  const Group& pipeline_parallel() const { return pp_; }
  const Group& model_parallel() const { return mp_; }
  const Group& expert_parallel() const { return ep_; }
  const Group& expert_data_parallel() const { return edp_; }
  // Moves a group out (the engine keeps the ones it uses); the Topology's copy is then empty.
  Group take_data_parallel() { return std::move(dp_); }
  Group take_expert_parallel() { return std::move(ep_); }
  Group take_expert_data_parallel() { return std::move(edp_); }

  const TopologyConfig& degrees() const { return degrees_; }
  int data_parallel_size() const { return dp_size_; }
  // This rank's coordinates (also its rank in the tp, dp and pp groups).
  int tensor_rank() const { return tp_rank_; }
  int data_rank() const { return dp_rank_; }
  int pipeline_rank() const { return pp_rank_; }
  // "tp 2 x dp 2 x pp 2, ep 1": for logs and the summary.
  std::string describe() const;

 private:
  TopologyConfig degrees_;
  int dp_size_ = 1, tp_rank_ = 0, dp_rank_ = 0, pp_rank_ = 0;
  Group tp_, dp_, pp_, mp_, ep_, edp_;
};

}  // namespace zs::comm
