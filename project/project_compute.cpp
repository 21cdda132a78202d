// The projection's measurements on this machine (compute per layer, shared-memory bandwidth), its
// time of a group's collectives, and the --network parser.
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "comm/group.h"
#include "core/clock.h"
#include "core/errors.h"
#include "core/spin.h"
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
  const std::string fix = "give BANDWIDTH,LATENCY such as 10gbit,20us, or BANDWIDTH,LATENCY,BURST such as 1gbit,20us,125kb "
                          "(bandwidth in bit, kbit, mbit, gbit, tbit per second or bps, kbps, mbps, gbps bytes per second; "
                          "latency in ns, us, ms or s; BURST, a shaper's bucket, in b, kb, kib, mb or mib)";
  std::vector<std::string> parts;
  for (size_t from = 0;;) {
    const size_t comma = text.find(',', from);
    std::string part = text.substr(from, comma == std::string::npos ? std::string::npos : comma - from);
    std::transform(part.begin(), part.end(), part.begin(), [](unsigned char ch) { return std::tolower(ch); });
    parts.push_back(part);
    if (comma == std::string::npos) break;
    from = comma + 1;
  }
  if (parts.size() < 2) throw ConfigError(fmt::format("--network: '{}' has no comma; {}", text, fix));
  if (parts.size() > 3) throw ConfigError(fmt::format("--network: '{}' has more than three fields; {}", text, fix));
  const std::string& bw = parts[0];
  const std::string& lat = parts[1];
  // Longest names first, so "kbit" is not read as "bit" after a 'k'.
  const auto b = number_with_unit(bw, {{"tbit", 1e12 / 8}, {"gbit", 1e9 / 8}, {"mbit", 1e6 / 8}, {"kbit", 1e3 / 8},
                                       {"gbps", 1e9}, {"mbps", 1e6}, {"kbps", 1e3}, {"bit", 1.0 / 8}, {"bps", 1.0}});
  if (!b) throw ConfigError(fmt::format("--network: bandwidth '{}' is not a number with a unit; {}", bw, fix));
  if (!(*b > 0)) throw ConfigError(fmt::format("--network: bandwidth '{}' must be positive; {}", bw, fix));
  const auto l = number_with_unit(lat, {{"ns", 1e-9}, {"us", 1e-6}, {"ms", 1e-3}, {"s", 1.0}});
  if (!l) throw ConfigError(fmt::format("--network: latency '{}' is not a number with a unit; {}", lat, fix));
  if (*l < 0) throw ConfigError(fmt::format("--network: latency '{}' must not be negative; {}", lat, fix));
  double burst = 0.0;
  if (parts.size() == 3) {
    const auto u = number_with_unit(parts[2], {{"kib", 1024.0}, {"mib", 1024.0 * 1024.0}, {"kb", 1e3}, {"mb", 1e6}, {"b", 1.0}});
    if (!u) throw ConfigError(fmt::format("--network: burst '{}' is not a number with a unit; {}", parts[2], fix));
    if (*u < 0) throw ConfigError(fmt::format("--network: burst '{}' must not be negative; {}", parts[2], fix));
    burst = *u;
  }
  return {.bytes_per_s = *b, .latency_s = *l, .burst_bytes = burst, .text = text};
}

