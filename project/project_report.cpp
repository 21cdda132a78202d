// The projection's table and JSON (zeroshard project; docs/scaling.md lists the fields).
#include <boost/json/array.hpp>

#include <algorithm>

#include "core/errors.h"
#include "estimate/estimate.h"
#include "project/project.h"

namespace zs::project {

namespace {

std::string seconds(double s) {
  if (s >= 1.0) return fmt::format("{:.3f} s", s);
  if (s >= 1e-3) return fmt::format("{:.2f} ms", s * 1e3);
  return fmt::format("{:.1f} us", s * 1e6);
}

}  // namespace

std::string format_report(const Report& rep, int rows) {
  const Options& o = rep.options;
  std::string out = fmt::format(
      "{} on {} ranks, {} per host ({} host(s)); network {}; host: {} cores, {} compute thread(s) per rank{}; shared "
      "memory {:.2f} GB/s, {:.1f} us per collective (measured); one rank's peak {:.1f} GFLOP/s{}\n",
      rep.model, o.ranks, o.ranks_per_host, o.ranks / o.ranks_per_host, o.network.text.empty() ? "none" : o.network.text,
      o.machine.cores_per_host, o.machine.threads_per_rank,
      o.ranks_per_host > o.machine.cores_per_host
          ? fmt::format(" (ranks share cores: compute x{:.2f})", static_cast<double>(o.ranks_per_host) / o.machine.cores_per_host)
          : std::string(),
      o.machine.shm_bytes_per_s / 1e9, o.machine.shm_latency_s * 1e6, rep.peak_flops_per_s / 1e9,
      o.as_loaded ? fmt::format("; at the present load (compute x{:.2f})", o.machine.loaded_stretch) : std::string());
  if (!o.link_costs.empty()) {
    out += fmt::format("collectives across hosts: in-step costs measured in '{}' ({} hosts of {} ranks); compute x{:.2f}\n",
                       o.link_costs.source, o.link_costs.hosts, o.link_costs.ranks_per_host, rep.oversubscription);
  }
  // An MoE model's expert-parallel degree and all-to-alls in two more columns.
  const bool moe = std::any_of(rep.layouts.begin(), rep.layouts.end(), [](const Projection& p) { return p.layout.ep > 1; });
  out += fmt::format("{:>4} {:>4} {:>4}{} {:>5} {:>11} {:>10} {:>9} {:>7} {:>11} {:>11} {:>11}{} {:>13} {:>10} {:>4}\n", "dp",
                     "tp", "pp", moe ? fmt::format(" {:>4}", "ep") : std::string(), "ZeRO", "step", "tokens/s", "MFU", "bubble",
                     "dp comm", "exposed", "tp comm", moe ? fmt::format(" {:>11}", "ep comm") : std::string(), "bytes/rank",
                     "peak/rank", "fit");
  int shown = 0;
  for (const Projection& p : rep.layouts) {
    if (!p.valid || shown++ >= rows) continue;
    uint64_t most = 0;
    for (const RankBytes& b : p.ranks) most = std::max(most, b.bytes_sent);
    out += fmt::format("{:>4} {:>4} {:>4}{} {:>5} {:>11} {:>10.1f} {:>8.2f}% {:>6.1f}% {:>11} {:>11} {:>11}{} {:>13} {:>10} {:>4}\n",
                       p.layout.dp, p.layout.tp, p.layout.pp, moe ? fmt::format(" {:>4}", p.layout.ep) : std::string(),
                       p.zero_stage, seconds(p.step_s), p.tokens_per_s, 100 * p.mfu, 100 * p.bubble, seconds(p.dp_comm_s),
                       seconds(p.dp_exposed_s), seconds(p.tp_comm_s),
                       moe ? fmt::format(" {:>11}", seconds(p.ep_comm_s)) : std::string(), engine::format_bytes_si(most),
                       engine::format_bytes(p.device_peak_bytes), p.fits ? "yes" : "NO");
  }
  for (const Projection& p : rep.layouts) {
    if (!p.valid) {
      out += fmt::format("refused dp {} x tp {} x pp {}{}: {}\n", p.layout.dp, p.layout.tp, p.layout.pp,
                         moe ? fmt::format(" x ep {}", p.layout.ep) : std::string(), p.why_not);
    }
  }
  return out;
}

boost::json::object report_to_json(const Report& rep) {
  const Options& o = rep.options;
  boost::json::array layouts;
  for (const Projection& p : rep.layouts) {
    boost::json::object j{{"dp", p.layout.dp}, {"tp", p.layout.tp}, {"pp", p.layout.pp}, {"ep", p.layout.ep}, {"valid", p.valid}};
    if (!p.valid) {
      j["why_not"] = p.why_not;
      layouts.push_back(std::move(j));
      continue;
    }
    boost::json::array ranks;
    for (const RankBytes& b : p.ranks) {
      ranks.push_back(boost::json::object{{"rank", b.rank},
                                          {"measured_as", b.measured_as},
                                          {"bytes_sent_per_step", b.bytes_sent},
                                          {"bytes_sent_inter_host_per_step", b.bytes_inter_host},
                                          {"tensor_parallel_bytes_per_step", b.tp_bytes},
                                          {"pipeline_bytes_per_step", b.pp_bytes},
                                          {"expert_parallel_bytes_per_step", b.ep_bytes}});
    }
    j["zero_stage"] = p.zero_stage;
    j["micro_batches"] = p.micro_batches;
    j["step_s"] = p.step_s;
    j["compute_s"] = p.compute_s;
    j["pipeline_s"] = p.pipeline_s;
    j["bubble"] = p.bubble;
    j["pp_transfer_s"] = p.pp_transfer_s;
    j["dp_comm_s"] = p.dp_comm_s;
    j["dp_exposed_s"] = p.dp_exposed_s;
    j["tp_comm_s"] = p.tp_comm_s;
    j["ep_comm_s"] = p.ep_comm_s;
    j["optimizer_s"] = p.optimizer_s;
    j["collectives_per_step"] = p.collectives_per_step;
    j["mfu"] = p.mfu;
    j["tokens_per_s"] = p.tokens_per_s;
    j["device_peak_bytes"] = p.device_peak_bytes;
    j["capacity_bytes"] = p.capacity_bytes;
    j["fits"] = p.fits;
    j["ranks"] = std::move(ranks);
    boost::json::array costs;
    for (const CollectiveCost& c : p.collectives) {
      costs.push_back(boost::json::object{{"group", c.group},
                                          {"collective", c.op},
                                          {"calls", c.calls},
                                          {"bytes_sent", c.bytes_sent},
                                          {"bytes_inter_host", c.bytes_inter_host},
                                          {"busiest_inter_host_bytes", c.busiest_inter_host_bytes},
                                          {"hosts", c.hosts},
                                          {"seconds", c.seconds}});
    }
    j["collectives"] = std::move(costs);
    layouts.push_back(std::move(j));
  }
  return {{"model", rep.model},
          {"ranks", o.ranks},
          {"ranks_per_host", o.ranks_per_host},
          {"network", {{"text", o.network.text}, {"bytes_per_s", o.network.bytes_per_s}, {"latency_s", o.network.latency_s}}},
          {"machine",
           {{"cores_per_host", o.machine.cores_per_host},
            {"threads_per_rank", o.machine.threads_per_rank},
            {"shm_bytes_per_s", o.machine.shm_bytes_per_s},
            {"shm_latency_s", o.machine.shm_latency_s},
            {"loaded_stretch", o.machine.loaded_stretch}}},
          {"link_costs", o.link_costs.empty() ? boost::json::value(nullptr)
                                              : boost::json::value(boost::json::object{
                                                    {"file", o.link_costs.source},
                                                    {"compute_stretch", o.link_costs.compute_stretch}})},
          {"oversubscription", rep.oversubscription},
          {"as_loaded", o.as_loaded},
          {"peak_flops_per_s", rep.peak_flops_per_s},
          {"oversubscription", rep.oversubscription},
          {"layouts", std::move(layouts)}};
}

}  // namespace zs::project
