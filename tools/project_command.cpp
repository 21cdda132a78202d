// `zeroshard project`: predicted step time, MFU and memory per rank of the config's model for the
// dp x tp x pp x ep layouts of N ranks on hosts joined by a network (project/project.h; docs/scaling.md).
// Runs in one process, no MPI.
//
//   zeroshard project --config run.json --ranks 64 --ranks-per-host 8 --network 10gbit,20us
//   zeroshard project --config run.json --ranks 4 --json out.json
#include <boost/json/array.hpp>
#include <boost/json/serialize.hpp>
#include <boost/program_options.hpp>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <fstream>

#include "core/errors.h"
#include "core/json.h"
#include "launch/launch.h"
#include "launch/preemption.h"
#include "project/project.h"
#include "tools/commands.h"
#include "tools/options.h"

namespace zs::tools {

namespace {

namespace po = boost::program_options;

constexpr const char* kProjectUsage =
    "usage: zeroshard project --config FILE --ranks N[,N...] [--ranks-per-host R]\n"
    "                         [--network BW,LATENCY[,BURST]]\n"
    "                         [--cores-per-host C] [--max-tp T] [--tp T] [--pp P] [--ep E] [--exact-ranks K]\n"
    "                         [--rows K] [--json FILE] [--as-loaded] [--link-costs FILE]\n"
    "  --ranks-per-host R: ranks on each host (divides N; default N: one host)\n"
    "  --network BW,LATENCY[,BURST]: the link between hosts, e.g. 10gbit,20us or 1.25gbps,50us (needed with several\n"
    "    hosts); BURST: bytes a shaper lets a host send above the rate after a pause (tc tbf's burst, e.g. 125kb;\n"
    "    default 0: a NIC at its line rate)\n"
    "  --cores-per-host C: CPUs a host's ranks share (default: this machine's)\n"
    "  --ep E: an MoE model's expert-parallel degree (model.moe.ep_size; default: every divisor of dp that divides\n"
    "    its experts)\n"
    "  --link-costs FILE: in-step costs of collectives across hosts, measured by benchmarks/step_comm_probe\n";

// "64" or "8,64,512" (world sizes, each >= 1).
std::vector<int> parse_ranks(const std::string& text) {
  std::vector<int> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string one = text.substr(at, comma - at);
    int n = 0;
    auto [end, ec] = std::from_chars(one.data(), one.data() + one.size(), n);
    if (one.empty() || ec != std::errc() || end != one.data() + one.size() || n < 1) {
      throw ConfigError(fmt::format("--ranks: '{}' is not a world size; give a positive whole number of ranks (or several, "
                                    "comma-separated: 8,64,512)", one));
    }
    out.push_back(n);
    at = comma + 1;
  }
  return out;
}

int run_project(const po::variables_map& vm) {
  if (!vm.count("config")) throw ConfigError("project: give the run config with --config FILE");
  if (!vm.count("ranks")) throw ConfigError("project: give the world size with --ranks N");
  project::Options opt;
  const std::vector<int> world_sizes = parse_ranks(vm["ranks"].as<std::string>());
  opt.ranks = world_sizes.front();
  if (world_sizes.size() > 1 && !vm.count("ranks-per-host")) {
    throw ConfigError("--ranks: several world sizes need --ranks-per-host (the compute is measured once, for a host of "
                      "that many ranks)");
  }
  // Without --ranks-per-host the world is one host (project::Options: 0).
  opt.ranks_per_host = vm.count("ranks-per-host") ? vm["ranks-per-host"].as<int>() : 0;
  if (vm.count("ranks-per-host") && opt.ranks_per_host < 1) {
    throw ConfigError(fmt::format("--ranks-per-host: must be at least 1, got {}", opt.ranks_per_host));
  }
  if (vm.count("network")) opt.network = project::parse_network(vm["network"].as<std::string>());
  if (vm.count("link-costs")) {
    const std::string path = vm["link-costs"].as<std::string>();
    opt.link_costs = project::parse_link_costs(parse_json_file(path), path);
  }
  opt.max_tp = vm["max-tp"].as<int>();
  if (vm.count("tp")) opt.only_tp = opt.max_tp = vm["tp"].as<int>();
  if (vm.count("pp")) opt.only_pp = vm["pp"].as<int>();
  if (vm.count("ep")) opt.only_ep = vm["ep"].as<int>();
  opt.exact_ranks = vm["exact-ranks"].as<int>();
  opt.as_loaded = vm.count("as-loaded") > 0;
  if (vm.count("tp") && opt.only_tp < 1) throw ConfigError(fmt::format("--tp: must be at least 1, got {}", opt.only_tp));
  if (vm.count("pp") && opt.only_pp < 1) throw ConfigError(fmt::format("--pp: must be at least 1, got {}", opt.only_pp));
  if (vm.count("ep") && opt.only_ep < 1) throw ConfigError(fmt::format("--ep: must be at least 1, got {}", opt.only_ep));
  if (opt.max_tp < 1) throw ConfigError(fmt::format("--max-tp: must be at least 1, got {}", opt.max_tp));
  const int rows = vm["rows"].as<int>();
  const boost::json::value config = parse_json_file(vm["config"].as<std::string>());
  for (int n : world_sizes) {  // the flags' errors before the machine is measured
    project::Options o = opt;
    o.ranks = n;
    project::validate(o);
  }
  // The host's ranks: the given ones, else (one host each) the first world size's.
  const int host_ranks = opt.ranks_per_host > 0 ? opt.ranks_per_host : world_sizes.front();
  const int cores = vm.count("cores-per-host") ? vm["cores-per-host"].as<int>() : 0;
  if (vm.count("cores-per-host") && cores < 1) throw ConfigError(fmt::format("--cores-per-host: must be at least 1, got {}", cores));
  // Once per invocation: every layout and world size is charged the same measured collective.
  opt.machine = project::probe_machine(host_ranks, cores);
  // The compute is measured with the threads a rank of that host gets: its share of the host's cores
  // (threads_per_rank: cores / ranks, at least 1), at most this machine's CPUs. set_blas_threads splits
  // this machine's CPUs over the ranks it is told of, so it is told as many as give that share. (It was
  // told min(ranks, cores) ranks: right where the host has this machine's cores, but a host of fewer,
  // the two-host validation's 1 core each, got a rank measured with 2 threads where it has 1 core.)
  const int cpus = std::max(1, static_cast<int>(launch::allowed_cpus().size()));
  launch::set_blas_threads(std::max(1, cpus / std::min(cpus, opt.machine.threads_per_rank)));
  // zeroshard train's step boundary (tools/train_command.cpp): the stop agreement over dp, tp and pp,
  // run over the measured groups. Its watch must not swallow a Ctrl-C here: the first signal ends the
  // projection at once, as it would without the watch.
  const launch::PreemptionWatch watch([]() noexcept { _exit(130); });
  opt.step_boundary = [&watch](std::span<const comm::Group* const> groups) { launch::agree_preempted(watch, groups); };
  const std::vector<project::Report> reps = project::project(config, opt, world_sizes);
  boost::json::array all;
  for (const project::Report& rep : reps) {
    std::fputs(project::format_report(rep, rows).c_str(), stdout);
    all.push_back(project::report_to_json(rep));
  }
  if (vm.count("json")) {
    const std::string path = vm["json"].as<std::string>();
    std::ofstream out(path);
    // One world size: its object; several: an array of them.
    out << (all.size() == 1 ? boost::json::serialize(all.front()) : boost::json::serialize(all)) << "\n";
    if (!out) throw IoError(fmt::format("--json: cannot write '{}'", path));
  }
  return 0;
}

}  // namespace

