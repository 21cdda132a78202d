// The projection's measurements on this machine (compute per layer, shared-memory bandwidth), its
// time of a group's collectives, and the --network parser.
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <vector>

#include "comm/group.h"
#include "core/clock.h"
#include "core/errors.h"
#include "engine/engine.h"
#include "estimate/estimate.h"
#include "memory/backend.h"
#include "nn/module.h"
#include "nn/parameter.h"
#include "project/detail/project_detail.h"
#include "project/project.h"

namespace zs::project {

namespace {

// A number followed by a unit from `units` (name -> factor); nullopt when it is not one.
std::optional<double> number_with_unit(const std::string& text, const std::vector<std::pair<std::string, double>>& units) {
  for (const auto& [name, factor] : units) {
    if (text.size() <= name.size() || text.compare(text.size() - name.size(), name.size(), name) != 0) continue;
    const std::string num = text.substr(0, text.size() - name.size());
    double v = 0;
    auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
    if (ec != std::errc() || end != num.data() + num.size() || !std::isfinite(v)) return std::nullopt;
    return v * factor;
  }
  return std::nullopt;
}

}  // namespace

Network parse_network(const std::string& text) {
  const std::string fix = "give BANDWIDTH,LATENCY such as 10gbit,20us (bandwidth in bit, kbit, mbit, gbit, tbit per second "
                          "or bps, kbps, mbps, gbps bytes per second; latency in ns, us, ms or s)";
  const size_t comma = text.find(',');
  if (comma == std::string::npos) throw ConfigError(fmt::format("--network: '{}' has no comma; {}", text, fix));
  std::string bw = text.substr(0, comma), lat = text.substr(comma + 1);
  std::transform(bw.begin(), bw.end(), bw.begin(), [](unsigned char ch) { return std::tolower(ch); });
  std::transform(lat.begin(), lat.end(), lat.begin(), [](unsigned char ch) { return std::tolower(ch); });
  // Longest names first, so "kbit" is not read as "bit" after a 'k'.
  const auto b = number_with_unit(bw, {{"tbit", 1e12 / 8}, {"gbit", 1e9 / 8}, {"mbit", 1e6 / 8}, {"kbit", 1e3 / 8},
                                       {"gbps", 1e9}, {"mbps", 1e6}, {"kbps", 1e3}, {"bit", 1.0 / 8}, {"bps", 1.0}});
  if (!b) throw ConfigError(fmt::format("--network: bandwidth '{}' is not a number with a unit; {}", bw, fix));
  if (!(*b > 0)) throw ConfigError(fmt::format("--network: bandwidth '{}' must be positive; {}", bw, fix));
  const auto l = number_with_unit(lat, {{"ns", 1e-9}, {"us", 1e-6}, {"ms", 1e-3}, {"s", 1.0}});
  if (!l) throw ConfigError(fmt::format("--network: latency '{}' is not a number with a unit; {}", lat, fix));
  if (*l < 0) throw ConfigError(fmt::format("--network: latency '{}' must not be negative; {}", lat, fix));
  return {.bytes_per_s = *b, .latency_s = *l, .text = text};
}

Machine probe_machine(int ranks_per_host) {
  Machine m;
  cpu_set_t set;
  CPU_ZERO(&set);
  m.cores_per_host = sched_getaffinity(0, sizeof(set), &set) == 0 ? std::max(1, CPU_COUNT(&set)) : 1;
  m.threads_per_rank = std::max(1, m.cores_per_host / std::max(1, ranks_per_host));
  // A shared-memory collective copies each byte into the node's window and out again: half memcpy's rate
  // (blocks of 16 MiB: beyond the caches, as the large collectives the projection times).
  const size_t n = size_t{16} << 20;
  std::vector<char> a(n, 1), b(n, 2);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = now_seconds();
    std::memcpy(b.data(), a.data(), n);
    best = std::min(best, now_seconds() - t0);
    a[static_cast<size_t>(rep)] = b[static_cast<size_t>(rep) + 1];  // keep the copies
  }
  m.shm_bytes_per_s = static_cast<double>(n) / best / 2.0;
  return m;
}