// Note [in-step link costs]
// A collective across hosts inside a training step costs more than the same collective alone
// (docs/scaling.md, "Validation": at ZeRO-3 over two namespaces at 10 Gbit/s a 32 KB gather took
// 0.87 ms in the step against 0.12-0.16 ms alone): every rank computes between collectives, so a peer
// the scheduler has taken off its core arrives late, ranks that share a core take turns, and a rank
// spinning in a collective takes CPU from one that computes. The projection, one process, cannot see
// that across hosts, so benchmarks/step_comm_probe measures it inside a real job on those hosts: rounds
// of the step's compute between two blocking collectives (given to it) then one collective, over the sizes of a step's gathers,
// buckets and transfers, each call timed on each rank (the mean over ranks of their medians: what a
// rank's step pays per call, its waits for late peers included). A collective of the projected step
// whose group spans the probe's hosts is charged the probe's seconds for its bytes across hosts per
// call, interpolated between the measured sizes; the network's latency and bandwidth are then not
// used for it (bytes inside the host are part of the measured call). The same rounds' work, wall over
// CPU seconds, is the compute's stretch in that job, which replaces ranks / cores: the CPU share a
// rank's compute really gets there (4 ranks on 2 cores that also spin in collectives get less than
// half a core each). Valid for the host layout it was measured with (validate() requires the same
// ranks per host) and groups over as many hosts; larger groups fall back to the model.
// A call is charged by its busiest member's bytes across hosts (Note [Busiest member's bytes] in
// comm/config.h): the probe's calls are even, while a ZeRO-3 gather moves its module one way
// (docs/scaling.md, "Uneven blocks"). A call whose blocks differ (its busiest member's bytes above this
// rank's own) costs at most the probe's even call of the busiest member's bytes (those bytes both ways)
// and at least its own bytes' even call and its one-way bytes at the link's rate, the host's ranks sharing
// it (group_seconds): two hosts of 2 at 100 Mbit/s ran ZeRO-1's uneven gradient buckets at the rate
// (124.5 ms a call for 1.5-1.7 MB one way, the comms logger), where the probe's even calls of those bytes
// took 1.13-1.17x the rate, both directions' TCP on the shared cores. The probe's calls come one at a
// time after compute and ride a shaper's burst; a step's calls in a row do not: the step's phases go
// through the link's bucket (Note [the link's bucket]), which replaced a floor of each collective kind at
// this rank's own bytes over the rate (it charged ZeRO-3's gathers at 1 Gbit/s 13 ms a step where they
// rode tbf's bucket in about 6).
// Where a host's ranks share its cores (ranks per host above cores per host), a rank that reaches a call
// first waits in it while its host-mates finish their work on its core, and the probe's seconds hold that
// wait; the projection's compute, stretched by ranks / cores, holds the same work, so a call is charged
// the probe's seconds less its measured wait for host-mates (host_wait_seconds). Two hosts of 2 ranks on a
// core each at 10 Gbit/s, 0.77 ms of work between calls: a 64 KB gather 1.09 ms in the probe, of it 0.42
// ms (the mean over ranks: the first of a host waits about the work, the second not at all) for the
// host-mate; the step's 26 gathers took 0.61 ms a call (comms logger, 2026-11-30 09:39 UTC), where the
// 1.09 ms had over-predicted the step 1.22x (docs/scaling.md, "Validation").
// `step_comm_probe --beside-compute` also times each call async on the comm worker beside compute, as a
// gradient bucket with overlap_comm runs; its table is not read here (+5-12% at 1 MiB, 100 Mbit/s, under
// load: not what slows ZeRO-3's step).
// The probe's elements are the config's communication dtype (`step_comm_probe --dtype`; the projection
// refuses a probe of another): the dtype decides the path, not only the bytes. At bf16 a reduce-scatter
// or all-reduce is comm's direct path (an all-to-all of the blocks, then a local sum in rank order: Note
// [16-bit reductions] in comm/detail/transport_mpi.cpp), at fp32 on hosts of one rank MPI's own, and
// OpenMPI's reduce-scatter over two ranks moved the buffer to one rank and scattered it back: at 100
// Mbit/s a 1 MiB fp32 reduce-scatter (512 KB across per rank) took 120 ms in the probe, the bf16 one 40 ms,
// as the allgather of the same bytes (2026-11-29 17:42, load 3.5). The fp32 probe of a bf16 step had
// charged each gradient bucket that 3x: the two-host rows of one rank at 100 Mbit/s were over-predicted
// 1.25 (docs/scaling.md, "Validation"). Hosts of 2 ranks took the direct path either way (the
// hierarchical transport sums in rank order where shared memory is in the group).

namespace {

// The line through the measured (bytes, seconds) points at `x`: below the smallest size its figure, above
// the largest the last two sizes' slope; never below 0.
double interpolate(const std::vector<std::pair<double, double>>& pts, double x) {
  if (pts.size() == 1 || x <= pts.front().first) return pts.front().second;
  size_t hi = 1;
  while (hi + 1 < pts.size() && pts[hi].first < x) ++hi;
  const auto& [b0, t0] = pts[hi - 1];
  const auto& [b1, t1] = pts[hi];
  const double slope = b1 > b0 ? (t1 - t0) / (b1 - b0) : 0.0;
  return std::max(0.0, t0 + slope * (x - b0));
}

}  // namespace

