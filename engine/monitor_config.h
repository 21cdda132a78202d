// The monitoring sections of the config (DeepSpeed's names and defaults): csv_monitor, tensorboard,
// comms_logger, flops_profiler and the top-level memory_breakdown switch. What each writes: engine/monitor.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zs {
class ObjectReader;
}

namespace zs::engine {

// csv_monitor / tensorboard: files under output_path/job_name/ (DeepSpeed's layout; an empty
// output_path is the working directory, as DeepSpeed's os.path.join("", job_name) makes it).
struct MonitorOutputConfig {
  bool enabled = false;
  std::string output_path;
  std::string job_name = "DeepSpeedJobName";  // DeepSpeed's default
};

// comms_logger: per-collective counts, bytes and times (comm::OpStats), printed at the end of the run
// and, when verbose, every steps_per_print steps. prof_all false: only the collectives in prof_ops.
struct CommsLoggerConfig {
  bool enabled = false;
  bool verbose = false;
  bool prof_all = true;
  std::vector<std::string> prof_ops;  // zeroshard's collective names (comm::op_names()) or DeepSpeed's
  bool debug = false;                 // accepted; zeroshard has no call-site names to add
  // zeroshard's own: every rank records each collective's start, duration, group and bytes and writes them
  // at the end of the run as a Chrome trace (chrome://tracing, Perfetto) to this path, "{rank}" replaced
  // by the rank (else ".rank<N>" put before the extension); "": no trace (engine/monitor.h).
  std::string trace_file = "";
};

// flops_profiler (DeepSpeed's keys and defaults): per-module time and FLOPs of one optimizer step,
// printed on rank 0 when that step ends (engine/flops_profiler.h).
struct FlopsProfilerConfig {
  bool enabled = false;
  int64_t profile_step = 1;  // profiles the step that starts after this many steps (DeepSpeed's global_steps)
  int module_depth = -1;     // deepest level of the detailed profile (-1: all)
  int top_modules = 1;       // the aggregated profile's top modules per depth
  bool detailed = true;      // print the module tree
  std::string output_file;   // "": the log (stderr)
};

struct MonitorConfig {
  MonitorOutputConfig csv;          // csv_monitor
  MonitorOutputConfig tensorboard;  // tensorboard
  CommsLoggerConfig comms;          // comms_logger
  bool memory_breakdown = false;    // the per-category memory line every steps_per_print steps
  FlopsProfilerConfig flops;        // flops_profiler
};

namespace detail {
// Reads the five monitor keys of the root object into `m` (declaring them known to `root`); notes get
// a line per accepted key that has no effect.
void read_monitor(ObjectReader& root, MonitorConfig& m, std::vector<std::string>& notes);
}  // namespace detail

}  // namespace zs::engine
