#include "estimate/measure.h"

#include <algorithm>

#include "comm/group.h"
#include "core/errors.h"
#include "engine/flat_layout.h"
#include "memory/measuring_backend.h"
#include "memory/shard.h"
#include "nn/module.h"

namespace zs::engine {

// Note [measured estimate]
// One truth: the prediction is the engine's own placement and scheduling code, not a restatement of
// it. What differs from a real run, and why it does not change the device figures:
//   - no arithmetic (MeasuringBackend::runs_kernels false; nn's kernels check Context::computes):
//     memory does not depend on values, except through fp16 overflow skips, which free nothing;
//   - collectives complete only when waited for (comm::Group::simulated): the gradient reducer then
//     keeps kMaxInFlight launched buckets staged, the most a real run can hold (Open MPI progresses a
//     nonblocking collective only inside MPI calls, so a real run usually holds exactly that; a
//     reduction found finished earlier frees its bucket sooner, so a real peak is at most this);
//   - NVMe: no swap file is made; the stage-3 gatherer reads from an untouched stand-in instead of
//     the file (its device buffers and prefetch window are the same); the NVMe tier's figures come
//     from the placement rules (estimate/estimate.h), not from here;
//   - the device arena is not capped (a measured peak above device.memory_mb is reported as such).
// Two steps suffice for the elementwise optimizers, whose steps are all alike. The one-bit optimizers
// change phase later (0/1 Adam's compressed-gradient steps add a 4 bytes per element buffer): a
// measurement of the first steps does not see those phases.

namespace {

constexpr size_t kUncappedDevice = size_t{1} << 46;  // 64 TiB of address space, never committed

}  // namespace

int HostLayout::host(int tp_rank, int dp_rank, int pp_rank) const {
  return ranks_per_host > 0 ? (tp_rank + tp * (dp_rank + dp * pp_rank)) / ranks_per_host : 0;
}

namespace {
std::vector<int> one_host_is_none(std::vector<int> hosts) {
  if (std::all_of(hosts.begin(), hosts.end(), [&](int h) { return h == hosts.front(); })) hosts.clear();
  return hosts;
}

// What `g`'s collectives added since `before` (its op_stats: a simulated group's own runtime).
GroupStep step_of(const std::string& name, const comm::Group& g, const std::vector<comm::OpStats>& before) {
  return GroupStep{.group = name, .ops = comm::ops_since(g.op_stats(), before), .hosts = g.hosts()};
}
}  // namespace

std::vector<int> HostLayout::dp_hosts(int tp_rank, int pp_rank) const {
  std::vector<int> h;
  for (int d = 0; d < dp; ++d) h.push_back(host(tp_rank, d, pp_rank));
  return one_host_is_none(std::move(h));
}

std::vector<int> HostLayout::ep_hosts(int ep) const {
  std::vector<int> h;
  for (int d = 0; d < ep; ++d) h.push_back(host(0, d, 0));
  return one_host_is_none(std::move(h));
}

std::vector<int> HostLayout::pp_hosts(int tp_rank, int dp_rank) const {
  std::vector<int> h;
  for (int s = 0; s < pp; ++s) h.push_back(host(tp_rank, dp_rank, s));
  return one_host_is_none(std::move(h));
}

uint64_t GroupStep::bytes_sent() const {
  uint64_t n = 0;
  for (const comm::OpStats& o : ops) n += o.bytes_sent;
  return n;
}
uint64_t GroupStep::bytes_inter_host() const {
  uint64_t n = 0;
  for (const comm::OpStats& o : ops) n += o.bytes_inter_host;
  return n;
}
uint64_t GroupStep::count() const {
  uint64_t n = 0;
  for (const comm::OpStats& o : ops) n += o.count;
  return n;
}

const RankMeasurement& Measurement::of_rank(int rank) const {
  for (const auto& c : classes) {
    if (rank >= c.first_rank && rank <= c.last_rank) return c;
  }
  throw InternalError(fmt::format("no measurement covers rank {} of {}", rank, ranks));
}

Measurement estimate(nn::Model& model, const EngineConfig& config, int ranks, BatchSource& source, int steps,
                     const MeasureGroups& groups) {
  if (ranks < 1) throw ConfigError(fmt::format("estimate: ranks must be >= 1, got {}", ranks));
  ZS_ASSERT(steps >= 2, "estimate: at least 2 steps (got {})", steps);
  nn::assign_names(model);
  // Ranks whose shards of every layout (dense over the ranks, experts over ranks / E: Note [expert
  // parameters] in engine/engine.h) have the same sizes are measured once.
  std::vector<std::pair<size_t, int>> layouts;  // (flat elements, expert_parallel_size)
  for (const ParamGroup& g : group_by_expert_parallel_size(model.all_params())) {
    layouts.emplace_back(FlatLayout(g.params).total(), g.expert_parallel_size);
  }
  auto shards_of = [&](int rank) {
    std::vector<size_t> sizes;
    for (const auto& [total, e] : layouts) {
      const int group = ranks % e == 0 ? ranks / e : 1;  // the engine refuses the rest by name
      sizes.push_back(memory::shard_of(total, group, rank / e % group, FlatLayout::kAlignElements).size);
    }
    return sizes;
  };
  // A tensor-parallel model (Note [tensor-parallel parameters] in engine/engine.h) is measured as the
  // tp rank its slices are of, over a simulated tp group of their parts (one, without slices).
  nn::TensorSlice slice;
  for (const nn::Parameter* p : model.all_params()) {
    if (!p->tensor_slice().whole()) slice = p->tensor_slice();
  }
  const comm::Group own_tp = comm::Group::simulated(slice.index, slice.parts, "tp");
  const comm::Group& tp = groups.tp != nullptr ? *groups.tp : own_tp;
  Measurement out;
  out.ranks = ranks;
  out.steps = steps;
  for (int r = 0; r < ranks;) {
    const std::vector<size_t> shard = shards_of(r);
    int last = r;
    while (ranks > groups.every_rank_up_to && last + 1 < ranks && shards_of(last + 1) == shard) ++last;
    comm::Group group = comm::Group::simulated(r, ranks, "dp", groups.dp_hosts);
    Engine engine(model, config, group, tp, std::make_unique<memory::MeasuringBackend>(kUncappedDevice));
    RankMeasurement m{.first_rank = r, .last_rank = last};
    for (int s = 0; s < steps; ++s) {
      std::vector<std::pair<std::string, const comm::Group*>> tallied{{"dp", &group}};
      if (groups.tp != nullptr && tp.size() > 1) tallied.emplace_back("tp", groups.tp);
      if (groups.pp != nullptr && groups.pp->size() > 1) tallied.emplace_back("pp", groups.pp);
      // The program's step boundary runs over dp, tp and pp (zeroshard train's), the groups above.
      const size_t boundary_groups = tallied.size();
      if (groups.ep != nullptr && groups.ep->size() > 1) tallied.emplace_back("ep", groups.ep);
      for (const comm::Group* e : engine.expert_data_parallel()) {
        if (e->size() > 1) tallied.emplace_back("edp", e);
      }
      if (const comm::Group* h = engine.zeropp_host()) tallied.emplace_back("hpz", h);
      if (const comm::Group* a = engine.zeropp_across()) tallied.emplace_back("hpz_across", a);
      std::vector<std::vector<comm::OpStats>> before;
      for (const auto& t : tallied) before.push_back(t.second->op_stats());
      const StepReport& report = engine.train_batch(source);
      if (groups.step_boundary) {
        std::vector<const comm::Group*> at_boundary;
        for (size_t i = 0; i < boundary_groups; ++i) at_boundary.push_back(tallied[i].second);
        groups.step_boundary(at_boundary);
      }
      m.groups.clear();
      for (size_t i = 0; i < tallied.size(); ++i) m.groups.push_back(step_of(tallied[i].first, *tallied[i].second, before[i]));
      m.transfers = report.transfers;
      m.comm_bytes_sent = report.comm_bytes_sent;
      m.max_in_flight = report.pipeline.max_in_flight;
      m.param_gathers = report.param_gathers;
      m.backward_param_gathers = report.backward_param_gathers;
    }
    m.memory = engine.memory_report();
    m.memory.device_capacity_bytes = static_cast<size_t>(config.device.memory_mb) << 20;
    out.classes.push_back(m);
    model.clear_saved();
    r = last + 1;
  }
  return out;
}

}  // namespace zs::engine
