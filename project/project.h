// Scaling projection: step time, MFU and memory per rank of a config's model for the dp x tp x pp x ep
// layouts of N ranks on hosts of R ranks joined by a network (`zeroshard project`; docs/scaling.md).
//
//   project::Options opt{.ranks = 64, .ranks_per_host = 8, .network = project::parse_network("10gbit,20us")};
//   opt.machine = project::probe_machine(opt.ranks_per_host);   // cores, shared-memory bandwidth
//   project::Report rep = project::project(config_json, opt);  // config_json: the run config (JSON)
//   std::fputs(project::format_report(rep).c_str(), stdout);
//
// What is measured and what is modelled (Note [projection model] in project.cpp):
//   - communication bytes per rank, collective and group: the engine's own code run for one rank of each
//     shard class of each pipeline stage over simulated groups that know their hosts (the estimator's
//     measurement, estimate/measure.h), so they are the counters a real run of that layout reports;
//   - memory per rank: the same measurement's device peak (zeroshard estimate's figure);
//   - compute: the layout's per-rank shapes (tp's slices, the config's micro-batch and sequence) run for
//     real over simulated groups at 2 layers; the forward, backward and optimizer seconds are split into
//     a layer's and the rest's by the exact FLOP and parameter counts of 2 layers against 1 (cached per
//     tp degree);
//   - time: a latency-bandwidth model of shared memory (inside a host) and of the network (between hosts,
//     the host's ranks sharing its link), ZeRO's overlap, and the pipeline schedule's bubble (pp::timeline).
#pragma once

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace zs::comm {
class Group;
}

