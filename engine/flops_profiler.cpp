#include "engine/flops_profiler.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <string_view>

#include <fmt/format.h>

#include "core/clock.h"
#include "core/errors.h"
#include "core/log.h"
#include "nn/flops.h"

namespace zs::engine {
namespace {

// DeepSpeed's number_to_string: "3.41 M", "1.20 GMACs", "98.17 GFLOPS", "64", "0 MACs".
std::string si(double v, std::string_view unit = "") {
  struct Prefix {
    double scale;
    const char* name;
  };
  static constexpr Prefix kPrefixes[] = {{1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "K"}};
  for (const Prefix& p : kPrefixes) {
    if (v >= p.scale) return fmt::format("{:.2f} {}{}", v / p.scale, p.name, unit);
  }
  return unit.empty() ? fmt::format("{:.0f}", v) : fmt::format("{:.0f} {}", v, unit);
}

// DeepSpeed's duration_to_string: "76.67 ms", "34.09 us".
std::string duration(double s) {
  if (s >= 1.0) return fmt::format("{:.2f} s", s);
  if (s >= 1e-3) return fmt::format("{:.2f} ms", s * 1e3);
  return fmt::format("{:.2f} us", s * 1e6);
}

std::string per_second(double flops, double seconds) { return seconds > 0 ? si(flops / seconds, "FLOPS") : "n/a"; }

std::string percent(double part, double whole) { return fmt::format("{:.2f}%", whole > 0 ? 100.0 * part / whole : 0.0); }

void line(std::string& out, std::string_view label, const std::string& value) {
  out += fmt::format("{:<62}{}\n", label, value);
}

struct Node {
  nn::Module* module;
  int depth;
};

void collect(nn::Module& m, int depth, std::vector<Node>& out) {
  out.push_back({&m, depth});
  for (nn::Module* c : m.children()) collect(*c, depth + 1, out);
}

}  // namespace

namespace {

[[noreturn]] void throw_unwritable(const std::string& file) {
  throw IoError(fmt::format("flops_profiler.output_file: cannot write '{}' ({}); set flops_profiler.output_file to a "
                            "writable file, or remove it to print the profile in the log",
                            file, std::strerror(errno)));
}

}  // namespace

FlopsProfiler::FlopsProfiler(const FlopsProfilerConfig& config) : config_(config) {
  // Found now, before training, rather than when the profiled step ends (append: nothing is lost).
  if (!config_.output_file.empty() && !std::ofstream(config_.output_file, std::ios::app)) {
    throw_unwritable(config_.output_file);
  }
}

void FlopsProfiler::window_started(int64_t steps_done) {
  stack_.clear();
  if (recorded_ || steps_done != config_.profile_step) return;
  recording_ = true;
  profiled_step_ = steps_done;
  stats_.clear();
}

void FlopsProfiler::enter(const nn::Module& m) { stack_.push_back({&m, now_seconds(), nn::flops_performed()}); }

void FlopsProfiler::leave(const nn::Module& m, Pass pass) {
  // A frame left open by an exception (a module that threw) is not this module's: drop it.
  while (!stack_.empty() && stack_.back().module != &m) stack_.pop_back();
  if (stack_.empty()) return;
  const Frame f = stack_.back();
  stack_.pop_back();
  const double seconds = now_seconds() - f.start_s;
  const uint64_t flops = nn::flops_performed() - f.start_flops;
  ModuleStats& s = stats_[&m];
  if (pass == Pass::kForward) {
    s.forward_s += seconds;
    s.forward_flops += flops;
    ++s.forward_calls;
  } else {
    s.backward_s += seconds;
    s.backward_flops += flops;
  }
}

bool FlopsProfiler::window_finished() {
  stack_.clear();
  if (!recording_) return false;
  recording_ = false;
  recorded_ = true;
  return true;
}

FlopsProfiler::ModuleStats FlopsProfiler::stats(const nn::Module& m) const {
  auto it = stats_.find(&m);
  return it == stats_.end() ? ModuleStats{} : it->second;
}

std::string FlopsProfiler::report(nn::Module& root, const ProfiledRun& run) const {
  const ModuleStats total = stats(root);
  const double params = static_cast<double>(root.param_count());
  const double fwd = static_cast<double>(total.forward_flops), bwd = static_cast<double>(total.backward_flops);
  const double batch = static_cast<double>(run.micro_batch * run.accumulation);
  std::string out;
  out += "\n-------------------------- zeroshard flops profiler --------------------------\n";
  out += fmt::format("Profile summary at step {} (DeepSpeed's count of the steps done before it: the progress line's "
                     "step {}; rank 0):\n",
                     profiled_step_, profiled_step_ + 1);
  out += "Notations: number of parameters (params), multiply-accumulate operations (MACs), floating-point\n"
         "operations (flops), floating-point operations per second (FLOPS), fwd latency (forward propagation\n"
         "latency), bwd latency (backward propagation latency), step (weights update latency), iter latency\n"
         "(the whole step). flops are counted by the matrix-product kernels as they run (2 per MAC), forward\n"
         "and backward alike, over every micro-batch of the step; elementwise ops are not counted.\n\n";
  line(out, "world size:", fmt::format("{}", run.world_size));
  line(out, "data parallel size:", fmt::format("{}", run.world_size));
  line(out, "batch size per rank:",
       fmt::format("{} (micro-batch {} x {} accumulation steps)", run.micro_batch * run.accumulation, run.micro_batch,
                   run.accumulation));
  line(out, "params of model:", si(params));
  line(out, "fwd MACs per rank:", si(fwd / 2, "MACs"));
  line(out, "fwd flops per rank:", si(fwd));
  line(out, "fwd latency:", duration(total.forward_s));
  line(out, "fwd FLOPS per rank = fwd flops per rank / fwd latency:", per_second(fwd, total.forward_s));
  line(out, "bwd flops per rank:", si(bwd));
  line(out, "bwd latency:", duration(total.backward_s));
  line(out, "bwd FLOPS per rank = bwd flops per rank / bwd latency:", per_second(bwd, total.backward_s));
  line(out, "fwd+bwd FLOPS per rank = (fwd+bwd flops) / (fwd+bwd latency):",
       per_second(fwd + bwd, total.forward_s + total.backward_s));
  line(out, "step latency:", duration(run.step_latency_s));
  line(out, "iter latency:", duration(run.iter_latency_s));
  line(out, "FLOPS per rank = (fwd+bwd flops) / iter latency:", per_second(fwd + bwd, run.iter_latency_s));
  line(out, "samples/second:",
       run.iter_latency_s > 0 ? fmt::format("{:.2f}", batch * run.world_size / run.iter_latency_s) : "n/a");

  std::vector<Node> nodes;
  collect(root, 0, nodes);
  const int deepest = std::max_element(nodes.begin(), nodes.end(), [](const Node& a, const Node& b) {
                        return a.depth < b.depth;
                      })->depth;
  const int last_depth = config_.module_depth < 0 ? deepest : std::min(deepest, config_.module_depth);

  out += "\n----------------------------- Aggregated Profile per rank -----------------------------\n";
  out += fmt::format("Top {} modules in terms of params, MACs or fwd latency at different model depths:\n",
                     config_.top_modules);
  for (int depth = 0; depth <= last_depth; ++depth) {
    struct Sum {
      double params = 0, macs = 0, fwd_s = 0;
    };
    std::map<std::string, Sum> by_type;  // DeepSpeed sums the modules of one type at a depth
    for (const Node& n : nodes) {
      if (n.depth != depth) continue;
      const ModuleStats s = stats(*n.module);
      Sum& sum = by_type[std::string(n.module->type_name())];
      sum.params += static_cast<double>(n.module->param_count());
      sum.macs += static_cast<double>(s.forward_flops) / 2;
      sum.fwd_s += s.forward_s;
    }
    auto top = [&](auto key, auto show) {
      std::vector<std::pair<std::string, Sum>> v(by_type.begin(), by_type.end());
      std::stable_sort(v.begin(), v.end(), [&](const auto& a, const auto& b) { return key(a.second) > key(b.second); });
      v.resize(std::min<size_t>(v.size(), static_cast<size_t>(config_.top_modules)));
      std::vector<std::string> items;
      for (const auto& [name, sum] : v) items.push_back(fmt::format("'{}': '{}'", name, show(sum)));
      return fmt::format("{{{}}}", fmt::join(items, ", "));
    };
    out += fmt::format("depth {}:\n", depth);
    out += fmt::format("    params      - {}\n", top([](const Sum& s) { return s.params; }, [](const Sum& s) { return si(s.params); }));
    out += fmt::format("    MACs        - {}\n",
                       top([](const Sum& s) { return s.macs; }, [](const Sum& s) { return si(s.macs, "MACs"); }));
    out += fmt::format("    fwd latency - {}\n",
                       top([](const Sum& s) { return s.fwd_s; }, [](const Sum& s) { return duration(s.fwd_s); }));
  }

  if (config_.detailed) {
    out += "\n------------------------------ Detailed Profile per rank ------------------------------\n";
    out += "Each module profile is listed after its name in the following order:\n"
           "params, percentage of total params, MACs, percentage of total MACs, fwd latency, percentage of total\n"
           "fwd latency, fwd FLOPS, bwd latency, bwd FLOPS\n\n";
    std::vector<int> open;  // depths of the modules whose ")" is still due
    for (size_t i = 0; i < nodes.size(); ++i) {
      const Node& n = nodes[i];
      if (n.depth > last_depth) continue;
      while (!open.empty() && open.back() >= n.depth) {
        out += fmt::format("{:{}})\n", "", 2 * open.back());
        open.pop_back();
      }
      const ModuleStats s = stats(*n.module);
      const std::string figures = fmt::format(
          "{} = {} Params, {} = {} MACs, {} = {} latency, {}, {}, {}", si(static_cast<double>(n.module->param_count())),
          percent(static_cast<double>(n.module->param_count()), params), si(s.forward_flops / 2.0, "MACs"),
          percent(static_cast<double>(s.forward_flops), fwd), duration(s.forward_s), percent(s.forward_s, total.forward_s),
          per_second(static_cast<double>(s.forward_flops), s.forward_s), duration(s.backward_s),
          per_second(static_cast<double>(s.backward_flops), s.backward_s));
      const std::string head = n.depth == 0 ? std::string(n.module->type_name())
                                            : fmt::format("({}): {}", n.module->local_name(), n.module->type_name());
      const bool leaf = n.module->children().empty() || n.depth == last_depth;
      const std::string indent(static_cast<size_t>(2 * n.depth), ' ');
      if (leaf) {
        out += fmt::format("{}{}({})\n", indent, head, figures);
      } else {
        out += fmt::format("{}{}(\n{}  {}\n", indent, head, indent, figures);
        open.push_back(n.depth);
      }
    }
    while (!open.empty()) {
      out += fmt::format("{:{}})\n", "", 2 * open.back());
      open.pop_back();
    }
  }
  out += "------------------------------------------------------------------------------\n";
  return out;
}

void FlopsProfiler::publish(nn::Module& root, const ProfiledRun& run) const {
  const std::string text = report(root, run);
  if (config_.output_file.empty()) {
    ZS_LOG_INFO("{}", text);
    return;
  }
  std::ofstream f(config_.output_file, std::ios::trunc);
  f << text;
  f.flush();
  if (!f) throw_unwritable(config_.output_file);
}

}  // namespace zs::engine
