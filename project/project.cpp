#include "project/project.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/errors.h"
#include "core/log.h"
#include "estimate/estimate.h"
#include "estimate/measure.h"
#include "memory/dtype.h"
#include "nn/flops.h"
#include "pp/schedule.h"
#include "project/detail/project_detail.h"

namespace zs::project {

// Note [projection model]
// A layout's step on one rank of pipeline stage s, with m micro-batches per step and L_s layers:
//   passes     F_s = L_s f + [last stage] f_rest, B_s likewise (measured at 2 layers with the layout's
//              tensor-parallel slices, micro-batch and sequence, split by FLOPs; detail::measure_compute), times
//              the oversubscription max(1, ranks per host / cores) when ranks share cores (--as-loaded:
//              times the collective probe's measured stretch of the compute at the present load,
//              Note [collective probe]).
//   tp         the tensor-parallel group's collectives (Megatron's all-reduces, or sequence
//              parallelism's gathers and reduce-scatters) are on the critical path: their time is
//              spread over the stage's passes.
//   ep         an MoE model's expert-parallel all-to-alls (each MoE layer's tokens to their experts and
//              back, in both passes) likewise: on the critical path. The passes' compute is measured with
//              the experts on one rank (detail::ComputeCost: under a balanced load a rank's experts process
//              as many rows at every ep); the expert-data-parallel groups' collectives are ZeRO's, as dp.
//   pp         a point-to-point send is a delay between the producing pass and the next stage's
//              consuming one, the sender not held (send_async; Note [transfer delay] in pp/schedule.h):
//              pp::timeline's transfer time, one send's cost; the pp group's other calls are spread
//              over the passes. Across hosts each send goes through its stage's link in the
//              timeline (Note [a pipeline's sends through the link]): queued behind the sends before it,
//              at once as far as a shaper's bucket reaches and the rest at the rate (the probe's
//              in-step cost, --link-costs, where there is no bucket); the link's sustained rate bounds
//              the sends' sum, the pipeline's makespan.
//   pipeline   the schedule run on pp::timeline with those pass times: its makespan holds the bubble.
//              pp 1: m (F + B) + tp.
//   dp         the data-parallel group's collectives: gradient reductions (reduce-scatter, allreduce)
//              overlap the last backward pass (the engine launches each bucket as it fills on the comm
//              worker; exposed: what exceeds one B_s, less across hosts the part of B_s whose own calls
//              hold the link: Note [reductions behind the backward's calls]); stage-3 parameter gathers run on the calling
//              thread, prefetches included (Note [synchronous gathers] in engine/detail/param_gatherer.h:
//              the CPU device has no copy engine), so all of them are exposed, and so are ZeRO++'s
//              quantised gradient all-to-alls (qgZ, on the calling thread); stage 1-2 parameter
//              all-gathers follow the optimizer (exposed); other collectives (the loss and norm's small
//              all-reduces) are exposed. Across hosts these phases go through the link's bucket in the
//              step's order, each at least its bytes beyond the bucket's tokens at the rate (Note [the
//              link's bucket] in project_compute.cpp).
//   optimizer  the measured per-layer seconds over the rank's stepped share (1/dp at stages 1-3).
//   step       pipeline + dp exposed + optimizer, of the slowest stage.
// Every collective's time is detail::group_seconds: a cost per collective (inside a host the collective
// probe's measured wait, Note [collective probe]; across hosts also the network's latency times its ring
// hops, the latency given: the validation measures OpenMPI's TCP path) plus bytes over bandwidth, the bytes being the
// measurement's: the engine's own code run as one rank of each shard class of each stage over simulated
// groups that know their hosts, so they are the counters a real run reports (exact; tested).
// With --link-costs (Note [in-step link costs] in project_compute.cpp) a collective whose group spans the
// probe's hosts is charged the probe's measured in-step cost instead, and the compute its measured stretch.
// Not modelled: compute slowed by the communication threads' own CPU time, MPI's spinning on shared
// cores, network congestion beyond the host's link, stragglers.

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i) {
    if (n % i == 0) d.push_back(i);
  }
  return d;
}

