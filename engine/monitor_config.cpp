#include "engine/monitor_config.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/errors.h"
#include "core/json.h"

namespace zs::engine::detail {
namespace {

// Collective names a comms_logger.prof_ops entry may use: zeroshard's (comm::OpStats::name) and
// DeepSpeed's (deepspeed/comm/comm.py's function names), mapped to zeroshard's.
struct OpAlias {
  std::string_view name;
  std::vector<std::string_view> ours;
};
const std::vector<OpAlias>& op_aliases() {
  static const std::vector<OpAlias> k = {
      {"allreduce", {"allreduce"}},           {"reduce_scatter", {"reduce_scatter"}},
      {"allgather", {"allgather"}},           {"allgatherv", {"allgatherv"}},
      {"broadcast", {"broadcast"}},           {"alltoall", {"alltoall"}},
      {"alltoallv", {"alltoallv"}},           {"barrier", {"barrier"}},
      {"split", {"split"}},                   {"all_reduce", {"allreduce"}},
      {"inference_all_reduce", {"allreduce"}}, {"reduce_scatter_tensor", {"reduce_scatter"}},
      {"reduce_scatter_fn", {"reduce_scatter"}}, {"all_gather", {"allgather", "allgatherv"}},
      {"all_gather_into_tensor", {"allgather", "allgatherv"}}, {"allgather_fn", {"allgather", "allgatherv"}},
      {"all_to_all_single", {"alltoall", "alltoallv"}}, {"all_to_all", {"alltoall", "alltoallv"}}};
  return k;
}

void read_output(ObjectReader& r, MonitorOutputConfig& c) {
  r.read("enabled", c.enabled);
  r.read("output_path", c.output_path);
  r.read("job_name", c.job_name);
  if (c.job_name.empty() || c.job_name.find('/') != std::string::npos) {
    throw ConfigError(fmt::format("{}: '{}' must name one directory (non-empty, no '/'); put the parent directories in "
                                  "{}",
                                  r.path_of("job_name"), c.job_name, r.path_of("output_path")));
  }
}

}  // namespace

void read_monitor(ObjectReader& root, MonitorConfig& m, std::vector<std::string>& notes) {
  root.read("memory_breakdown", m.memory_breakdown);
  root.read_object("csv_monitor", [&](ObjectReader& r) { read_output(r, m.csv); });
  root.read_object("tensorboard", [&](ObjectReader& r) { read_output(r, m.tensorboard); });
  root.read_object("comms_logger", [&](ObjectReader& r) {
    CommsLoggerConfig& c = m.comms;
    r.read("enabled", c.enabled);
    r.read("verbose", c.verbose);
    r.read("prof_all", c.prof_all);
    if (r.read("trace_file", c.trace_file) && !c.trace_file.empty() && !c.enabled) {
      notes.push_back(fmt::format("{}: no trace is written while {} is false", r.path_of("trace_file"), r.path_of("enabled")));
    }
    std::vector<std::string> ops;
    r.read("prof_ops", ops);
    for (size_t i = 0; i < ops.size(); ++i) {
      const auto& aliases = op_aliases();
      auto it = std::find_if(aliases.begin(), aliases.end(), [&](const OpAlias& a) { return a.name == ops[i]; });
      if (it == aliases.end()) {
        std::vector<std::string> names;
        for (const OpAlias& a : aliases) names.emplace_back(a.name);
        const std::string near = closest_match(ops[i], names);
        throw ConfigError(fmt::format("{}: '{}' is not a collective zeroshard runs{}; use one of: {}",
                                      json_path_index(r.path_of("prof_ops"), i), ops[i],
                                      near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near),
                                      fmt::join(names, ", ")));
      }
      for (std::string_view ours : it->ours) {
        if (std::find(c.prof_ops.begin(), c.prof_ops.end(), ours) == c.prof_ops.end()) c.prof_ops.emplace_back(ours);
      }
    }
    if (r.read("debug", c.debug) && c.debug) {
      notes.push_back(fmt::format("{}: accepted; has no effect in zeroshard: collectives are tallied by operation, "
                                  "without the calling function's name",
                                  r.path_of("debug")));
    }
  });
  root.read_object("flops_profiler", [&](ObjectReader& r) {
    FlopsProfilerConfig& c = m.flops;
    r.read("enabled", c.enabled);
    r.read("profile_step", c.profile_step, IntRange::non_negative());
    r.read("module_depth", c.module_depth, IntRange{-1, 1000});
    r.read("top_modules", c.top_modules, IntRange{1, 1000});
    r.read("detailed", c.detailed);
    if (const boost::json::value* v = r.find("output_file"); v != nullptr && !v->is_null()) {
      from_json(*v, r.path_of("output_file"), c.output_file);
    }
    double recompute = 0.0;
    if (r.read("recompute_fwd_factor", recompute, RealRange{0.0, 1.0}) && recompute != 0.0) {
      notes.push_back(fmt::format("{}: accepted; has no effect in zeroshard: backward FLOPs are counted as the kernels "
                                  "run them, recomputation included, not estimated from the forward's",
                                  r.path_of("recompute_fwd_factor")));
    }
  });
}

}  // namespace zs::engine::detail