namespace detail {

namespace {
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
}  // namespace

run::RunConfig layout_config(const boost::json::value& config, const Layout& l, int ranks) {
  boost::json::value doc = config;
  if (!doc.is_object() || !doc.as_object().contains("model") || !doc.as_object().at("model").is_object()) {
    throw ConfigError("model: the config has no model section; the projection measures the built-in GPT or LLaMA it describes");
  }
  boost::json::object& model = doc.as_object().at("model").as_object();
  model["tensor_parallel_size"] = l.tp;
  if (l.pp > 1) {
    model["pipeline_parallel_size"] = l.pp;
  } else {
    model.erase("pipeline_parallel_size");
    model.erase("virtual_pipeline_size");
  }
  if (l.tp == 1) model.erase("sequence_parallel");
  return run::parse_run_config(doc, ranks);
}

ComputeCost measure_compute(const boost::json::value& config, int tp, int64_t micro_batch) {
  // One rank of tensor-parallel degree tp, alone in its data-parallel group, one micro-batch per step,
  // at 1 and 2 layers. The 2-layer run's seconds (forward, backward, optimizer) are split into one
  // layer's and the rest's (embeddings, head, loss) by the exact counts the two runs differ by: the
  // model FLOPs nn's kernels performed for the passes, the parameters for the optimizer. A split by
  // the difference of the two runs' times would be as noisy as the cores are shared; this one scales
  // with one measurement (the fastest of its steps) and the counts, which do not vary.
  struct Run {
    double forward = 1e30, backward = 1e30, optimizer = 1e30, flops = 0, params = 0;
  };
  Run runs[2];
  for (int k = 1; k <= 2; ++k) {
    boost::json::value doc = config;
    boost::json::object& o = doc.as_object();
    o["model"].as_object()["n_layer"] = k;
    o["train_micro_batch_size_per_gpu"] = micro_batch;
    o["train_batch_size"] = micro_batch;
    o.erase("gradient_accumulation_steps");
    const run::RunConfig cfg = layout_config(doc, {.dp = 1, .tp = tp, .pp = 1}, tp);
    const engine::EstimateInput in = engine::estimate_input_for_config(cfg, tp);
    nn::Model& model = *in.measure->model;
    nn::assign_names(model);
    Run& r = runs[k - 1];
    for (const nn::Parameter* p : model.all_params()) r.params += static_cast<double>(p->numel());
    const comm::Group dp = comm::Group::simulated(0, 1, "dp");
    const comm::Group own_tp = comm::Group::simulated(0, tp, "tp");
    const comm::Group& tpg = in.measure->groups.tp != nullptr ? *in.measure->groups.tp : own_tp;
    engine::Engine eng(model, in.measure->config, dp, tpg,
                       memory::make_backend(cfg.device.backend, static_cast<size_t>(cfg.device.memory_mb) << 20));
    // The first step warms up (ZeRO-3 records its order); then the fastest of up to 10 steps, at least 1
    // and until 2 s have passed: other processes on the cores only ever slow a step down. The 1-layer
    // run is needed for its counts only (the same in every step): one step.
    const double t0 = now_seconds();
    for (int s = k == 1 ? 1 : 0; s <= 10 && (s <= 1 || now_seconds() - t0 < 2.0); ++s) {
      const double wall0 = now_seconds(), cpu0 = process_cpu_seconds();
      const engine::StepReport rep = eng.train_batch(*in.measure->source);
      if (s == 0) continue;
      // A step's wall time counts what other processes took from the cores; its CPU time does not.
      // Where the step got less than one core's worth of CPU (cores shared with other processes), its
      // phases are scaled by that share: exact for one compute thread; with more, a step that got at
      // least one core's worth is taken as it is (an idle machine's threads need not all stay busy).
      const double wall = now_seconds() - wall0;
      const double share = wall > 0 ? std::min(1.0, (process_cpu_seconds() - cpu0) / wall) : 1.0;
      r.forward = std::min(r.forward, rep.forward_s * share);
      r.backward = std::min(r.backward, rep.backward_s * share);
      r.optimizer = std::min(r.optimizer, rep.optimizer_s * share);
      r.flops = static_cast<double>(rep.model_flops);
    }
  }
  const Run& two = runs[1];
  const double layer_flops = std::max(0.0, two.flops - runs[0].flops);
  const double pass_share = two.flops > 0 ? layer_flops / two.flops : 0.5;
  const double param_share = two.params > 0 ? (two.params - runs[0].params) / two.params : 0.5;
  ComputeCost c;
  c.forward_layer = two.forward * pass_share;
  c.backward_layer = two.backward * pass_share;
  c.optimizer_layer = two.optimizer * param_share;
  c.flops_layer = layer_flops;
  c.forward_rest = two.forward - 2 * c.forward_layer;
  c.backward_rest = two.backward - 2 * c.backward_layer;
  c.optimizer_rest = two.optimizer - 2 * c.optimizer_layer;
  c.flops_rest = std::max(0.0, two.flops - 2 * layer_flops);
  return c;
}

double group_seconds(const engine::GroupStep& g, const Options& opt, int group_hosts, int link_sharers) {
  double t = 0;
  for (const comm::OpStats& op : g.ops) {
    const double inter = static_cast<double>(op.bytes_inter_host);
    const double intra = static_cast<double>(op.bytes_sent - op.bytes_inter_host);
    const double n = static_cast<double>(op.count);
    // Ring hops between hosts: an all-reduce crosses 2 (H - 1) times, a gather or reduce-scatter H - 1,
    // a point-to-point transfer once.
    const bool p2p = op.name == "send" || op.name == "recv" || op.name == "sendrecv";
    const double hops = p2p ? 1.0 : (op.name == "allreduce" ? 2.0 : 1.0) * std::max(0, group_hosts - 1);
    t += n * opt.machine.shm_latency_s + intra / opt.machine.shm_bytes_per_s;
    if (inter > 0) t += n * hops * opt.network.latency_s + inter * link_sharers / opt.network.bytes_per_s;
  }
  return t;
}

}  // namespace detail
}  // namespace zs::project