struct StageTime {
  double forward = 0, backward = 0, tp_comm = 0, ep_comm = 0, pp_comm = 0, pp_transfer = 0, pp_link = 0, dp_grad = 0,
         dp_gather = 0, dp_other = 0;
  double dp_grad_sync = 0;  // of dp_grad, the reductions on the calling thread (ZeRO++'s qgZ all-to-alls)
  // A pipeline send across hosts through a shaper's bucket (Note [a pipeline's sends through the link]):
  // its bytes on the host's link (its R ranks' at once; 0: none crosses), its cost where the bucket holds
  // them, and the least it costs (the probe's in-step cost of the send, else the network's latency).
  double pp_send_bytes = 0, pp_send_base = 0, pp_send_floor = 0;
  // Of one micro-batch's backward pass, the time its own calls across hosts hold the link (an MoE model's
  // all-to-alls, stage 3's backward gathers) where the gradients' reductions cross too: the reductions
  // cannot hide under that part (Note [reductions behind the backward's calls]).
  double backward_link = 0;
  double optimizer = 0, flops = 0;
  uint64_t collectives = 0;
  // The data-parallel groups' and the expert-parallel group's busiest member's bytes across hosts and
  // calls, by phase (Note [the link's bucket]).
  detail::LinkPhase grad_link, gather_link, ep_link;
  std::vector<CollectiveCost> costs;  // each group's collectives as charged
};

// The groups whose collectives are ZeRO's (the data-parallel group, an MoE model's expert-data-parallel
// groups, ZeRO++'s host groups), timed by the same rules.
bool zero_group(const std::string& name) {
  return name == "dp" || name == "edp" || name == "hpz" || name == "hpz_across";
}

void add_calls(detail::LinkPhase& phase, const comm::OpStats& op) {
  phase.busiest_bytes += static_cast<double>(op.busiest_inter_host_bytes);
  phase.calls += op.count;
}

// Note [reductions behind the backward's calls]
// The gradients' reductions run on the comm worker beside the backward pass, which hides them under its
// compute (Note [projection model]). Across hosts that holds only while the backward itself leaves the
// link alone. Where its own calls cross hosts on the critical path (an MoE model's all-to-alls, stage
// 3's backward gathers without hpZ), a reduction in flight holds the link, and the backward's next call
// waits behind its bytes: the reductions hide only under the part of the backward pass whose calls do not
// hold the link (StageTime::backward_link: half of the all-to-alls' time and the backward's gathers', per
// micro-batch; the backward gathers nothing the forward kept, Note [reuse distance] in
// engine/detail/param_gatherer.h).
// Measured (comms logger, 20 steps, 2026-11-30 12:47 UTC): the GPT-MoE at ep 2 over two hosts of one
// rank at 100 Mbit/s, the step 306 ms. Its 16 all-to-alls took 111 ms a step (the projection's 113), its
// 2 gradient reduce-scatters 74 ms (at the link's rate), its parameter all-gather 49 ms (48), and its
// compute 57 ms: the sum, 292 ms, where hiding the reductions under one backward pass projected 253 ms
// (0.85). Its backward's all-to-alls hold the link longer than the pass computes, so nothing is hidden.
// At 1 Gbit/s stage 3's gathers hold it for about a millisecond of a 15-ms pass, which still hides them.

// Note [a pipeline's sends through the link]
// A pipeline stage's sends across hosts leave through its host's link one after another. Through a
// shaper's bucket (Network::burst_bytes) a send goes at once as far as the bucket's tokens reach and the
// rest at the rate, and the pauses between the stage's sends refill the bucket: so each send's arrival
// depends on when the ones before it left, which one transfer time per send cannot say. pp::timeline asks
// this for each transfer as its pass ends (each stage's in order; PipelineLinks): the stage's link keeps
// its tokens and when it is free; a send queues behind the one still going at the rate, and costs at
// least the probe's in-step cost of a send of its bytes (--link-costs; without it the latency). Without a
// bucket (a NIC at its line rate) a send arrives after the one transfer time (the probe's in-step cost,
// or latency and bytes over bandwidth) and not before the link has sent it behind the sends queued before
// it. Measured (docs/scaling.md, "Validation"): pp 2 over two hosts of one rank at 100 Mbit/s, 131 KB per
// send against tbf's 125 KB bucket, 3.7 ms forward and 7.4 ms backward passes. The step took 74.8 ms;
// one transfer time per send (6.9 ms: the bytes beyond one forward pass's refill at the rate) projected
// 89.1 ms (1.19x), where the backward passes refill most of the bucket between sends. The bucket alone
// (a send held whole costing the probe's 0.45 ms of its small sizes) projected 65.0 ms (0.87x): the step's
// sends were slower than the bucket lets them be (each receive waited 2.6 ms longer than at 10 Gbit/s, the
// comms logger over 40 steps), for a cause not found. With the probe's cost as each send's least (5.1 ms at
// 131 KB, the probe's calls finding the bucket as its own rhythm leaves it) it projected 81.5 ms (1.09x).
class PipelineLinks {
 public:
  PipelineLinks(const std::vector<StageTime>& stages, const Network& net, double transfer)
      : stages_(stages), net_(net), transfer_(transfer), links_(stages.size(), Link{.tokens = net.burst_bytes}) {}

