// The estimator's human table and JSON (estimate/estimate.h; docs/memory.md lists the fields).
#include <boost/json/array.hpp>

#include <algorithm>

#include "estimate/detail/estimate_util.h"
#include "estimate/estimate.h"

namespace zs::engine {

using detail::group_digits;
using detail::kAlign;
using detail::state_bytes_per_element;

std::string format_bytes(uint64_t bytes) {
  const double v = static_cast<double>(bytes);
  if (bytes >= (uint64_t{1} << 40)) return fmt::format("{:.2f} TiB", v / static_cast<double>(uint64_t{1} << 40));
  if (bytes >= (uint64_t{1} << 30)) return fmt::format("{:.2f} GiB", v / static_cast<double>(uint64_t{1} << 30));
  if (bytes >= (uint64_t{1} << 20)) return fmt::format("{:.1f} MiB", v / static_cast<double>(uint64_t{1} << 20));
  if (bytes >= (uint64_t{1} << 10)) return fmt::format("{:.1f} KiB", v / 1024.0);
  return fmt::format("{} B", bytes);
}

std::string format_bytes_si(uint64_t bytes) {
  const double v = static_cast<double>(bytes);
  if (bytes >= 1'000'000'000'000) return fmt::format("{:.2f} TB", v / 1e12);
  if (bytes >= 1'000'000'000) return fmt::format("{:.2f} GB", v / 1e9);
  if (bytes >= 1'000'000) return fmt::format("{:.1f} MB", v / 1e6);
  if (bytes >= 1'000) return fmt::format("{:.1f} kB", v / 1e3);
  return fmt::format("{} B", bytes);
}

namespace {

// The table's rows: consecutive shard groups whose every figure is the same (stage 0 keeps whole
// replicas whatever S_r is) print as one row, their S_r as a range. The JSON keeps every group.
struct TableRow {
  const ShardGroup* group;  // the first group of the row: its figures are the row's
  int last_rank;
  uint64_t min_shard, max_shard;
};

bool same_figures(const ShardGroup& a, const ShardGroup& b) {
  const DevicePeak& p = a.device_peak;
  const DevicePeak& q = b.device_peak;
  return a.device == b.device && a.host == b.host && a.nvme == b.nvme &&
         a.offload_buffers.applies == b.offload_buffers.applies && a.offload_buffers.bytes == b.offload_buffers.bytes &&
         p.applies == q.applies && p.bytes == q.bytes && p.reserved_bytes == q.reserved_bytes &&
         p.by_category == q.by_category && p.transfers.host_to_device_bytes == q.transfers.host_to_device_bytes &&
         p.transfers.device_to_host_bytes == q.transfers.device_to_host_bytes;
}

std::vector<TableRow> table_rows(const StageEstimate& st) {
  std::vector<TableRow> rows;
  for (const ShardGroup& g : st.shards) {
    if (!rows.empty() && same_figures(*rows.back().group, g)) {
      TableRow& r = rows.back();
      r.last_rank = g.last_rank;
      r.min_shard = std::min(r.min_shard, g.shard_elements);
      r.max_shard = std::max(r.max_shard, g.shard_elements);
      continue;
    }
    rows.push_back({&g, g.last_rank, g.shard_elements, g.shard_elements});
  }
  return rows;
}

std::string rank_span(const TableRow& r) {
  return r.group->first_rank == r.last_rank ? std::to_string(r.last_rank) : fmt::format("{}-{}", r.group->first_rank, r.last_rank);
}

std::string shard_span(const TableRow& r) {
  return r.min_shard == r.max_shard ? group_digits(r.min_shard)
                                    : fmt::format("{}..{}", group_digits(r.min_shard), group_digits(r.max_shard));
}

// "optimizer nvme (stages 1-3), params nvme (stage 3)" or "none".
std::string offload_summary(const EstimateInput& in) {
  std::string s;
  if (in.offload_optimizer != OffloadDevice::kNone) {
    s = fmt::format("optimizer {} (stages 1-3)", offload_device_name(in.offload_optimizer));
  }
  if (in.offload_param != OffloadDevice::kNone) {
    s += fmt::format("{}params {} (stage 3)", s.empty() ? "" : ", ", offload_device_name(in.offload_param));
  }
  return s.empty() ? "none" : s;
}

// With the CPU device backend the arena is host RAM: the process holds the host tier (and, with NVMe
// parameters, up to the staging bound) plus the device peak.
uint64_t cpu_backend_host_bytes(const StageEstimate& st, const ShardGroup& g) {
  return g.host_total() + (st.nvme_param_staging.applies ? st.nvme_param_staging.bytes : 0) + g.device_peak.bytes;
}

std::string stage_offload_text(const EstimateInput& in, const StageEstimate& st) {
  if (!st.offload.any()) {
    return in.offload_optimizer == OffloadDevice::kNone && in.offload_param == OffloadDevice::kNone
               ? "none"
               : "none at this stage (optimizer offload needs stage 1-3, parameter offload stage 3)";
  }
  return fmt::format("optimizer {}, params {}", offload_device_name(st.offload.optimizer), offload_device_name(st.offload.param));
}

}  // namespace

std::string format_estimate(const MemoryEstimate& est) {
  const EstimateInput& in = est.input;
  std::string out;
  out += fmt::format("model: {}\n", in.model.description);
  out += fmt::format("flat elements Ψ = {} ({} layout, each parameter padded to {} elements); {} rank(s); {}; {}; offload {}\n\n",
                     group_digits(in.model.flat_elements), in.model.exact_layout ? "exact" : "estimated", kAlign, in.ranks,
                     precision_name(in.precision), in.optimizer, offload_summary(in));
  for (const ModelFacts::ExpertLayout& x : in.model.experts) {
    out += fmt::format("expert parameters: Ψ_E = {} flat elements of expert_parallel_size {} per rank, sharded over {} "
                       "rank(s) (the expert-data-parallel group); included in the model states below\n\n",
                       group_digits(x.flat_elements), x.expert_parallel_size,
                       x.expert_parallel_size > 0 ? in.ranks / x.expert_parallel_size : 0);
  }
  const bool tiered = std::any_of(est.stages.begin(), est.stages.end(), [](const StageEstimate& st) { return st.offload.any(); });
  // The last column repeats the total in decimal units (GB = 10^9 B), the unit papers and vendors use.
  const char* row = "{:<7} {:<11} {:>15} {:<7} {:>12} {:>12} {:>12} {:>12} {:>11}\n";
  const char* flat_row = "{:<7} {:<11} {:>15} {:>12} {:>12} {:>12} {:>12} {:>11}\n";
  if (!tiered) {
    out += "model states per rank (device arena):\n";
    out += fmt::format(fmt::runtime(flat_row), "stage", "ranks", "shard S_r", "params", "grads", "optimizer", "total", "total (SI)");
  } else {
    out += "model states per rank by tier (device arena; host memory and NVMe swap files count each buffer rounded up to "
           "4096 B):\n";
    out += fmt::format(fmt::runtime(row), "stage", "ranks", "shard S_r", "tier", "params", "grads", "optimizer", "total",
                       "total (SI)");
  }
  for (const StageEstimate& st : est.stages) {
    for (const TableRow& r : table_rows(st)) {
      const ShardGroup& g = *r.group;
      std::string stage = std::to_string(st.stage) + (st.stage == in.config_stage ? "*" : "");
      if (!tiered) {
        out += fmt::format(fmt::runtime(flat_row), stage, rank_span(r), shard_span(r), format_bytes(g.device.params),
                           format_bytes(g.device.grads), format_bytes(g.device.optimizer), format_bytes(g.total()),
                           format_bytes_si(g.total()));
        continue;
      }
      auto tier = [&](const std::string& s, const std::string& ranks, const std::string& shard, const char* name, const StateBytes& b) {
        out += fmt::format(fmt::runtime(row), s, ranks, shard, name, format_bytes(b.params), format_bytes(b.grads),
                           format_bytes(b.optimizer), format_bytes(b.total()), format_bytes_si(b.total()));
      };
      tier(stage, rank_span(r), shard_span(r), "device", g.device);
      const bool host = g.host.total() > 0 || st.offload.optimizer == OffloadDevice::kCpu || st.offload.param == OffloadDevice::kCpu;
      if (host) tier("", "", "", "host", g.host);
      if (st.offload.nvme()) tier("", "", "", "nvme", g.nvme);
      if (g.offload_buffers.applies) {
        out += fmt::format("{:<35} {:<7} {:>51}  (on the host: the NVMe step's buffers; host total {})\n", "", "buffers",
                           format_bytes(g.offload_buffers.bytes), format_bytes(g.host_total()));
      }
    }
  }
  for (const StageEstimate& st : est.stages) {
    if (st.stage == in.config_stage) out += fmt::format("(* the config's stage {})\n", in.config_stage);
  }
  if (tiered) {
    out += "\nNVMe offload host buffers per rank (exact: the step's pipelined swapper, allocated up front):\n";
    bool any = false;
    for (const StageEstimate& st : est.stages) {
      for (const TableRow& r : table_rows(st)) {
        const ShardGroup& g = *r.group;
        if (!g.offload_buffers.applies) continue;
        any = true;
        out += fmt::format("  stage {} ranks {:<7} {:>12}  = {}\n", st.stage, rank_span(r), format_bytes(g.offload_buffers.bytes),
                           g.offload_buffers.formula);
      }
    }
    if (!any) out += "  none (no state on NVMe)\n";
  }

  // Bounds that need the model's shapes are left out without one (one line says what gives them),
  // rather than printed as unknown.
  out += "\ntransient buffers per rank (upper bounds, beside the model states):\n";
  std::vector<std::string> unknown;
  for (const StageEstimate& st : est.stages) {
    auto line = [&](const char* name, const TransientBound& t) {
      if (t.applies) out += fmt::format("  stage {} {:<18} {:>12}  = {}\n", st.stage, name, format_bytes(t.bytes), t.formula);
      else if (!t.formula.empty() && std::find(unknown.begin(), unknown.end(), name) == unknown.end()) unknown.push_back(name);
    };
    line("gradient buckets", st.grad_buckets);
    line("gathered params", st.gathered_params);
    line("persistent params", st.persistent_params);
    line("NVMe param staging", st.nvme_param_staging);
  }
  for (const std::string& name : unknown) {
    out += fmt::format("  {}: needs the module shapes (give --config with a model section)\n", name);
  }
  const bool measured = std::any_of(est.stages.begin(), est.stages.end(), [](const StageEstimate& st) {
    return std::any_of(st.shards.begin(), st.shards.end(), [](const ShardGroup& g) { return g.device_peak.applies; });
  });
  if (!measured) {
    const std::string why = est.stages.empty() || est.stages.front().shards.empty()
                                ? std::string("needs the model")
                                : est.stages.front().shards.front().device_peak.formula;
    out += fmt::format("\ndevice peak per rank and activations: not estimated; {}\n", why);
  } else {
    out += "\ndevice peak per rank (measured: the engine's own code over a measuring backend; what the arena holds at its "
           "peak):\n";
  }
  for (const StageEstimate& st : est.stages) {
    if (!measured) break;
    for (const TableRow& r : table_rows(st)) {
      const ShardGroup& g = *r.group;
      const DevicePeak& p = g.device_peak;
      if (!p.applies) {
        out += fmt::format("  stage {} ranks {:<7} not measured: {}\n", st.stage, rank_span(r), p.formula);
        continue;
      }
      out += fmt::format("  stage {} ranks {:<7} {:>12}  = {} ({})\n", st.stage, rank_span(r), format_bytes(p.bytes), p.formula,
                         format_bytes_si(p.bytes));
      std::string parts;
      for (memory::Category c : memory::kAllCategories) {
        const uint64_t b = p.by_category[static_cast<size_t>(c)];
        if (b > 0) parts += fmt::format("{}{} {}", parts.empty() ? "" : " + ", memory::category_name(c), format_bytes(b));
      }
      out += fmt::format("  {:<21} {:>12}  = {}; reserved peak {} (fragmentation {:.3f}x){}\n", "", "", parts,
                         format_bytes(p.reserved_bytes),
                         p.bytes ? static_cast<double>(p.reserved_bytes) / static_cast<double>(p.bytes) : 1.0,
                         p.bytes > p.capacity ? fmt::format("; DOES NOT FIT device.memory_mb ({})", format_bytes(p.capacity))
                                              : fmt::format("; fits device.memory_mb ({})", format_bytes(p.capacity)));
      if (p.transfers.total() > 0) {
        out += fmt::format("  {:<21} {:>12}  host -> device {} and device -> host {} per step\n", "", "",
                           format_bytes(p.transfers.host_to_device_bytes), format_bytes(p.transfers.device_to_host_bytes));
      }
      const uint64_t host = cpu_backend_host_bytes(st, g) - p.bytes;
      out += fmt::format("  {:<21} {:>12}  = host tier {}{} + device peak {}: the process's memory with the CPU device "
                         "backend, whose arena is host RAM (code, libraries and heap not counted)\n",
                         "", format_bytes(host + p.bytes), format_bytes(g.host_total()),
                         st.nvme_param_staging.applies ? fmt::format(" + NVMe staging bound {}", format_bytes(st.nvme_param_staging.bytes)) : "",
                         format_bytes(p.bytes));
    }
  }
  if (!est.stages.empty() && est.stages.front().activations_peak.applies) {
    const StageEstimate& st = est.stages.front();
    out += fmt::format("  activations peak {} = {}\n", format_bytes(st.activations_peak.bytes), st.activations_peak.formula);
  }

  out += fmt::format("\nmultipliers (bytes per element; Ψ = {} flat elements, S_r = rank r's shard of Ψ over {} rank(s) in "
                     "multiples of {} elements):\n",
                     group_digits(in.model.flat_elements), in.ranks, kAlign);
  for (const StageEstimate& st : est.stages) {
    out += fmt::format("  stage {}: {} per rank (the ZeRO paper's form, up to the shard rounding)\n", st.stage,
                       st.paper_formula);
    out += fmt::format("    params    = {}\n    grads     = {}\n    optimizer = {}\n", st.params_formula, st.grads_formula,
                       st.optimizer_formula);
    if (tiered) {
      out += fmt::format("    offload   = {}\n", stage_offload_text(in, st));
      if (!st.offload_buffers_formula.empty()) out += fmt::format("    host buffers = {}\n", st.offload_buffers_formula);
    }
  }
  return out;
}

boost::json::object estimate_to_json(const MemoryEstimate& est) {
  const EstimateInput& in = est.input;
  namespace json = boost::json;
  auto bytes_obj = [](const StateBytes& s) {
    return json::object{{"params", s.params}, {"grads", s.grads}, {"optimizer", s.optimizer}, {"total", s.total()}};
  };
  auto bound = [](const TransientBound& t) -> json::value {
    if (!t.applies) return t.formula.empty() ? json::value(nullptr) : json::value(json::object{{"bytes", nullptr}, {"formula", t.formula}});
    return json::object{{"bytes", t.bytes}, {"formula", t.formula}};
  };
  auto device_peak = [](const DevicePeak& p) -> json::value {
    if (!p.applies) return json::object{{"bytes", nullptr}, {"formula", p.formula}};
    json::object parts;
    for (memory::Category c : memory::kAllCategories) parts[memory::category_name(c)] = p.by_category[static_cast<size_t>(c)];
    return json::object{{"bytes", p.bytes},
                        {"reserved_bytes", p.reserved_bytes},
                        {"by_category", std::move(parts)},
                        {"activations", p.activations},
                        {"activation_peak", p.activation_peak},
                        {"capacity_bytes", p.capacity},
                        {"fits", p.bytes <= p.capacity},
                        {"transfers_per_step", json::object{{"host_to_device", p.transfers.host_to_device_bytes},
                                                            {"device_to_host", p.transfers.device_to_host_bytes}}},
                        {"comm_bytes_sent_per_step", p.comm_bytes_sent},
                        {"formula", p.formula}};
  };
  json::object j;
  j["model"] = in.model.description;
  j["exact_layout"] = in.model.exact_layout;
  j["params_total"] = in.model.param_elements;
  j["flat_elements"] = in.model.flat_elements;
  json::array experts;
  for (const ModelFacts::ExpertLayout& x : in.model.experts) {
    experts.push_back(json::object{{"expert_parallel_size", x.expert_parallel_size}, {"flat_elements", x.flat_elements}});
  }
  j["expert_layouts"] = std::move(experts);
  j["align_elements"] = kAlign;
  j["ranks"] = in.ranks;
  if (in.pipeline.stages > 1) {  // absent without pipelines: their JSON stays as it was
    j["pipeline"] = json::object{{"stage", in.pipeline.stage},
                                 {"stages", in.pipeline.stages},
                                 {"schedule", in.pipeline.schedule},
                                 {"micro_batches", in.pipeline.micro_batches},
                                 {"chunks", in.pipeline.chunks},
                                 {"micro_batches_in_flight", in.pipeline.in_flight}};
  }
  j["precision"] = precision_name(in.precision);
  j["optimizer"] = in.optimizer;
  j["multipliers"] = json::object{{"bytes_per_element", est.bytes_per_element},
                                  {"master_bytes_per_element", est.master_bytes_per_element},
                                  {"optimizer_state_bytes_per_element", state_bytes_per_element(in)}};
  j["offload"] = json::object{{"optimizer", offload_device_name(in.offload_optimizer)},
                              {"param", offload_device_name(in.offload_param)}};
  if (in.config_stage >= 0) j["config_stage"] = in.config_stage;
  j["zero"] = json::object{{"reduce_bucket_size", in.zero.reduce_bucket_size},
                           {"allgather_bucket_size", in.zero.allgather_bucket_size},
                           {"stage3_prefetch_bucket_size", in.zero.stage3_prefetch_bucket_size},
                           {"stage3_param_persistence_threshold", in.zero.stage3_param_persistence_threshold},
                           {"stage3_max_live_parameters", in.zero.stage3_max_live_parameters},
                           {"sub_group_size", in.zero.sub_group_size},
                           {"offload_optimizer_buffer_count", in.zero.offload_optimizer_buffer_count},
                           {"offload_param_buffer_count", in.zero.offload_param_buffer_count},
                           {"offload_param_buffer_size", in.zero.offload_param_buffer_size},
                           {"offload_param_max_in_cpu", in.zero.offload_param_max_in_cpu}};
  json::array stages;
  for (const StageEstimate& st : est.stages) {
    json::array shards;
    for (const ShardGroup& g : st.shards) {
      shards.push_back(json::object{{"first_rank", g.first_rank},
                                    {"last_rank", g.last_rank},
                                    {"shard_elements", g.shard_elements},
                                    {"model_states_bytes", bytes_obj(g.device)},  // the device arena's
                                    {"by_tier", json::object{{"device", bytes_obj(g.device)},
                                                             {"host", bytes_obj(g.host)},
                                                             {"nvme", bytes_obj(g.nvme)}}},
                                    {"host_offload_buffers", bound(g.offload_buffers)},
                                    {"tiers", json::object{{"device", g.device.total()},
                                                           {"host", g.host_total()},
                                                           {"nvme", g.nvme.total()}}},
                                    {"total", g.total()},
                                    {"device_peak", device_peak(g.device_peak)},
                                    {"cpu_backend_host_bytes", g.device_peak.applies ? json::value(cpu_backend_host_bytes(st, g))
                                                                                     : json::value(nullptr)}});
    }
    stages.push_back(json::object{
        {"stage", st.stage},
        {"offload", json::object{{"optimizer", offload_device_name(st.offload.optimizer)},
                                 {"param", offload_device_name(st.offload.param)}}},
        {"master_bytes_per_element", st.master_bytes_per_element},
        {"per_shard_size", std::move(shards)},
        {"max_rank_model_states_bytes", st.max_model_state_bytes()},
        {"formulas", json::object{{"params", st.params_formula},
                                  {"grads", st.grads_formula},
                                  {"optimizer", st.optimizer_formula},
                                  {"paper", st.paper_formula},
                                  {"host_offload_buffers", st.offload_buffers_formula}}},
        {"transient", json::object{{"grad_buckets", bound(st.grad_buckets)},
                                   {"gathered_params", bound(st.gathered_params)},
                                   {"persistent_params", bound(st.persistent_params)},
                                   {"activations_peak", bound(st.activations_peak)},
                                   {"nvme_param_staging", bound(st.nvme_param_staging)}}}});
  }
  j["stages"] = std::move(stages);
  return j;
}

}  // namespace zs::engine
