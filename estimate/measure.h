// The memory estimator's measurement: the real engine, run over memory::MeasuringBackend and a
// simulated group, for any nn::Model - a built-in GPT or a user's own.
//
//   nn::GptModel model(*cfg.model);                      // cfg: a run::RunConfig; or your own nn::Model
//   MySource source;                                      // yours: the BatchSource training would use
//   engine::Measurement m = engine::estimate(model, cfg, /*ranks=*/8, source);
//   for (const auto& r : m.classes) std::printf("ranks %d-%d: device peak %llu\n", r.first_rank, r.last_rank,
//                                               (unsigned long long)r.memory.device_peak_bytes);
// (tests/docs/usage_snippets_test.cpp compiles and runs the same lines.)
//
// How (Note [measured estimate] in measure.cpp): for each distinct shard size the engine is built as
// rank r of `ranks` over a measuring backend (addresses without memory; no arithmetic, no file) and
// comm::Group::simulated (collectives that move nothing; async ones stay in flight until waited for,
// as when MPI has not progressed them), and trains `steps` optimizer steps of real batches. The
// engine's own code places the model states, gathers and releases ZeRO-3 parameters, stages and
// reduces gradient buckets, and the model allocates its activations; the arena's peak is the
// prediction, with what it was made of. It costs the model's allocations, not its arithmetic: seconds
// for billions of parameters.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "comm/config.h"
#include "comm/group.h"
#include "engine/config.h"
#include "engine/engine.h"
#include "memory/backend.h"
#include "nn/model.h"

namespace zs::engine {

// Where the ranks of a run lie, in comm::Topology's order (world rank = tp_rank + tp * (dp_rank + dp *
// pp_rank)) on hosts of `ranks_per_host` consecutive world ranks (0: one host): the projection measures
// a layout's bytes across hosts with it (Note [Bytes across hosts] in comm/config.h).
struct HostLayout {
  int ranks_per_host = 0;
  int tp = 1, dp = 1, pp = 1;
  int host(int tp_rank, int dp_rank, int pp_rank) const;
  // The hosts of a group's members in group rank order; empty on one host (Group::simulated's form).
  std::vector<int> dp_hosts(int tp_rank, int pp_rank) const;
  std::vector<int> pp_hosts(int tp_rank, int dp_rank) const;
  // The first expert-parallel group's (dp ranks 0..ep-1 of tp rank 0, stage 0; comm::Topology's "ep").
  std::vector<int> ep_hosts(int ep) const;
};

// The model's own simulated groups, which a measurement tallies beside the engine's data-parallel one:
// its tensor-parallel layers' "tp" group (given to the engine too, as a real run gives both the same
// group), a pipeline stage's "pp" group and an MoE model's expert-parallel "ep" group (its
// all-to-alls); null when the model has none. The groups the engine makes itself are tallied too: the
// expert-data-parallel "edp" and ZeRO++'s "hpz" and "hpz_across". `dp_hosts`: the hosts of the
// data-parallel ranks (empty: one host).
struct MeasureGroups {
  const comm::Group* tp = nullptr;
  const comm::Group* pp = nullptr;
  const comm::Group* ep = nullptr;
  std::vector<int> dp_hosts;
  // What the program does over its groups (dp, then tp and pp where the model has them) at each step
  // boundary, so its bytes count as a real run's (zeroshard train: launch::agree_preempted); empty: nothing.
  std::function<void(std::span<const comm::Group* const>)> step_boundary;
  // Up to this many data-parallel ranks, each is measured on its own rather than once per shard size:
  // at stage 3 the bytes a rank sends depend on its part of each gathered module, not only on its
  // shard's size (the projection's exact bytes per rank).
  int every_rank_up_to = 0;
};

// One group's collectives in the last measured step on one rank (comm's counting rule, OpStats' seconds
// unused): "dp", "tp", "pp", "ep", "edp", "hpz" or "hpz_across".
struct GroupStep {
  std::string group;
  std::vector<comm::OpStats> ops;  // by collective, those that ran
  int hosts = 1;                   // the hosts its members lie on (comm::Group::hosts)
  uint64_t bytes_sent() const;
  uint64_t bytes_inter_host() const;
  uint64_t count() const;
};

// One class of ranks: consecutive ranks whose shards have the same size (so the same memory).
struct RankMeasurement {
  int first_rank = 0;
  int last_rank = 0;
  Engine::MemoryReport memory;          // as a real run's memory_report(); nvme_states are 0 (no files)
  memory::TransferStats transfers;      // host <-> device bytes of the last measured step
  uint64_t comm_bytes_sent = 0;         // bytes a real run would send in the last measured step
  int max_in_flight = 0;                // a pipeline stage: micro-batches its schedule held at once
  // Stage 3: the last measured step's parameter gathers over the partition's group, and of them the
  // backward passes' (StepReport's): where its gathers fall in the step.
  uint64_t param_gathers = 0;
  uint64_t backward_param_gathers = 0;
  std::vector<GroupStep> groups;        // the last measured step, per group: dp, then those of the others it has
};

struct Measurement {
  int ranks = 1;
  int steps = 0;
  std::vector<RankMeasurement> classes;  // covers ranks 0..ranks-1 in order
  const RankMeasurement& of_rank(int rank) const;
};

// A tensor-parallel model (parameters with nn::TensorSlice parts T > 1, all of one tp rank) is measured
// as that tp rank over a simulated tp group of T; `ranks` are then the data-parallel ranks. A pipeline
// stage (an engine::PipelineModel over a simulated "pp" group: estimate_input_for_config builds one) is
// measured as that stage, its schedule run over the step's micro-batches (Note [send retirement]
// in pp/pipeline.h); `ranks` are then the stage's data-parallel ranks.
// Trains `steps` (>= 2: the first records ZeRO-3's module order, the second prefetches along it)
// optimizer steps of `model` under `config` (parsed for a world of `ranks`: its micro-batch and
// accumulation are used as they are) as each class of rank among `ranks`, measuring only.
// `source` supplies the batches (their values do not matter; their shapes do). Throws what the engine
// throws for a config it refuses (ConfigError); the device capacity is not a limit (the prediction
// says whether the arena of device.memory_mb holds it).
// `groups`: the model's own groups and the data-parallel ranks' hosts (above).
Measurement estimate(nn::Model& model, const EngineConfig& config, int ranks, BatchSource& source, int steps = 2,
                     const MeasureGroups& groups = {});

}  // namespace zs::engine