  // When stage `src`'s send, its pass having ended at `ready`, reaches the next stage.
  double arrive(int src, double ready) {
    const double at = arrival(src, ready);
    delay_ += at - ready;
    ++sends_;
    return at;
  }
  // The mean time from a pass's end to its send's arrival.
  double mean_transfer() const { return sends_ > 0 ? delay_ / static_cast<double>(sends_) : transfer_; }

 private:
  struct Link {
    double tokens = 0, last = 0, free_at = 0;
  };
  double arrival(int src, double ready) {
    const StageTime& st = stages_[static_cast<size_t>(src)];
    if (!(st.pp_send_bytes > 0) || !(net_.bytes_per_s > 0)) return ready + transfer_;
    Link& k = links_[static_cast<size_t>(src)];
    const double rate = net_.bytes_per_s, t0 = std::max(ready, k.free_at);
    if (net_.burst_bytes > 0) {
      k.tokens = std::min(net_.burst_bytes, k.tokens + rate * (t0 - k.last));
      const double done = t0 + std::max(0.0, st.pp_send_bytes - k.tokens) / rate;
      k.tokens = std::max(0.0, k.tokens - st.pp_send_bytes);
      k.last = k.free_at = done;
      return std::max(ready + st.pp_send_floor, done + st.pp_send_base);
    }
    k.free_at = t0 + st.pp_send_bytes / rate;
    return std::max(k.free_at, ready + transfer_);
  }

  const std::vector<StageTime>& stages_;
  Network net_;
  double transfer_;
  std::vector<Link> links_;
  double delay_ = 0;
  int64_t sends_ = 0;
};

