#include "comm/topology.h"

#include "core/errors.h"

namespace zs::comm {

void Topology::validate(const TopologyConfig& d, int world_size) {
  auto positive = [&](const char* key, int v) {
    if (v < 1) throw ConfigError(fmt::format("{}: expected a positive integer, got {}", key, v));
  };
  positive("model.tensor_parallel_size", d.tensor_parallel_size);
  positive("model.pipeline_parallel_size", d.pipeline_parallel_size);
  positive("model.moe.ep_size", d.expert_parallel_size);
  const int model_parallel = d.tensor_parallel_size * d.pipeline_parallel_size;
  if (world_size % model_parallel != 0) {
    throw ConfigError(fmt::format(
        "model.tensor_parallel_size ({}) x model.pipeline_parallel_size ({}) = {} does not divide the number of "
        "ranks ({}): the data-parallel size is ranks / (tensor x pipeline); run on a multiple of {} ranks or choose "
        "degrees whose product divides {}",
        d.tensor_parallel_size, d.pipeline_parallel_size, model_parallel, world_size, model_parallel, world_size));
  }
  const int dp = world_size / model_parallel;
  if (dp % d.expert_parallel_size != 0) {
    throw ConfigError(fmt::format(
        "model.moe.ep_size: {} does not divide the data-parallel size {} (ranks {} / (model.tensor_parallel_size {} "
        "x model.pipeline_parallel_size {})): expert-parallel groups are ep_size members of one data-parallel group; "
        "choose a divisor of {}",
        d.expert_parallel_size, dp, world_size, d.tensor_parallel_size, d.pipeline_parallel_size, dp));
  }
}

namespace {
// Ranks are split by color; every split keys by world rank, so each group is ordered by world rank,
// which is also its order by the coordinate that varies inside it.
Group split(const Group& world, int color, const char* name) { return world.split(color, world.rank(), name); }

// One color per (dp group, dp rank % ep); a dp group's own color is pp_rank * tp + tp_rank.
int edp_color(const TopologyConfig& d, int tp_rank, int dp_rank, int pp_rank) {
  return (pp_rank * d.tensor_parallel_size + tp_rank) * d.expert_parallel_size + dp_rank % d.expert_parallel_size;
}
}  // namespace

Group Topology::make_expert_data_parallel(const Group& world, const TopologyConfig& degrees) {
  validate(degrees, world.size());
  const int tp = degrees.tensor_parallel_size;
  const int dp = world.size() / (tp * degrees.pipeline_parallel_size);
  const int r = world.rank();
  return split(world, edp_color(degrees, r % tp, r / tp % dp, r / (tp * dp)), "edp");
}

Topology::HostGroups Topology::make_host_groups(const Group& dp, int host_size) {
  ZS_ASSERT(host_size >= 1 && dp.size() % host_size == 0, "host size {} does not divide {}", host_size, dp.size());
  const int r = dp.rank();
  if (!dp.is_mpi()) {
    // The same members as the splits below, keeping the dp group's hosts (the projection's bytes across hosts).
    std::vector<int> host, across;
    for (int i = 0; i < host_size; ++i) host.push_back(r / host_size * host_size + i);
    for (int j = r % host_size; j < dp.size(); j += host_size) across.push_back(j);
    return {dp.simulated_subgroup(host, "hpz"), dp.simulated_subgroup(across, "hpz_across")};
  }
  Group host = dp.split(r / host_size, r, "hpz");
  Group across = dp.split(r % host_size, r, "hpz_across");
  return {std::move(host), std::move(across)};
}

Topology::Topology(const Group& world, const TopologyConfig& degrees)
    : degrees_((validate(degrees, world.size()), degrees)),
      dp_size_(world.size() / (degrees.tensor_parallel_size * degrees.pipeline_parallel_size)),
      tp_rank_(world.rank() % degrees.tensor_parallel_size),
      dp_rank_(world.rank() / degrees.tensor_parallel_size % dp_size_),
      pp_rank_(world.rank() / (degrees.tensor_parallel_size * dp_size_)),
      tp_(split(world, world.rank() / degrees.tensor_parallel_size, "tp")),
      dp_(split(world, pp_rank_ * degrees.tensor_parallel_size + tp_rank_, "dp")),
      pp_(split(world, world.rank() % (degrees.tensor_parallel_size * dp_size_), "pp")),
      mp_(split(world, dp_rank_, "mp")),
      // One color per (dp group, index of the ep block); a dp group's own color is pp_rank * tp +
      // tp_rank, as above. edp: edp_color.
      ep_(split(world, (pp_rank_ * degrees.tensor_parallel_size + tp_rank_) * dp_size_ +
                           dp_rank_ / degrees.expert_parallel_size,
                "ep")),
      edp_(split(world, edp_color(degrees, tp_rank_, dp_rank_, pp_rank_), "edp")) {}

std::string Topology::describe() const {
  return fmt::format("tp {} x dp {} x pp {}, ep {}", degrees_.tensor_parallel_size, dp_size_,
                     degrees_.pipeline_parallel_size, degrees_.expert_parallel_size);
}

}  // namespace zs::comm
