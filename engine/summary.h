// The run summary: one JSON object written by rank 0 after a run (docs/design.md; fields in README.md).
//
//   SummaryRecorder rec(engine);
//   rec.record(engine.train_batch(source), tokens_in_step);   // every step
//   rec.write(path, world_counters_of_this_rank);              // collective: every rank calls it (world rank 0 writes)
#pragma once

#include <boost/json/object.hpp>

#include <string>
#include <utility>
#include <vector>

#include "comm/config.h"
#include "engine/engine.h"

namespace zs::engine {

class SummaryRecorder {
 public:
  explicit SummaryRecorder(const Engine& engine) : engine_(engine) {}

  // Records one optimizer step and the tokens it trained on (all ranks together).
  void record(const StepReport& report, double step_seconds, int64_t tokens);

  const std::vector<double>& loss_history() const { return losses_; }
  // Records an evaluation (Engine::eval_batch) after `step` optimizer steps: the summary's
  // eval_loss_history.
  void record_eval(int64_t step, double loss) { evals_.emplace_back(step, loss); }
  // Tokens per second over the recorded steps, the first excluded when there are several (warm-up).
  double tokens_per_second() const;
  // Model FLOPs utilisation of this rank over the same steps as tokens_per_second: its model FLOPs
  // (StepReport::model_flops) per second over the peak of its cores for the run's compute dtype
  // (nn::product_peak). The summary's "mfu" object has the figure for all ranks together.
  double mfu() const;

  // Collective over the engine's groups (data- and tensor-parallel): gathers every rank's memory and
  // comm figures and returns the summary object (complete on every rank).
  boost::json::object build(const comm::CommCounters& counters) const;
  // build() plus the fields of `extra` (a program's own, e.g. the MoE routing figures) and, on rank 0,
  // writes it to `path` (throws IoError naming the path).
  void write(const std::string& path, const comm::CommCounters& counters, const boost::json::object& extra = {}) const;

 private:
  const Engine& engine_;
  std::vector<double> losses_;
  std::vector<std::pair<int64_t, double>> evals_;
  std::vector<double> step_seconds_;
  std::vector<int64_t> tokens_;
  std::vector<uint64_t> model_flops_, recompute_flops_;  // this rank's, per step (StepReport)
  int64_t skipped_ = 0;
  struct StepBytes {
    uint64_t steps = 0;
    uint64_t bytes = 0;
    uint64_t grad_bytes = 0;  // of `bytes`, the gradient reductions' (StepReport::grad_comm_bytes_sent)
    uint64_t inter_host_bytes = 0;  // of `bytes`, across hosts (StepReport::comm_bytes_inter_host)
  };
  StepBytes exact_steps_, compressed_steps_;  // this rank's bytes sent, by kind of step
  memory::TransferStats transfers_;           // this rank's host <-> device bytes over the steps
  double pp_seconds_ = 0, pp_busy_seconds_ = 0;  // this rank's pipeline schedule (StepReport::pipeline)
  uint64_t pp_bytes_ = 0;
  uint64_t tp_bytes_ = 0;                     // this rank's bytes over the tensor-parallel group
};

// Peak resident set size of this process in bytes (getrusage).
uint64_t rss_peak_bytes();

}  // namespace zs::engine