Projection project_layout(const boost::json::value& config, const Options& opt, const Layout& l,
                          std::map<int, detail::ComputeCost>& costs, double oversub) {
  Projection p;
  p.layout = l;
  const int R = opt.ranks_per_host;
  const int hosts = opt.ranks / R;
  if (hosts > 1 && R % l.tp != 0) {
    p.why_not = fmt::format("tp {} does not divide the {} ranks of a host (tensor-parallel groups stay inside a host)", l.tp, R);
    return p;
  }
  if (hosts > 1 && l.pp > 1 && (l.tp * l.dp) % R != 0 && R % (l.tp * l.dp) != 0) {
    p.why_not = fmt::format("a pipeline stage's {} ranks and the host's {} do not divide one another", l.tp * l.dp, R);
    return p;
  }
  // Note [expert-parallel layouts]: an expert-parallel group is ep consecutive data-parallel ranks, tp
  // world ranks apart, so it spans tp x ep consecutive world ranks; where that span and the host's ranks
  // divide one another every such group lies on its hosts alike (inside one, or spread evenly over
  // several) and the measurement's first group stands for all of them.
  if (hosts > 1 && l.ep > 1 && (l.tp * l.ep) % R != 0 && R % (l.tp * l.ep) != 0) {
    p.why_not = fmt::format("an expert-parallel group's {} ranks (ep {} x tp {}) and the host's {} do not divide one another",
                            l.tp * l.ep, l.ep, l.tp, R);
    return p;
  }
  run::RunConfig cfg;
  try {
    cfg = detail::layout_config(config, l, opt.ranks);
  } catch (const ConfigError& e) {
    p.why_not = e.what();
    return p;
  }
  p.zero_stage = cfg.zero.stage;
  p.micro_batches = cfg.batch.gradient_accumulation_steps;
  const int64_t m = p.micro_batches;
  const int n_layer = cfg.model_llama ? cfg.model_llama->n_layer : cfg.model->n_layer;
  // An MoE model's compute is measured per every_n_layers blocks (detail::ComputeCost).
  const int period = cfg.model_moe ? cfg.model_moe->every_n_layers : 1;
  auto cost_it = costs.find(l.tp);
  if (cost_it == costs.end()) {
    cost_it = costs.emplace(l.tp, detail::measure_compute(config, l.tp, cfg.batch.micro_batch_per_rank, period)).first;
  }
  const detail::ComputeCost& c = cost_it->second;
  p.capacity_bytes = static_cast<uint64_t>(cfg.device.memory_mb) << 20;
  std::vector<StageTime> stages(static_cast<size_t>(l.pp));
  for (int s = 0; s < l.pp; ++s) {
    const engine::EstimateInput in = engine::estimate_input_for_config(cfg, opt.ranks, std::nullopt, s, hosts > 1 ? R : 0);
    engine::MeasureGroups groups = in.measure->groups;
    groups.step_boundary = opt.step_boundary;
    groups.every_rank_up_to = opt.exact_ranks;
    engine::Measurement meas;
    try {
      meas = engine::estimate(*in.measure->model, in.measure->config, in.ranks, *in.measure->source, 2, groups);
    } catch (const ConfigError& e) {  // what the engine refuses for this layout (ZeRO++ with experts, say)
      p.why_not = e.what();
      return p;
    }
    StageTime& st = stages[static_cast<size_t>(s)];
    // Layers of this stage (in ComputeCost's layers of `period` blocks): an even split, the remainder on
    // the first stages; the rest on the last.
    const double layers = static_cast<double>(n_layer / l.pp + (s < n_layer % l.pp ? 1 : 0)) / period;
    const bool last = s == l.pp - 1;
    st.forward = (layers * c.forward_layer + (last ? c.forward_rest : 0.0)) * oversub;
    st.backward = (layers * c.backward_layer + (last ? c.backward_rest : 0.0)) * oversub;
    st.flops = static_cast<double>(m) * (layers * c.flops_layer + (last ? c.flops_rest : 0.0));
    // At stage 0 a rank steps its own E / ep experts whole; at stages 1-3 its shard of them over the dp / ep
    // ranks of its expert-data-parallel group: 1 / dp of all, as the dense parameters.
    const double layer_stepped = p.zero_stage == 0 ? 1.0 - c.expert_share_layer + c.expert_share_layer / l.ep : 1.0;
    const double stepped = (layers * c.optimizer_layer * layer_stepped + (last ? c.optimizer_rest : 0.0)) * oversub;
    for (const engine::RankMeasurement& rm : meas.classes) {
      p.device_peak_bytes = std::max<uint64_t>(p.device_peak_bytes, rm.memory.device_peak_bytes);
      for (int d = rm.first_rank; d <= rm.last_rank; ++d) {
        for (int t = 0; t < l.tp; ++t) {
          RankBytes b{.rank = t + l.tp * (d + l.dp * s), .measured_as = rm.first_rank * l.tp + t + l.tp * l.dp * s};
          for (const engine::GroupStep& g : rm.groups) {
            b.bytes_sent += g.bytes_sent();
            b.bytes_inter_host += g.bytes_inter_host();
            if (g.group == "tp") b.tp_bytes += g.bytes_sent();
            if (g.group == "pp") b.pp_bytes += g.bytes_sent();
            if (g.group == "ep") b.ep_bytes += g.bytes_sent();
          }
          p.ranks.push_back(b);
        }
      }
    }
    // Times from rank class 0 of the stage (the largest shard: memory::shard_of gives the first ranks the most).
    const engine::RankMeasurement& rm = meas.classes.front();
    bool crosses = false;  // a data- or expert-parallel group spans hosts
    for (const engine::GroupStep& g : rm.groups) {
      st.collectives += g.count();
      // Each collective's seconds, charged once (detail::group_seconds): tensor-parallel groups stay inside
      // a host, a pipeline send crosses once.
      const int spans = g.group == "tp" ? 1 : g.group == "pp" ? std::min(2, g.hosts) : g.hosts;
      std::vector<double> secs_of;
      for (const comm::OpStats& op : g.ops) {
        secs_of.push_back(detail::group_seconds(engine::GroupStep{.group = g.group, .ops = {op}, .hosts = g.hosts}, opt, spans, R));
        st.costs.push_back({.group = g.group, .op = op.name, .calls = op.count, .bytes_sent = op.bytes_sent,
                            .bytes_inter_host = op.bytes_inter_host, .busiest_inter_host_bytes = op.busiest_inter_host_bytes,
                            .hosts = g.hosts, .seconds = secs_of.back()});
      }
      const double group_secs = std::accumulate(secs_of.begin(), secs_of.end(), 0.0);
      if (g.group == "tp") st.tp_comm = group_secs;
      if (g.group == "ep") {
        // The MoE layers' all-to-alls (tokens to their experts and back, in both passes) hold up the
        // layer that waits for them: on the critical path, as tp's collectives.
        st.ep_comm = group_secs;
        for (const comm::OpStats& op : g.ops) add_calls(st.ep_link, op);
        crosses = crosses || g.hosts > 1;
      }
      if (g.group == "pp") {
        // A send is a delay before the next stage's pass, not time on this one's (Note [transfer delay]
        // in pp/schedule.h): per send, its cost; the group's other calls (receives' posting, the loss's
        // broadcast) stay on the passes.
        for (size_t i = 0; i < g.ops.size(); ++i) {
          const comm::OpStats& op = g.ops[i];
          const double secs = secs_of[i];
          if (op.name == "send" && op.count > 0) {
            st.pp_transfer = std::max(st.pp_transfer, secs / static_cast<double>(op.count));
            // The sends' bytes across hosts at the link's sustained rate (its R ranks sharing it): a
            // bound on the step, where each transfer alone may ride a shaper's burst.
            if (op.bytes_inter_host > 0) {
              const double rate = opt.network.bytes_per_s;
              st.pp_link = static_cast<double>(op.bytes_inter_host) * R / rate;
              // The pipeline's timeline runs the stage's link per send (PipelineLinks): a send queues
              // behind the one before it, and through a shaper's bucket goes at once as far as the
              // bucket's tokens reach, the rest at the rate. There it costs at least the probe's in-step
              // cost of the send (measured with the bucket as the probe's rhythm left it), and where the
              // bucket holds it whole what the probe's calls that the bucket held cost (its sizes of at
              // most the bucket's bytes; the larger ones paid the rate); without a probe, the latency.
              st.pp_send_bytes = static_cast<double>(op.bytes_inter_host) * R / static_cast<double>(op.count);
              const double burst = opt.network.burst_bytes;
              st.pp_send_base = st.pp_send_floor = opt.network.latency_s;
              if (burst > 0 && !opt.link_costs.empty() && spans == opt.link_costs.hosts) {
                st.pp_send_floor = secs / static_cast<double>(op.count);
                st.pp_send_base = opt.link_costs.seconds_within("send", std::min(st.pp_send_bytes, burst) / R, burst / R,
                                                                R > opt.machine.cores_per_host)
                                      .value_or(opt.network.latency_s);
              }
            }
          } else {
            st.pp_comm += secs;
          }
        }
      }
      if (!zero_group(g.group)) continue;
      crosses = crosses || g.hosts > 1;
      for (size_t i = 0; i < g.ops.size(); ++i) {
        const comm::OpStats& op = g.ops[i];
        const double secs = secs_of[i];
        if (op.name == "alltoall" || op.name == "alltoallv") {
          // ZeRO++'s quantised gradient reduction (qgZ: int8 blocks inside the host, then across hosts)
          // runs on the calling thread, not on the comm worker (engine/grad_reducer.cpp): not overlapped.
          st.dp_grad += secs;
          st.dp_grad_sync += secs;
          add_calls(st.grad_link, op);
        } else if (op.name == "reduce_scatter" || (op.name == "allreduce" && op.bytes_sent >= 1024)) {
          st.dp_grad += secs;
          add_calls(st.grad_link, op);
        } else if (op.name == "allgather" || op.name == "allgatherv") {
          st.dp_gather += secs;
          add_calls(st.gather_link, op);
        } else {
          st.dp_other += secs;
        }
      }
    }
    st.optimizer = p.zero_stage >= 1 ? stepped / l.dp : stepped;
    if (crosses) {
      // Through the link's bucket in the step's order (Note [the link's bucket] in project_compute.cpp):
      // stage 3's gathers and reductions micro-batch by micro-batch; stages 1-2's reductions at the
      // accumulation boundary, then the parameter all-gather after the optimizer.
      // An MoE model's all-to-alls come first, between its layers' compute in the passes.
      detail::LinkPhase& gathers = st.gather_link;
      detail::LinkPhase& grads = st.grad_link;
      detail::LinkPhase& ep = st.ep_link;
      gathers.seconds = st.dp_gather;
      grads.seconds = st.dp_grad;
      ep.seconds = st.ep_comm;
      const double passes = static_cast<double>(m) * (st.forward + st.backward);
      ep.compute_s = passes;
      ep.interleaved = true;
      std::vector<detail::LinkPhase> phases;
      // Stage 3: the share of the gathers that the backward passes make (the measured step's: none where
      // the forward kept every module for its backward, Note [reuse distance] in
      // engine/detail/param_gatherer.h; hpZ's from its secondary copies do not cross).
      const double backward_share = rm.param_gathers > 0 ? static_cast<double>(rm.backward_param_gathers) / static_cast<double>(rm.param_gathers) : 0.0;
      const bool zero3 = p.zero_stage == 3;
      if (zero3) {
        // Per micro-batch, in its order (Note [the link's bucket]): its forward's gathers, in the prefetch's
        // bursts back to back on the calling thread before the compute they serve (per pass, the stage's
        // parameters over the prefetch bucket; 0: no prefetch, a pause before each gather); its backward's,
        // where the forward did not keep the modules; then its reductions, beside its backward. The first
        // forward's first burst finds the bucket as the step's end left it (the last reductions, then the
        // optimizer and the step's small calls); the reductions find it refilled by the compute since the
        // link's last burst.
        const double prefetch = static_cast<double>(cfg.zero.stage3_prefetch_bucket_size);
        const double mb = static_cast<double>(m);
        const double per_pass = static_cast<double>(gathers.calls) / mb / (1.0 + backward_share);
        const double bursts = std::max(1.0, prefetch > 0 ? std::min(per_pass, std::ceil(static_cast<double>(in.model.param_elements) / prefetch)) : per_pass);
        const double between_bursts = (bursts - 1) / bursts;  // of a pass's compute
        auto share = [m](const detail::LinkPhase& all, double part) {
          detail::LinkPhase one = all;
          one.busiest_bytes *= part / static_cast<double>(m);
          one.seconds *= part / static_cast<double>(m);
          one.calls = static_cast<uint64_t>(std::llround(static_cast<double>(all.calls) * part / static_cast<double>(m)));
          one.interleaved = true;
          return one;
        };
        detail::LinkPhase forward = share(gathers, 1.0 - backward_share), backward = share(gathers, backward_share),
                          reductions = share(grads, 1.0);
        forward.pauses = backward.pauses = bursts;
        backward.compute_s = st.forward / bursts + st.backward * between_bursts;
        reductions.compute_s = st.backward + (backward.calls > 0 ? 0.0 : st.forward / bursts);
        phases = {ep};
        for (int64_t i = 0; i < m; ++i) {
          forward.compute_s = (i == 0 ? st.optimizer + st.dp_other : 0.0) + st.forward * between_bursts;
          phases.insert(phases.end(), {forward, backward, reductions});
        }
      } else {
        // The reductions at the accumulation boundary after the passes, then the optimizer and the gather.
        grads.compute_s = passes;
        gathers.compute_s = st.optimizer;
        phases = {ep, grads, gathers};
      }
      detail::bound_by_link(phases, opt.network, R);
      st.ep_comm = phases[0].seconds;
      double gather_seconds = 0, backward_gather_seconds = 0, grad_seconds = 0;
      if (zero3) {
        for (size_t i = 1; i + 2 < phases.size(); i += 3) {
          gather_seconds += phases[i].seconds + phases[i + 1].seconds;
          backward_gather_seconds += phases[i + 1].seconds;
          grad_seconds += phases[i + 2].seconds;
        }
      } else {
        grad_seconds = phases[1].seconds;
        gather_seconds = phases[2].seconds;
      }
      st.dp_gather = gather_seconds;
      // The backward makes half of the all-to-alls and its share of stage 3's gathers: their phases'
      // time, per micro-batch.
      if (grads.busiest_bytes > 0) st.backward_link = (0.5 * st.ep_comm + backward_gather_seconds) / static_cast<double>(m);
      // The link's bound stretches the calling thread's reductions with the rest.
      if (st.dp_grad > 0) st.dp_grad_sync *= grad_seconds / st.dp_grad;
      st.dp_grad = grad_seconds;
    }
  }
  std::sort(p.ranks.begin(), p.ranks.end(), [](const RankBytes& a, const RankBytes& b) { return a.rank < b.rank; });
  // The pipeline: pass times with their share of the tp and pp communication, through the schedule.
  const double passes = 2.0 * static_cast<double>(m);
  if (l.pp == 1) {
    const StageTime& st = stages.front();
    p.pipeline_s = static_cast<double>(m) * (st.forward + st.backward) + st.tp_comm + st.ep_comm;
    p.compute_s = static_cast<double>(m) * (st.forward + st.backward) + st.optimizer;
  } else {
    const pp::PipelineShape shape{.stages = l.pp, .chunks = cfg.pipeline.virtual_pipeline_size, .micro_batches = m};
    const pp::Schedule sched = cfg.pipeline.schedule;
    std::vector<std::vector<double>> secs(static_cast<size_t>(l.pp));
    double transfer = 0.0;  // one send's time (activations and their gradients have one size)
    for (int s = 0; s < l.pp; ++s) {
      transfer = std::max(transfer, stages[static_cast<size_t>(s)].pp_transfer);
      const StageTime& st = stages[static_cast<size_t>(s)];
      const double extra = (st.tp_comm + st.ep_comm + st.pp_comm) / passes;
      const double chunks = static_cast<double>(shape.chunks);
      for (const pp::Op& op : pp::schedule_ops(sched, shape, s)) {
        double t = op.kind == pp::Op::kForward ? st.forward : st.backward;
        if (sched == pp::Schedule::kZeroBubbleH1 && op.kind != pp::Op::kForward) t *= 0.5;  // B and W
        secs[static_cast<size_t>(s)].push_back(t / chunks + extra / chunks);
      }
      p.compute_s = std::max(p.compute_s, static_cast<double>(m) * (st.forward + st.backward) + st.optimizer);
    }
    PipelineLinks links(stages, opt.network, transfer);
    const pp::Timeline tl = pp::timeline(sched, shape, secs, [&links](int src, int, double ready) { return links.arrive(src, ready); });
    p.pipeline_s = tl.makespan;
    for (const StageTime& st : stages) p.pipeline_s = std::max(p.pipeline_s, st.pp_link);
    p.pp_transfer_s = links.mean_transfer();
    p.bubble = *std::max_element(tl.bubble.begin(), tl.bubble.end());
  }
  double flops = 0;
  for (const StageTime& st : stages) {
    const double window = static_cast<double>(m) * st.backward;  // the gradients' buckets overlap backward
    const double gathers = st.dp_gather;  // synchronous at every stage (Note [projection model])
    // The comm worker's reductions overlap one backward pass; the calling thread's (qgZ) do not, and
    // neither do reductions across hosts where the backward's own calls cross the same link (Note
    // [reductions behind the backward's calls]).
    const double hidden = std::max(0.0, std::min(window, st.backward) - st.backward_link);
    const double grads = st.dp_grad_sync + std::max(0.0, st.dp_grad - st.dp_grad_sync - hidden);
    const double exposed = grads + gathers + st.dp_other;
    const double step = p.pipeline_s + exposed + st.optimizer;
    if (step > p.step_s) {
      p.step_s = step;
      p.dp_comm_s = st.dp_grad + st.dp_gather + st.dp_other;
      p.dp_exposed_s = exposed;
      p.optimizer_s = st.optimizer;
      p.tp_comm_s = st.tp_comm;
      p.ep_comm_s = st.ep_comm;
      p.collectives_per_step = st.collectives;
      p.collectives = st.costs;
    }
    flops += st.flops;
  }
  const double peak = nn::product_peak(cfg.compute_dtype()).flops_per_s;
  p.mfu = p.step_s > 0 && peak > 0 ? flops / static_cast<double>(l.pp) / (p.step_s * peak) : 0.0;
  const int64_t seq = cfg.model_llama ? cfg.model_llama->max_seq_len : cfg.model->seq_len;
  p.tokens_per_s = p.step_s > 0 ? static_cast<double>(cfg.batch.micro_batch_per_rank * m * l.dp * seq) / p.step_s : 0.0;
  p.fits = p.capacity_bytes == 0 || p.device_peak_bytes <= p.capacity_bytes;
  p.valid = true;
  return p;
}

}  // namespace

