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
#include <vector>

#include "engine/config.h"
#include "engine/engine.h"
#include "memory/backend.h"
#include "nn/model.h"

namespace zs::engine {

// One class of ranks: consecutive ranks whose shards have the same size (so the same memory).
struct RankMeasurement {
  int first_rank = 0;
  int last_rank = 0;
  Engine::MemoryReport memory;          // as a real run's memory_report(); nvme_states are 0 (no files)
  memory::TransferStats transfers;      // host <-> device bytes of the last measured step
  uint64_t comm_bytes_sent = 0;         // bytes a real run would send in the last measured step
  int max_in_flight = 0;                // a pipeline stage: micro-batches its schedule held at once
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
Measurement estimate(nn::Model& model, const EngineConfig& config, int ranks, BatchSource& source, int steps = 2);

}  // namespace zs::engine