std::optional<double> LinkCosts::seconds(const std::string& op, double inter_bytes, bool shared_cores) const {
  return seconds_within(op, inter_bytes, std::numeric_limits<double>::infinity(), shared_cores);
}

std::optional<double> LinkCosts::seconds_within(const std::string& op, double inter_bytes, double largest,
                                                bool shared_cores) const {
  const std::string kind = op == "allgatherv"                  ? "allgather"
                           : op == "alltoallv"                 ? "alltoall"
                           : (op == "send" || op == "recv") ? "sendrecv"
                                                            : op;
  // The sizes of at most `largest` bytes (the points are ascending by bytes, the waits at the same sizes).
  auto upto = [largest](const std::vector<std::pair<double, double>>& pts) {
    std::vector<std::pair<double, double>> kept;
    for (const auto& pt : pts) {
      if (pt.first <= largest) kept.push_back(pt);
    }
    return kept;
  };
  const auto it = by_collective.find(kind);
  if (it == by_collective.end()) return std::nullopt;
  const std::vector<std::pair<double, double>> pts = upto(it->second);
  if (pts.empty()) return std::nullopt;
  double t = interpolate(pts, inter_bytes);
  if (shared_cores) {
    const auto w = host_wait_by_collective.find(kind);
    if (w != host_wait_by_collective.end()) {
      const std::vector<std::pair<double, double>> waits = upto(w->second);
      if (!waits.empty()) t = std::max(0.0, t - interpolate(waits, inter_bytes));
    }
  }
  return t;
}

LinkCosts parse_link_costs(const boost::json::value& doc, const std::string& source) {
  auto bad = [&](const std::string& what) {
    return ConfigError(fmt::format("--link-costs: '{}': {}; give the JSON of benchmarks/step_comm_probe --json "
                                   "(run over the hosts, e.g. tests/multihost/hosts.sh ... step_comm_probe --json FILE)",
                                   source, what));
  };
  if (!doc.is_object()) throw bad("not a JSON object");
  const boost::json::object& o = doc.as_object();
  auto number = [&](const boost::json::object& obj, const char* key, const std::string& path) {
    const boost::json::value* v = obj.if_contains(key);
    if (v == nullptr || !v->is_number()) throw bad(fmt::format("{} is missing or not a number", path));
    return v->to_number<double>();
  };
  LinkCosts lc;
  lc.source = source;
  lc.ranks = static_cast<int>(number(o, "ranks", "ranks"));
  lc.hosts = static_cast<int>(number(o, "hosts", "hosts"));
  lc.ranks_per_host = static_cast<int>(number(o, "ranks_per_host", "ranks_per_host"));
  lc.compute_stretch = number(o, "compute_stretch", "compute_stretch");
  if (const boost::json::value* d = o.if_contains("dtype")) {
    if (!d->is_string() || (d->as_string() != "fp32" && d->as_string() != "bf16" && d->as_string() != "fp16")) {
      throw bad("dtype is not \"fp32\", \"bf16\" or \"fp16\"");
    }
    lc.dtype = std::string(d->as_string());
  }
  if (lc.hosts < 2) throw bad(fmt::format("hosts is {}: the probe ran on one host; run it over two or more", lc.hosts));
  if (!(lc.compute_stretch > 0)) throw bad("compute_stretch must be positive");
  const boost::json::value* cs = o.if_contains("collectives");
  if (cs == nullptr || !cs->is_object()) throw bad("collectives is missing or not an object");
  for (const auto& [name, rows] : cs->as_object()) {
    const std::string path = fmt::format("collectives.{}", std::string(name));
    if (!rows.is_array()) throw bad(path + " is not an array");
    std::vector<std::pair<double, double>> pts, waits;
    for (size_t i = 0; i < rows.as_array().size(); ++i) {
      const boost::json::value& r = rows.as_array()[i];
      const std::string at = fmt::format("{}[{}]", path, i);
      if (!r.is_object()) throw bad(at + " is not an object");
      const double across = number(r.as_object(), "inter_host_bytes", at + ".inter_host_bytes");
      const double secs = number(r.as_object(), "seconds", at + ".seconds");
      // Probes from before the host-mates' wait was measured have none: nothing is left out for them.
      const double wait = r.as_object().contains("host_wait_seconds")
                              ? number(r.as_object(), "host_wait_seconds", at + ".host_wait_seconds")
                              : 0.0;
      if (across < 0 || secs < 0 || wait < 0) throw bad(at + " has a negative figure");
      if (across > 0) {  // a size that crossed no host tells nothing of the link
        pts.emplace_back(across, secs);
        waits.emplace_back(across, std::min(wait, secs));
      }
    }
    std::sort(pts.begin(), pts.end());
    std::sort(waits.begin(), waits.end());
    if (!pts.empty()) {
      lc.by_collective[std::string(name)] = std::move(pts);
      lc.host_wait_by_collective[std::string(name)] = std::move(waits);
    }
  }
  if (lc.by_collective.empty()) throw bad("no collective sent bytes across hosts");
  return lc;
}

