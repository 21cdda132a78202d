// FlopsProfiler: DeepSpeed's flops_profiler for zeroshard. Records, for one optimizer step, each
// module's forward and backward wall time and FLOPs, and prints DeepSpeed's three-part profile when
// the step ends: the summary (flops, latency and FLOPS of forward, backward and the whole step), the
// aggregated profile (the top modules by params, MACs and forward latency at each depth, summed over
// the modules of one type as DeepSpeed does) and the detailed module tree.
//
//   FlopsProfiler p(config.monitor.flops);
//   p.window_started(steps_done);           // at each optimizer step's first forward
//   p.enter(module); ... p.leave(module, FlopsProfiler::Pass::kForward);   // the engine's module hooks
//   if (p.window_finished()) write(p.report(model, run));   // at the step's end: true once, the profiled step
//
// What is measured, and how it differs from DeepSpeed's:
//   - FLOPs are counted by the kernels as they run (nn/flops.h: matrix products, 2 per MAC), forward
//     and backward alike; DeepSpeed counts the forward by patching torch functions and takes backward
//     as 2x forward. Elementwise ops are not counted (nn/flops.h says why).
//   - A module's figures include its children's (as DeepSpeed's) and cover every micro-batch of the
//     profiled step (DeepSpeed profiles one forward); the summary divides nothing by micro-batches.
//   - Times are wall times on the thread driving the model, from the moment the module's parameters
//     are gathered (ZeRO-3) to the moment before they are released.
// Thread-safety: one thread (the engine's).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/monitor_config.h"
#include "nn/module.h"

namespace zs::engine {

// The run around the profiled step, for the summary.
struct ProfiledRun {
  int world_size = 1;
  int64_t micro_batch = 1;    // samples per micro-batch, per rank
  int64_t accumulation = 1;   // micro-batches per step
  double step_latency_s = 0;  // the optimizer's part of the step (reductions' tail, clipping, update)
  double iter_latency_s = 0;  // the whole step: first forward to the update's end
};

class FlopsProfiler {
 public:
  enum class Pass : uint8_t { kForward, kBackward };

  // Throws IoError naming config.output_file and its key when that file cannot be written.
  explicit FlopsProfiler(const FlopsProfilerConfig& config);

  // At an optimizer step's first forward, with the steps done before it: starts recording when it is
  // config.profile_step.
  void window_started(int64_t steps_done);
  // True while the profiled step runs.
  bool recording() const { return recording_; }
  // A module's forward or backward starts / ends (calls nest like the modules). Only while recording.
  void enter(const nn::Module& m);
  void leave(const nn::Module& m, Pass pass);
  // At the step's end: stops recording; true when this was the profiled step (report() is then due).
  bool window_finished();
  // A failed pass: the modules it entered never leave.
  void abandon_pass() { stack_.clear(); }

  // The profile of the recorded step (DeepSpeed's layout; see the file comment).
  std::string report(nn::Module& root, const ProfiledRun& run) const;
  // Writes report() to config.output_file (IoError naming the file and the key) or the log.
  void publish(nn::Module& root, const ProfiledRun& run) const;

  struct ModuleStats {
    double forward_s = 0.0, backward_s = 0.0;
    uint64_t forward_flops = 0, backward_flops = 0;
    int64_t forward_calls = 0;
  };
  // Zero stats for a module that did not run in the recorded step. Exposed for tests.
  ModuleStats stats(const nn::Module& m) const;

 private:
  struct Frame {
    const nn::Module* module;
    double start_s;
    uint64_t start_flops;
  };
  FlopsProfilerConfig config_;
  bool recording_ = false;
  bool recorded_ = false;
  int64_t profiled_step_ = 0;
  std::vector<Frame> stack_;
  std::unordered_map<const nn::Module*, ModuleStats> stats_;
};

}  // namespace zs::engine
