// The monitoring sections of the config (DeepSpeed's names and defaults): csv_monitor, tensorboard,
// comms_logger and the top-level memory_breakdown switch. What each writes: engine/monitor.h.
#pragma once

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
};

struct MonitorConfig {
  MonitorOutputConfig csv;          // csv_monitor
  MonitorOutputConfig tensorboard;  // tensorboard
  CommsLoggerConfig comms;          // comms_logger
  bool memory_breakdown = false;    // the per-category memory line every steps_per_print steps
};

namespace detail {
// Reads the four monitor keys of the root object into `m` (declaring them known to `root`); notes get
// a line per accepted key that has no effect.
void read_monitor(ObjectReader& root, MonitorConfig& m, std::vector<std::string>& notes);
}  // namespace detail

}  // namespace zs::engine