namespace zs::project {

// A link: bytes per second and the one-way latency of a message.
struct Network {
  double bytes_per_s = 0.0;
  double latency_s = 0.0;
  // Bytes a host may send above the rate after a pause (a shaper's bucket, tc tbf's burst): 0 for a NIC
  // that sends at its line rate (Note [the link's bucket] in project_compute.cpp).
  double burst_bytes = 0.0;
  std::string text;  // as given: "10gbit,20us"
};
// "BANDWIDTH,LATENCY[,BURST]": bandwidth in bit, kbit, mbit, gbit, tbit (bits/s, tc's units) or bps, kbps,
// mbps, gbps (bytes/s); latency in ns, us, ms, s; burst in b, kb, kib, mb, mib (bytes). Throws ConfigError
// naming --network and the fix.
Network parse_network(const std::string& text);

// The in-step cost of collectives across hosts, measured inside a real multi-host job
// (benchmarks/step_comm_probe; Note [in-step link costs] in project_compute.cpp): per collective kind
// ("allgather", "reduce_scatter", "allreduce", "sendrecv", "alltoall"), seconds per call by the bytes the call sends
// across hosts per rank, and the compute's stretch in that job (its CPU share when ranks share cores).
struct LinkCosts {
  int ranks = 0, hosts = 0, ranks_per_host = 0;
  double compute_stretch = 1.0;
  // The elements' dtype the probe's collectives moved ("fp32", "bf16", "fp16"; files without it: "fp32"): it must be
  // the config's communication dtype, since it decides the path (Note [in-step link costs]).
  std::string dtype = "fp32";
  std::map<std::string, std::vector<std::pair<double, double>>> by_collective;  // (bytes across, seconds), ascending
  // Of those seconds, the wait for host-mates still computing on the rank's shared cores (host_wait_seconds;
  // files without it: none), at the same sizes.
  std::map<std::string, std::vector<std::pair<double, double>>> host_wait_by_collective;
  std::string source;  // the file
  bool empty() const { return by_collective.empty(); }
  // Seconds of one call of collective `op` (the comm counters' name: allgatherv as allgather, alltoallv as
  // alltoall, send and recv as sendrecv) sending `inter_bytes` across hosts, interpolated between the measured sizes
  // (below the smallest: its cost; above the largest: the last two sizes' slope); nullopt when not measured.
  // `shared_cores`: the host's ranks share its cores, so the projection's compute (ranks / cores) already
  // counts the host-mates' work a rank waited for in the call: that wait is left out (Note [in-step link costs]).
  std::optional<double> seconds(const std::string& op, double inter_bytes, bool shared_cores = false) const;
  // The same over the measured sizes of at most `largest` bytes across only (nullopt where none is that
  // small): the calls a shaper's bucket carried whole, whose cost is the call's own and not the rate's
  // (Note [the link's bucket] in project_compute.cpp).
  std::optional<double> seconds_within(const std::string& op, double inter_bytes, double largest, bool shared_cores = false) const;
};
// The probe's JSON (step_comm_probe --json). Throws ConfigError naming --link-costs, the file and the key.
LinkCosts parse_link_costs(const boost::json::value& doc, const std::string& source);

// This machine, as the model sees a host like it.
struct Machine {
  int cores_per_host = 1;          // CPUs the host's ranks share
  int threads_per_rank = 1;        // compute threads a rank runs with (launch's share: cores / ranks)
  double shm_bytes_per_s = 0.0;    // shared-memory collective bandwidth (a copy in and a copy out)
  double shm_latency_s = 5e-6;     // per collective inside a host: the probe's wait
  double loaded_stretch = 1.0;     // the probe's work: wall over CPU seconds at this machine's present load
};
// Measures the shared-memory bandwidth (memcpy of 16 MiB blocks, a copy into the window and one out) and
// the cost of a small collective among the host's ranks (probe_collective) on this machine;
// cores from the CPUs this process may use, or `cores_per_host` where > 0 (--cores-per-host).
Machine probe_machine(int ranks_per_host, int cores_per_host = 0);
// One small collective among `ranks` ranks sharing `cores` cores (Note [collective probe] in
// project_compute.cpp): threads on this machine's cores in the same ratio of ranks to cores, each
// working about 100 us and then meeting in a spinning barrier, for `seconds`.
struct CollectiveProbe {
  double wait_s = 0.0;   // the mean time a thread waits in the barrier beyond its peers' turns on its core
  double stretch = 1.0;  // the work's wall seconds over its CPU seconds: the load's slowdown of the compute
};
CollectiveProbe probe_collective(int ranks, int cores, double seconds = 0.5);

struct Options {
  int ranks = 1;
  int ranks_per_host = 1;  // 0: all the ranks on one host
  Network network;
  Machine machine;
  int max_tp = 8;  // tensor-parallel degrees tried: divisors of the host's ranks up to this
  int only_tp = 0;  // > 0: only this tensor-parallel degree (--tp)
  int only_pp = 0;  // > 0: only this pipeline-parallel degree (--pp)
  int only_ep = 0;  // > 0: only this expert-parallel degree (--ep; an MoE model's model.moe.ep_size)
  int exact_ranks = 16;  // up to this many data-parallel ranks, every rank is measured on its own
  // false: the compute of an idle host (ranks beyond its cores time-share them: x ranks / cores); true
  // (--as-loaded): of this machine at its present load (x ranks / cores x the probe's measured stretch),
  // to compare with runs measured now.
  bool as_loaded = false;
  // The program's own collectives at each step boundary over its groups (engine::MeasureGroups):
  // zeroshard project passes zeroshard train's (launch::agree_preempted), so the bytes are a train run's.
  std::function<void(std::span<const comm::Group* const>)> step_boundary;
  // Measured in-step costs of collectives across hosts (--link-costs): where given, a collective whose
  // group spans the probe's hosts is charged the probe's cost for its bytes instead of the network's
  // latency-bandwidth model, and with several hosts the compute the probe's stretch instead of ranks /
  // cores (and --as-loaded's stretch): the probe ran with the job's ranks on its cores.
  LinkCosts link_costs;
};

// Bytes one rank sends in one step (the summary's bytes_sent_per_step.exact_mean and
// exact_inter_host_mean; tensor_parallel_mean; the pipeline stage's bytes).
struct RankBytes {
  int rank = 0;
  // The rank whose measurement these are: itself, or above Options::exact_ranks data-parallel ranks
  // the first of its shard class (at stage 3 a rank's own part of each gathered module moves its bytes
  // a little from the class's).
  int measured_as = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_inter_host = 0;
  uint64_t tp_bytes = 0;
  uint64_t pp_bytes = 0;
  uint64_t ep_bytes = 0;  // the MoE layers' all-to-alls over the expert-parallel group
};

// ep: the expert-parallel degree of an MoE model (ep consecutive data-parallel ranks hold its experts
// between them; 1 for a dense model).
struct Layout {
  int dp = 1, tp = 1, pp = 1, ep = 1;
};

// One collective of a group in the projected step (of the slowest stage's first rank): its calls and bytes
// (the counters' rule) and the seconds group_seconds charges them, before the link's bucket bounds a phase.
struct CollectiveCost {
  std::string group, op;
  uint64_t calls = 0, bytes_sent = 0, bytes_inter_host = 0, busiest_inter_host_bytes = 0;
  int hosts = 1;  // the hosts the group spans
  double seconds = 0.0;
};

struct Projection {
  Layout layout;
  bool valid = false;
  std::string why_not;        // invalid: the config's or the layout's reason
  int zero_stage = 0;
  int64_t micro_batches = 1;  // per step and data-parallel rank
  double step_s = 0.0;
  double compute_s = 0.0;     // the slowest stage's passes and optimizer, without communication
  double pipeline_s = 0.0;    // the schedule's makespan (passes, tp and pp communication, bubble)
  double bubble = 0.0;        // of pipeline_s, the slowest stage's idle share
  double pp_transfer_s = 0.0; // a pipeline send's mean time, a delay before the receiving pass (Note [transfer delay])
  double dp_comm_s = 0.0;     // the data-parallel collectives' time, of which exposed:
  double dp_exposed_s = 0.0;
  double tp_comm_s = 0.0;
  double ep_comm_s = 0.0;     // the MoE layers' all-to-alls, on the passes' critical path
  double optimizer_s = 0.0;
  uint64_t collectives_per_step = 0;  // the slowest stage's rank: its collectives and transfers, all groups
  double mfu = 0.0;           // model FLOPs per step / (step_s x the rank's peak), as the summary
  double tokens_per_s = 0.0;  // all ranks together
  uint64_t device_peak_bytes = 0;  // the largest rank's (estimator's measured peak)
  uint64_t capacity_bytes = 0;     // device.memory_mb
  bool fits = false;
  std::vector<RankBytes> ranks;    // every world rank
  std::vector<CollectiveCost> collectives;  // the slowest stage's, by group and collective
};

struct Report {
  std::string model;       // the config's model in words
  Options options;
  double peak_flops_per_s = 0.0;  // one rank's (nn::product_peak at threads_per_rank)
  double oversubscription = 1.0;  // ranks per core above 1: compute time factor
  std::vector<Projection> layouts;  // valid ones by tokens per second (step time per token), then the refused
};

// Projects every dp x tp x pp x ep layout of options.ranks ranks (tp dividing ranks_per_host and at most
// max_tp; pp every divisor the config accepts; for an MoE model ep every divisor of dp that divides its
// experts, a dense model ep 1; only_tp / only_pp / only_ep select one). Throws ConfigError for
// ranks < 1, ranks_per_host not dividing ranks, only_tp x only_pp x only_ep not dividing ranks, only_ep
// above 1 for a dense model, several hosts without a network, or a config without a model section.
Report project(const boost::json::value& config, const Options& options);
// The checks of the options project() starts with (ConfigError as above), for a caller that wants
// them before it measures the machine.
void validate(const Options& options);
// The same for several world sizes (options.ranks replaced by each), measuring the compute once per
// tensor-parallel degree for all of them.
std::vector<Report> project(const boost::json::value& config, const Options& options, const std::vector<int>& ranks);

std::string format_report(const Report& report, int rows = 10);
boost::json::object report_to_json(const Report& report);

}  // namespace zs::project