void validate(const Options& options) {
  Options opt = options;
  if (opt.ranks_per_host == 0) opt.ranks_per_host = opt.ranks;  // one host
  if (opt.ranks < 1) throw ConfigError(fmt::format("--ranks: must be at least 1, got {}", opt.ranks));
  if (opt.ranks_per_host < 1 || opt.ranks % opt.ranks_per_host != 0) {
    throw ConfigError(fmt::format("--ranks-per-host: {} does not divide --ranks {}; give a divisor of {} (ranks on each host)",
                                  opt.ranks_per_host, opt.ranks, opt.ranks));
  }
  if (opt.ranks > opt.ranks_per_host && !(opt.network.bytes_per_s > 0)) {
    throw ConfigError(fmt::format("--network: {} ranks on hosts of {} need the link between hosts; give --network "
                                  "BANDWIDTH,LATENCY such as 10gbit,20us",
                                  opt.ranks, opt.ranks_per_host));
  }
  if (!opt.link_costs.empty() && opt.link_costs.ranks_per_host != opt.ranks_per_host) {
    throw ConfigError(fmt::format("--link-costs: '{}' was measured with {} ranks per host, the projection has {}; run "
                                  "step_comm_probe with the projection's host layout",
                                  opt.link_costs.source, opt.link_costs.ranks_per_host, opt.ranks_per_host));
  }
  const int want_tp = std::max(1, opt.only_tp), want_pp = std::max(1, opt.only_pp), want_ep = std::max(1, opt.only_ep);
  if (opt.ranks % (want_tp * want_pp * want_ep) != 0) {
    throw ConfigError(fmt::format("--tp {} x --pp {}{} does not divide --ranks {}; give degrees whose product divides {}",
                                  want_tp, want_pp, opt.only_ep > 0 ? fmt::format(" x --ep {}", want_ep) : std::string(),
                                  opt.ranks, opt.ranks));
  }
}