// Note [collective probe]
// A small collective inside a host costs what its ranks wait for one another, and where they share
// cores that is the scheduler's, not the copy's: comm's shared-memory collectives meet in spinning
// barriers (Note [Polling] in comm/detail/runtime.h: spin, yielding when the node runs more ranks than
// CPUs), so a collective ends when every rank has been on a core since it began. On 2 cores shared with
// other processes that was 0.8 ms per tensor-parallel all-reduce (docs/scaling.md), against 3-5 us on an
// idle machine (comm_bench). The projection runs as one process, so it measures this directly: the
// host's R ranks on its C cores become R x c / C threads on this process's c CPUs (the same ratio of
// ranks to cores; not pinned, as mpirun --bind-to none leaves ranks), each looping over about 100 us of arithmetic (a rank's work between two collectives)
// and a barrier with comm's wait (pause; sched_yield when oversubscribed), for a fixed time. The cost of
// a collective is the mean time a thread waits in the barrier: the peers' lateness when the scheduler
// took their core during the work (stragglers), the wait for a peer that shares this thread's core, and
// the handshake itself; the work's own slowdown under load is not in it (the compute is measured apart,
// Note [projection model]). It carries the machine's load at the time of the projection (a quiet
// machine measures microseconds, a loaded one up to milliseconds: what a run at that load pays). Threads
// rather than processes: the scheduler treats both alike, and threads need no shared mapping. Rounds
// are one barrier, not a collective's several phases: comm's small collectives make one handshake per
// call (Note [Small collectives]). Where R > C, a thread also waits while its peers take their turns on
// its core: (R / C - 1) times its own work per round, which the compute's oversubscription factor R / C
// already counts, so that part is taken off the wait. The same threads' work gives the load's stretch
// of a rank's compute now: its wall seconds over its CPU seconds (1 on an idle machine, more under
// load, where other processes take turns on the cores), which --as-loaded multiplies the compute by,
// to time the step as runs measured at that load see it.
// Not measured: groups larger than the probe's threads pay more rounds (a ring's or tree's steps);
// the model charges one probe round per collective whatever the group's size. Where ranks spin on
// shared cores the wait is bimodal: whether the scheduler leaves two spinning ranks on one core decides
// it for a whole run (docs/scaling.md measured tp 2 at 0.027 and 0.084 s per step minutes apart), so
// probe_machine takes the median of five short probes, each with threads placed anew.
CollectiveProbe probe_collective(int ranks, int cores, double seconds) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  const int have = sched_getaffinity(0, sizeof(allowed), &allowed) == 0 ? std::max(1, CPU_COUNT(&allowed)) : 1;
  // R ranks on C cores as threads on this process's cores in the same ratio (not pinned: ranks move
  // between cores as the scheduler likes, and pinning them to a core another process holds would
  // measure that process).
  const int use_cores = have;
  const int threads = std::max(1, static_cast<int>(std::lround(static_cast<double>(ranks) * have / std::max(1, cores))));
  const bool yield = threads > use_cores;
  std::atomic<int> arrived{0}, generation{0};
  std::atomic<bool> stop{false};
  std::vector<double> waited(static_cast<size_t>(threads), 0.0), work_wall(waited), work_cpu(waited);
  std::vector<long> rounds(static_cast<size_t>(threads), 0);
  const double t0 = now_seconds();
  auto body = [&](int me) {
    volatile double sink = 0;
    while (true) {
      // A rank's work between two collectives (about 100 us on one core), then the barrier.
      const double start = now_seconds(), cpu0 = thread_cpu_seconds();
      double x = 1.0;
      for (int i = 0; i < 40000; ++i) x = x * 1.0000001 + 1e-9;
      sink = sink + x;
      const double arrive = now_seconds();
      work_wall[static_cast<size_t>(me)] += arrive - start;
      work_cpu[static_cast<size_t>(me)] += thread_cpu_seconds() - cpu0;
      const int gen = generation.load(std::memory_order_acquire);
      if (arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == threads) {
        arrived.store(0, std::memory_order_relaxed);
        if (now_seconds() - t0 >= seconds) stop.store(true, std::memory_order_relaxed);
        generation.fetch_add(1, std::memory_order_release);
      } else {
        while (generation.load(std::memory_order_acquire) == gen) {
          cpu_relax();
          if (yield) sched_yield();
        }
      }
      waited[static_cast<size_t>(me)] += now_seconds() - arrive;
      ++rounds[static_cast<size_t>(me)];
      if (stop.load(std::memory_order_relaxed)) return;
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(body, t);
  for (std::thread& t : pool) t.join();
  double total = 0, wall = 0, cpu = 0;
  long n = 0;
  for (size_t t = 0; t < static_cast<size_t>(threads); ++t) {
    total += waited[t];
    wall += work_wall[t];
    cpu += work_cpu[t];
    n += rounds[t];
  }
  // A thread of R on C < R cores waits in the barrier while its peers take their turns on its core:
  // (R / C - 1) times its own work, the time-sharing the compute's R / C factor already counts. The wait
  // beyond that is the collective's; the work's wall over CPU seconds is the load's stretch of it.
  const double per_round_cpu = cpu / static_cast<double>(std::max(1L, n));
  const double shared = std::max(1.0, static_cast<double>(threads) / use_cores) - 1.0;
  const double wait = total / static_cast<double>(std::max(1L, n)) - shared * per_round_cpu;
  return {.wait_s = threads > 1 ? std::max(0.0, wait) : 0.0, .stretch = cpu > 0 ? std::max(1.0, wall / cpu) : 1.0};
}

Machine probe_machine(int ranks_per_host, int cores_per_host) {
  Machine m;
  cpu_set_t set;
  CPU_ZERO(&set);
  m.cores_per_host = sched_getaffinity(0, sizeof(set), &set) == 0 ? std::max(1, CPU_COUNT(&set)) : 1;
  if (cores_per_host > 0) m.cores_per_host = cores_per_host;
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
  // Five probes of 0.1 s, each with threads placed anew by the scheduler (where it puts ranks that
  // share cores with other processes decides their wait: Note [collective probe]); the medians.
  std::vector<double> waits, stretches;
  for (int i = 0; i < 5; ++i) {
    const CollectiveProbe probe = probe_collective(ranks_per_host, m.cores_per_host, 0.1);
    waits.push_back(probe.wait_s);
    stretches.push_back(probe.stretch);
  }
  std::sort(waits.begin(), waits.end());
  std::sort(stretches.begin(), stretches.end());
  m.shm_latency_s = waits[2];
  m.loaded_stretch = stretches[2];
  return m;
}

namespace detail {

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
  if (boost::json::value* moe = model.if_contains("moe"); moe != nullptr && moe->is_object()) {
    moe->as_object()["ep_size"] = l.ep;
  } else if (l.ep > 1) {
    throw ConfigError(fmt::format("--ep {}: the model has no MoE layers (model.moe); expert parallelism needs experts", l.ep));
  }
  return run::parse_run_config(doc, ranks);
}

ComputeCost measure_compute(const boost::json::value& config, int tp, int64_t micro_batch, int period) {
  // One rank of tensor-parallel degree tp, alone in its data-parallel group, one micro-batch per step,
  // at 1 and 2 layers (of `period` blocks; an MoE model's experts all on the rank). The 2-layer run's
  // seconds (forward, backward, optimizer) are split into one
  // layer's and the rest's (embeddings, head, loss) by the exact counts the two runs differ by: the
  // model FLOPs nn's kernels performed for the passes, the parameters for the optimizer. A split by
  // the difference of the two runs' times would be as noisy as the cores are shared; this one scales
  // with one measurement (the fastest of its steps) and the counts, which do not vary.
  struct Run {
    double forward = 1e30, backward = 1e30, optimizer = 1e30, flops = 0, params = 0, expert_params = 0;
  };
  Run runs[2];
  for (int k = 1; k <= 2; ++k) {
    boost::json::value doc = config;
    boost::json::object& o = doc.as_object();
    boost::json::object& model_section = o["model"].as_object();
    model_section["n_layer"] = k * period;
    if (boost::json::value* moe = model_section.if_contains("moe"); moe != nullptr && moe->is_object()) {
      moe->as_object()["ep_size"] = 1;
    }
    o["train_micro_batch_size_per_gpu"] = micro_batch;
    o["train_batch_size"] = micro_batch;
    o.erase("gradient_accumulation_steps");
    const run::RunConfig cfg = layout_config(doc, {.dp = 1, .tp = tp, .pp = 1}, tp);
    const engine::EstimateInput in = engine::estimate_input_for_config(cfg, tp);
    nn::Model& model = *in.measure->model;
    nn::assign_names(model);
    Run& r = runs[k - 1];
    for (const nn::Parameter* p : model.all_params()) {
      r.params += static_cast<double>(p->numel());
      if (p->has_tag(nn::kTagExpert)) r.expert_params += static_cast<double>(p->numel());
    }
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
  const double layer_params = two.params - runs[0].params;
  c.expert_share_layer = layer_params > 0 ? (two.expert_params - runs[0].expert_params) / layer_params : 0.0;
  return c;
}

double group_seconds(const engine::GroupStep& g, const Options& opt, int group_hosts, int link_sharers) {
  double t = 0;
  for (const comm::OpStats& op : g.ops) {
    // A call lasts until its busiest member has moved its bytes (Note [Busiest member's bytes] in
    // comm/config.h: a ZeRO-3 gather of a module one shard holds moves the module one way).
    const double inter = static_cast<double>(op.busiest_inter_host_bytes);
    const double intra = static_cast<double>(op.busiest_bytes - op.busiest_inter_host_bytes);
    const double n = static_cast<double>(op.count);
    // Ring hops between hosts: an all-reduce crosses 2 (H - 1) times, a gather or reduce-scatter H - 1,
    // a point-to-point transfer once, and an all-to-all once (each pair's block goes straight to its member).
    const bool p2p = op.name == "send" || op.name == "recv" || op.name == "sendrecv";
    const bool direct = p2p || op.name == "alltoall" || op.name == "alltoallv";
    const double hops = direct ? 1.0 : (op.name == "allreduce" ? 2.0 : 1.0) * std::max(0, group_hosts - 1);
    if (inter > 0 && group_hosts == opt.link_costs.hosts) {
      // Measured inside a job on such hosts, per call (Note [in-step link costs]); where the host's ranks
      // share its cores, without the wait for host-mates' work, which the compute's stretch counts.
      const double busiest = inter / std::max(1.0, n);
      const bool shared = opt.ranks_per_host > opt.machine.cores_per_host;
      if (const std::optional<double> even = opt.link_costs.seconds(op.name, busiest, shared)) {
        if (direct) {  // a point-to-point transfer, or an all-to-all: each pair's block goes straight across
          t += n * *even;
          continue;
        }
        // An uneven call: at most the probe's even call of its busiest member's bytes (those bytes both
        // ways), at least its own bytes' even call and its one-way bytes at the link's rate, the host's
        // ranks sharing it (the probe's even call also pays for both directions' CPU on shared cores:
        // hosts of 2 at 100 Mbit/s, 1.13-1.5x the rate's time). An even call is the probe's.
        const double own = static_cast<double>(op.bytes_inter_host) / std::max(1.0, n);
        const double one_way = busiest * link_sharers / opt.network.bytes_per_s;
        t += n * std::min(*even, std::max(*opt.link_costs.seconds(op.name, own, shared), one_way));
        continue;
      }
    }
    t += n * opt.machine.shm_latency_s + intra / opt.machine.shm_bytes_per_s;
    if (inter > 0) t += n * hops * opt.network.latency_s + inter * link_sharers / opt.network.bytes_per_s;
  }
  return t;
}

// Note [the link's bucket]
// Each host's link sends at its rate; a shaper may also let it send `burst_bytes` above the rate after a
// pause (tc tbf's bucket, which tests/multihost/hosts.sh sets to 10 ms of the rate; a NIC at its line
// rate has none: --network's BURST, 0 by default). The probe's calls come one at a time after compute
// and ride a full bucket, where a step's calls in a row find it empty: at 100 Mbit/s ZeRO-3's gathers
// ran at the rate in the step (26 calls, 3.3 MB a host, 0.30 s) while the probe charged them 0.16 s. So
// the step's collectives across hosts go through the bucket in the step's order, each phase charged at
// least the time its bytes beyond the bucket's tokens take at the rate:
//   - stage 3, micro-batch by micro-batch (project.cpp): the forward's gathers, in the prefetch's bursts of
//     stage3_prefetch_bucket_size elements, back to back on the calling thread before the compute they
//     serve (one burst where the stage's parameters fit the prefetch bucket); the first burst finds the
//     bucket as the step's end left it (the last reductions, then the optimizer), the later ones what
//     the compute between them refilled. Then the backward's gathers, as many as the measured step's
//     backward made (none where the forward kept every module for it: Note [reuse distance] in
//     engine/detail/param_gatherer.h), and the micro-batch's reductions, spread over its backward with
//     the refill of the compute since the link's last burst;
//   - stages 1-2's reductions at the accumulation boundary after the passes (one pause);
//   - stage 1-2's parameter all-gather, after the optimizer (one pause);
//   - a pipeline's send (project.cpp): each finds the bucket refilled by at most its stage's forward
//     pass, the pause between two sends in the warm-up, and its bytes beyond that go at the rate (pp 2
//     over hosts of one rank at 100 Mbit/s: predicted / measured 0.84-0.88 with the probe's transfer
//     alone, 1.10 with the bucket).
// Each pause refills at most the bucket, the first topping up what the phase before it left.
// A phase spends its busiest member's bytes (Note [Busiest member's bytes] in comm/config.h: the calls of
// a phase mostly cross one way: a shard's modules in a row, a bucket's blocks on one host) times the
// host's ranks, and the tokens left carry to the next phase; the step repeats, so the sequence runs
// twice and the second pass counts (the steady state). Measured (docs/scaling.md, "The link's bucket"):
// at 1 Gbit/s ZeRO-3's 1.6 MB of gathers a step fit in the 1.25 MB bucket and what the passes refill,
// and the step paid the probe's costs (6 ms over its compute, against 13 ms at the rate); at 100 Mbit/s
// the same bytes went at the rate. On two hosts of 2 ranks at 1 Gbit/s (docs/scaling.md, "ZeRO-3's
// gathers come in one burst") a step's 26 gathers ran back to back before the forward, 3.3 MB of the
// two hosts' in 15.8 ms through hosts.sh's 1.25 MB bucket and 7.8 ms through a 5 MB one, where tbf
// counted 3,629 waits for tokens in 60 steps and none: the burst follows the reductions and the optimizer,
// not the passes. Refilled by the passes after it instead, it projected 0.80 of the step; in order, 1.01.
void bound_by_link(std::vector<LinkPhase>& phases, const Network& net, int link_sharers) {
  const double rate = net.bytes_per_s, bucket = net.burst_bytes;
  if (!(rate > 0)) return;
  std::vector<double> cost(phases.size());
  for (size_t i = 0; i < phases.size(); ++i) cost[i] = phases[i].seconds;
  double level = bucket;
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < phases.size(); ++i) {
      LinkPhase& ph = phases[i];
      if (ph.calls == 0 || !(ph.busiest_bytes > 0)) continue;
      const double pauses = ph.pauses > 0 ? std::min(ph.pauses, static_cast<double>(ph.calls)) : static_cast<double>(ph.calls);
      // The tokens the phase finds: the first pause tops up what was left, each later one refills what
      // the burst before it spent, each up to the bucket.
      const double refill = ph.interleaved ? rate * ph.compute_s / pauses : rate * ph.compute_s;
      const double tokens = std::min(bucket, level + refill) + (ph.interleaved ? (pauses - 1) * std::min(bucket, refill) : 0.0);
      const double need = ph.busiest_bytes * link_sharers;
      const double at_rate = std::max(0.0, need - tokens) / rate;
      ph.seconds = std::max(cost[i], at_rate);
      level = std::min(bucket, std::max(0.0, tokens + rate * ph.seconds - need));
    }
  }
}

}  // namespace detail
}  // namespace zs::project