int project_command(const std::vector<std::string>& args) {
  po::options_description opts("options");
  opts.add_options()("help,h", "show this help")("config", po::value<std::string>(), "the run config (JSON, with a model section)")(
      "ranks", po::value<std::string>(), "world size N, or several: 8,64,512")("ranks-per-host", po::value<int>(), "ranks on each host (divides N)")(
      "network", po::value<std::string>(), "the link between hosts: BANDWIDTH,LATENCY[,BURST] (10gbit,20us)")(
      "cores-per-host", po::value<int>(), "CPUs of a host (default: this machine's)")(
      "max-tp", po::value<int>()->default_value(8), "largest tensor-parallel degree tried")(
      "tp", po::value<int>(), "only layouts of this tensor-parallel degree")(
      "pp", po::value<int>(), "only layouts of this pipeline-parallel degree")(
      "ep", po::value<int>(), "only layouts of this expert-parallel degree (an MoE model's)")(
      "exact-ranks", po::value<int>()->default_value(16),
      "up to this many data-parallel ranks each is measured on its own (exact bytes per rank at stage 3)")(
      "rows", po::value<int>()->default_value(10), "layouts shown in the table")(
      "as-loaded", "time the compute at this machine's present load (measured) instead of an idle host's")(
      "link-costs", po::value<std::string>(), "in-step collective costs across hosts (step_comm_probe --json FILE)")(
      "json", po::value<std::string>(), "also write the projection as JSON to FILE");
  po::variables_map vm;
  if (const std::optional<int> code = parse_or_help("project", args, opts, kProjectUsage, vm)) return *code;
  return run_reporting_errors(run_project, vm);
}

}  // namespace zs::tools
