// TrainingMonitor: what the config's monitor sections ask for, written on rank 0 at every optimizer
// step (engine/monitor_config.h holds the sections; docs/config.md, "Monitoring").
//
//   csv_monitor   one CSV per event under output_path/job_name/, DeepSpeed's layout: the event
//                 "Train/Samples/train_loss" goes to Train_Samples_train_loss.csv, header
//                 "step,train_loss", one "step,value" row per optimizer step, where step is the count
//                 of samples trained so far (DeepSpeed's global_samples, its x axis).
//   tensorboard   the same events as scalars in one TensorBoard event file
//                 (output_path/job_name/events.out.tfevents.<time>.<host>.<pid>; engine/detail/event_file.h).
//   memory_breakdown  one log line per steps_per_print steps: device (and host) bytes by category,
//                 current and peak (memory::MemoryTracker).
//   comms_logger  a per-collective table (count, bytes, total and mean time, bus bandwidth;
//                 comm::OpStats) at the end of the run and, when verbose, every steps_per_print steps.
//
// Events: DeepSpeed's Train/Samples/train_loss, lr, loss_scale (fp16), elapsed_time_ms_forward,
// elapsed_time_ms_backward, elapsed_time_ms_step (wall_clock_breakdown), and zeroshard's
// Train/Samples/tokens_per_second (models whose inputs are token ids), samples_per_second,
// device_memory_bytes (allocated at the step's end) and device_memory_peak_bytes (peak since the start).
//
// The Engine owns one when the config enables any section and feeds it from Engine::step(), so a
// library user gets the files from the config alone. Thread-safety: one thread (the engine's).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/config.h"
#include "engine/config.h"
#include "memory/tracker.h"

namespace zs::engine {

struct StepReport;

namespace detail {
class EventFile;
}

// One optimizer step as the monitor sees it.
struct MonitorSample {
  int64_t step = 0;             // optimizer steps so far
  int64_t samples = 0;          // samples trained so far, all ranks (DeepSpeed's global_samples)
  double loss = 0.0;
  double lr = 0.0;
  double loss_scale = 1.0;
  double forward_s = 0.0, backward_s = 0.0, optimizer_s = 0.0;
  double step_s = 0.0;          // wall time of the whole step (first forward to the update's end)
  int64_t step_samples = 0;     // samples in this step, all ranks
  int64_t step_tokens = 0;      // token ids in this step, all ranks; 0 when the inputs are not tokens
  memory::MemorySnapshot memory;
  size_t device_reserved_bytes = 0;  // the device arena's reserved bytes now (its pools' regions)
};

class TrainingMonitor {
 public:
  // Creates output_path/job_name/ for the enabled file monitors on rank 0; throws IoError naming the
  // directory and the JSON key when it cannot be created or written. Other ranks write nothing.
  TrainingMonitor(const EngineConfig& config, int rank);
  ~TrainingMonitor();
  TrainingMonitor(const TrainingMonitor&) = delete;
  TrainingMonitor& operator=(const TrainingMonitor&) = delete;

  // True when the config enables any monitor section.
  static bool wanted(const EngineConfig& config);

  // Writes the step's events (rank 0) and, every steps_per_print steps, the memory line and the
  // verbose comms table. `ops`: this rank's collective tallies so far (comm::Group::op_stats).
  void on_step(const MonitorSample& sample, const std::vector<comm::OpStats>& ops);
  // The end-of-run comms table (comms_logger enabled, rank 0); once. It covers the whole run, so a second
  // table names what came after the last step (the summary's parameter digest gathers every parameter,
  // a final checkpoint agrees its tag): per-step figures are the first table less the second.
  // On every rank with comms_logger.trace_file: `trace` (comm::Group::trace) written there as a Chrome trace.
  void finish(const std::vector<comm::OpStats>& ops, const std::vector<comm::TraceEvent>& trace = {});
  // This rank's trace file (comms_logger.trace_file with its rank), "" without one.
  const std::string& trace_file() const { return trace_file_; }

  // The events of one step, in file order: (name, value). Exposed for tests.
  std::vector<std::pair<std::string, double>> events(const MonitorSample& sample) const;
  // The directory the CSV files go to ("" when csv_monitor is off or this is not rank 0).
  const std::string& csv_dir() const { return csv_dir_; }
  const std::string& tensorboard_file() const;

 private:
  void write_csv(const std::string& name, int64_t step, double value);

  EngineConfig config_;
  bool writer_ = false;  // rank 0
  int rank_ = 0;
  std::string trace_file_;
  std::string csv_dir_;
  std::vector<std::string> csv_started_;  // event names whose file has its header
  std::unique_ptr<detail::EventFile> tensorboard_;
  bool finished_ = false;
  int64_t last_step_ = 0;
  std::vector<comm::OpStats> ops_at_last_step_;  // the tallies on_step last saw
};

// "memory: device 12.0 MiB (peak 14.5) = params 1.0 (1.0) | grads ..." : the memory_breakdown line.
std::string memory_breakdown_line(const memory::MemorySnapshot& s);
// comms_logger.trace_file for `rank`: "{rank}" replaced, else ".rank<N>" before the extension.
std::string trace_file_of(const std::string& pattern, int rank);
// `events` as Chrome's trace event format: one complete event ("X") per collective, process = the rank,
// thread = the calling thread or the comm worker, args = group and bytes.
std::string chrome_trace(const std::vector<comm::TraceEvent>& events, int rank);
// DeepSpeed's comms summary shape: a header and one row per collective (filtered by the config).
std::string comms_table(const std::vector<comm::OpStats>& ops, const CommsLoggerConfig& config);

}  // namespace zs::engine