namespace {

Report project_one(const boost::json::value& config, const Options& opt, std::map<int, detail::ComputeCost>& costs) {
  validate(opt);
  Report rep;
  rep.options = opt;
  const run::RunConfig base = detail::layout_config(config, {.dp = opt.ranks}, opt.ranks);
  if (!base.model && !base.model_llama) {
    throw ConfigError("model: the config has no model section; the projection measures the built-in GPT or LLaMA it describes");
  }
  rep.model = base.model_llama ? fmt::format("LLaMA n_layer {} d_model {}", base.model_llama->n_layer, base.model_llama->d_model)
                               : fmt::format("GPT n_layer {} d_model {} n_head {} seq_len {}", base.model->n_layer,
                                             base.model->d_model, base.model->n_head, base.model->seq_len);
  if (base.model_moe) {
    rep.model += fmt::format(", MoE {} experts top-{} every {} block(s)", base.model_moe->moe.num_experts,
                             base.model_moe->moe.k, base.model_moe->every_n_layers);
  }
  rep.peak_flops_per_s = nn::product_peak(base.compute_dtype()).flops_per_s;
  // The probe's collectives must take the step's path, which the dtype decides (Note [in-step link costs]).
  const std::string comm_dtype(memory::dtype_name(base.gradient_comm_dtype()));
  if (!opt.link_costs.empty() && opt.link_costs.dtype != comm_dtype) {
    throw ConfigError(fmt::format("--link-costs: '{}' was measured with {} elements, the config communicates in {} "
                                  "(communication_data_type, by default the compute dtype); run step_comm_probe --dtype {}",
                                  opt.link_costs.source, opt.link_costs.dtype, comm_dtype, comm_dtype));
  }
  rep.oversubscription = std::max(1.0, static_cast<double>(opt.ranks_per_host) / opt.machine.cores_per_host) *
                         (opt.as_loaded ? opt.machine.loaded_stretch : 1.0);
  // Several hosts with the in-step probe: the compute's stretch measured in that job (its CPU share,
  // the load at the time included; Note [in-step link costs] in project_compute.cpp), but never below
  // ranks / cores: the probe's ranks wait between short stretches of work and yield their core to the
  // one computing (4 ranks on 2 cores measured 1.1-1.3 with ZeRO-3's 0.2 ms between gathers), while a
  // training step's ranks all compute most of the time and get C / R of a core each.
  if (!opt.link_costs.empty() && opt.ranks > opt.ranks_per_host) {
    rep.oversubscription = std::max({1.0, static_cast<double>(opt.ranks_per_host) / opt.machine.cores_per_host,
                                     opt.link_costs.compute_stretch});
  }
  // The measured engines' start-up lines (one per layout, stage and rank class) would bury the table.
  struct QuietEngines {
    spdlog::level::level_enum was = logger().level();
    QuietEngines() { logger().set_level(std::max(was, spdlog::level::warn)); }
    ~QuietEngines() { logger().set_level(was); }
  } quiet;
  // An MoE model's expert-parallel degrees: divisors of dp that divide its experts (model.moe.ep_size's rule).
  const int experts = base.model_moe ? base.model_moe->moe.num_experts : 1;
  if (opt.only_ep > 1 && !base.model_moe) {
    throw ConfigError(fmt::format("--ep {}: the model has no MoE layers (model.moe); expert parallelism needs experts", opt.only_ep));
  }
  for (int tp : divisors(opt.ranks)) {
    if (tp > opt.max_tp || (opt.only_tp > 0 && tp != opt.only_tp)) continue;
    for (int pp : divisors(opt.ranks / tp)) {
      if (opt.only_pp > 0 && pp != opt.only_pp) continue;
      const int dp = opt.ranks / (tp * pp);
      for (int ep : divisors(dp)) {
        if (experts % ep != 0 || (opt.only_ep > 0 && ep != opt.only_ep)) continue;
        const Layout l{.dp = dp, .tp = tp, .pp = pp, .ep = ep};
        rep.layouts.push_back(project_layout(config, opt, l, costs, rep.oversubscription));
      }
    }
  }
  // By throughput (step time per token): the step time's order when the config fixes train_batch_size;
  // with micro-batch and accumulation given instead, a layout of more data-parallel ranks trains more
  // tokens per step.
  std::stable_sort(rep.layouts.begin(), rep.layouts.end(), [](const Projection& a, const Projection& b) {
    if (a.valid != b.valid) return a.valid;
    return a.valid && a.tokens_per_s > b.tokens_per_s;
  });
  return rep;
}

}  // namespace

Report project(const boost::json::value& config, const Options& opt) { return project(config, opt, {opt.ranks}).front(); }

std::vector<Report> project(const boost::json::value& config, const Options& opt, const std::vector<int>& ranks) {
  std::map<int, detail::ComputeCost> costs;  // per tensor-parallel degree, for every world size
  std::vector<Report> out;
  for (int n : ranks) {
    Options o = opt;
    o.ranks = n;
    if (o.ranks_per_host == 0) o.ranks_per_host = n;
    out.push_back(project_one(config, o, costs));
  }
  return out;
}

}  // namespace zs::project
