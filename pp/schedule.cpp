#include "pp/schedule.h"

#include <algorithm>
#include <tuple>

#include <fmt/format.h>

#include "core/errors.h"

namespace zs::pp {

std::string schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kAllForwardAllBackward: return "afab";
    case Schedule::kOneFOneB: return "1f1b";
    case Schedule::kInterleaved: return "interleaved";
    case Schedule::kZeroBubbleH1: return "zb-h1";
  }
  return "?";
}

Schedule parse_schedule(const std::string& name) {
  for (auto s : {Schedule::kAllForwardAllBackward, Schedule::kOneFOneB, Schedule::kInterleaved, Schedule::kZeroBubbleH1}) {
    if (schedule_name(s) == name) return s;
  }
  throw ConfigError(fmt::format("pipeline.schedule: \"{}\" is not a schedule; use \"afab\" (all forward, all "
                                "backward), \"1f1b\", \"interleaved\" (with model.virtual_pipeline_size >= 2) or \"zb-h1\"",
                                name));
}

void validate(Schedule s, const PipelineShape& shape) {
  if (shape.stages < 1) {
    throw ConfigError(fmt::format("model.pipeline_parallel_size: must be a positive integer, got {}", shape.stages));
  }
  if (shape.chunks < 1) {
    throw ConfigError(fmt::format("model.virtual_pipeline_size: must be a positive integer, got {}", shape.chunks));
  }
  if (shape.micro_batches < 1) {
    throw ConfigError(fmt::format("the pipeline needs at least one micro-batch per step, got {} (raise "
                                  "gradient_accumulation_steps)",
                                  shape.micro_batches));
  }
  if (s != Schedule::kInterleaved && shape.chunks != 1) {
    throw ConfigError(fmt::format("model.virtual_pipeline_size: {} chunks per rank need pipeline.schedule = "
                                  "\"interleaved\" (got \"{}\"); set it to 1 or choose the interleaved schedule",
                                  shape.chunks, schedule_name(s)));
  }
  if (s == Schedule::kInterleaved) {
    if (shape.chunks < 2) {
      throw ConfigError(fmt::format("pipeline.schedule: \"interleaved\" needs model.virtual_pipeline_size >= 2 "
                                    "chunks per rank, got {}; raise it or use \"1f1b\"",
                                    shape.chunks));
    }
    if (shape.micro_batches % shape.stages != 0) {
      throw ConfigError(fmt::format("pipeline.schedule: \"interleaved\" runs micro-batches in groups of "
                                    "model.pipeline_parallel_size = {}, but a step has {} micro-batches; make "
                                    "gradient_accumulation_steps a multiple of {}",
                                    shape.stages, shape.micro_batches, shape.stages));
    }
  }
}

namespace {

// Note [ZB-H1] in pp/schedule.h: every rank's order from a unit-time list schedule. At each free
// moment a rank runs, by priority, the input gradient B of its oldest micro-batch whose output
// gradient has arrived (B is what the previous stage waits for); else the forward of its next
// micro-batch, if it has arrived, fewer than stages - rank micro-batches wait for their B (1F1B's
// bound on whole activations) and fewer than 2 * stages - rank - 1 for their W (what a deferred W
// keeps: without this bound W would all drift to the end of the step, holding every micro-batch's
// inputs); else its oldest pending weight gradient W; else it idles. The steady state is then F B W,
// with stages - rank - 1 W passes delayed into the cool-down, and the bubble ZB-H1's
// (stages - 1) * (F + B - W): 1/3 of 1F1B's per rank in the limit of many micro-batches.
std::vector<std::vector<Op>> zero_bubble_h1(const PipelineShape& shape) {
  const int p = shape.stages;
  const int64_t m = shape.micro_batches;
  constexpr int64_t kNever = INT64_MAX;
  struct Rank {
    int64_t busy_until = 0, next_f = 0, next_b = 0, next_w = 0;
    std::vector<int64_t> act, grad;  // arrival times of micro-batch inputs / output gradients
    std::vector<Op> ops;
  };
  std::vector<Rank> rk(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    rk[static_cast<size_t>(r)].act.assign(static_cast<size_t>(m), r == 0 ? 0 : kNever);
    rk[static_cast<size_t>(r)].grad.assign(static_cast<size_t>(m), kNever);
  }
  for (int64_t t = 0;; ++t) {
    bool all_done = true;
    for (int r = 0; r < p; ++r) {
      Rank& k = rk[static_cast<size_t>(r)];
      if (k.next_w < m) all_done = false;
      if (k.busy_until > t || k.next_w == m) continue;
      if (k.next_b < k.next_f && k.grad[static_cast<size_t>(k.next_b)] <= t) {
        const int64_t b = k.next_b++;
        k.ops.push_back({Op::kBackward, b, 0});
        if (r > 0) rk[static_cast<size_t>(r - 1)].grad[static_cast<size_t>(b)] = t + 1;
      } else if (k.next_f < m && k.act[static_cast<size_t>(k.next_f)] <= t && k.next_f - k.next_b < p - r &&
                 k.next_f - k.next_w < 2 * p - r - 1) {
        const int64_t f = k.next_f++;
        k.ops.push_back({Op::kForward, f, 0});
        if (r + 1 < p) rk[static_cast<size_t>(r + 1)].act[static_cast<size_t>(f)] = t + 1;
        else k.grad[static_cast<size_t>(f)] = t + 1;
      } else if (k.next_w < k.next_b) {
        k.ops.push_back({Op::kWeight, k.next_w++, 0});
      } else {
        continue;
      }
      k.busy_until = t + 1;
    }
    if (all_done) break;
  }
  std::vector<std::vector<Op>> out;
  for (auto& k : rk) out.push_back(std::move(k.ops));
  return out;
}

}  // namespace

int max_in_flight(Schedule s, const PipelineShape& shape, int rank) {
  int held = 0, most = 0;
  for (const Op& o : schedule_ops(s, shape, rank)) {
    if (o.kind == Op::kWeight) continue;
    held += o.kind == Op::kForward ? 1 : -1;
    most = std::max(most, held);
  }
  return most;
}

std::vector<Op> schedule_ops(Schedule s, const PipelineShape& shape, int rank) {
  validate(s, shape);
  const int64_t p = shape.stages, v = shape.chunks, m = shape.micro_batches, total = m * v;
  // Megatron's interleaved order: pass k's micro-batch and chunk (v = 1: micro-batch k, chunk 0).
  auto op = [&](Op::Kind kind, int64_t k) {
    const int64_t in_group = k % (p * v);
    int64_t chunk = in_group / p;
    if (kind == Op::kBackward) chunk = v - 1 - chunk;
    return Op{kind, (k / (p * v)) * p + in_group % p, static_cast<int>(chunk)};
  };
  int64_t warmup = total;
  if (s == Schedule::kOneFOneB || s == Schedule::kZeroBubbleH1) warmup = std::min<int64_t>(p - rank - 1, m);
  if (s == Schedule::kInterleaved) warmup = m == p ? total : std::min<int64_t>((p - rank - 1) * 2 + (v - 1) * p, total);
  std::vector<Op> ops;
  for (int64_t k = 0; k < warmup; ++k) ops.push_back(op(Op::kForward, k));
  for (int64_t i = 0; i < total - warmup; ++i) {
    ops.push_back(op(Op::kForward, warmup + i));
    ops.push_back(op(Op::kBackward, i));
  }
  for (int64_t k = std::max<int64_t>(total - warmup, 0); k < total; ++k) ops.push_back(op(Op::kBackward, k));
  if (s == Schedule::kZeroBubbleH1) return zero_bubble_h1(shape)[static_cast<size_t>(rank)];
  return ops;
}

// Unit pass times of plan()'s simulation: forward 1, backward 2 (input and weight gradients, each
// about a forward's work), or 1 and 1 where ZB-H1 splits them.
static double pass_time(Schedule s, Op::Kind k) {
  if (k == Op::kForward) return 1.0;
  return s == Schedule::kZeroBubbleH1 ? 1.0 : 2.0;
}

Timeline timeline(Schedule s, const PipelineShape& shape, const std::vector<std::vector<double>>& seconds,
                  double transfer_s) {
  return timeline(s, shape, seconds, [transfer_s](int, int, double ready) { return ready + transfer_s; });
}

Timeline timeline(Schedule s, const PipelineShape& shape, const std::vector<std::vector<double>>& seconds,
                  const TransferArrival& arrive) {
  const int p = shape.stages, G = shape.global_chunks();
  const int64_t m = shape.micro_batches;
  Timeline tl;
  auto& ops = tl.ops;
  ops.resize(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) ops[static_cast<size_t>(r)] = schedule_ops(s, shape, r);
  ZS_ASSERT(seconds.empty() || seconds.size() == ops.size(), "pp::timeline: pass times of {} ranks for {}",
            seconds.size(), ops.size());
  for (size_t r = 0; r < seconds.size(); ++r) {
    ZS_ASSERT(seconds[r].size() == ops[r].size(), "pp::timeline: {} pass times for rank {}'s {} passes",
              seconds[r].size(), r, ops[r].size());
  }

  // End times of every pass, -1 until it ran (Note [transfer order]).
  tl.forward_end.assign(static_cast<size_t>(m * G), -1.0);
  tl.backward_end.assign(static_cast<size_t>(m * G), -1.0);
  // When a pass's output reaches the rank of the chunk that consumes it (its end where that is this rank).
  std::vector<double> forward_arrives(static_cast<size_t>(m * G), -1.0), backward_arrives(static_cast<size_t>(m * G), -1.0);
  auto at = [&](std::vector<double>& v, int64_t b, int g) -> double& { return v[static_cast<size_t>(b * G + g)]; };
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<double> free_at(static_cast<size_t>(p), 0.0), busy(static_cast<size_t>(p), 0.0);
  tl.start.resize(static_cast<size_t>(p));
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      auto& list = ops[static_cast<size_t>(r)];
      for (size_t& i = next[static_cast<size_t>(r)]; i < list.size(); ++i) {
        const Op& o = list[i];
        const int g = o.chunk * p + r;
        // The input's arrival: a pass on another rank reaches this one after its transfer (Note
        // [transfer delay]), so the arrays hold arrivals, set when the producing pass ends.
        double dep = 0.0;
        if (o.kind == Op::kWeight) {
          dep = at(tl.backward_end, o.micro_batch, g);  // its own input gradient, earlier on this rank
        } else if (o.kind == Op::kForward) {
          dep = g == 0 ? 0.0 : at(forward_arrives, o.micro_batch, g - 1);
        } else {
          dep = g == G - 1 ? at(tl.forward_end, o.micro_batch, g) : at(backward_arrives, o.micro_batch, g + 1);
          if (at(tl.forward_end, o.micro_batch, g) < 0.0) dep = -1.0;
        }
        if (dep < 0.0) break;
        const double t0 = std::max(free_at[static_cast<size_t>(r)], dep);
        const double d = seconds.empty() ? pass_time(s, o.kind) : seconds[static_cast<size_t>(r)][i];
        tl.start[static_cast<size_t>(r)].push_back(t0);
        if (o.kind != Op::kWeight) {
          const bool fwd = o.kind == Op::kForward;
          at(fwd ? tl.forward_end : tl.backward_end, o.micro_batch, g) = t0 + d;
          // Its output goes to the next chunk (forward) or the previous one (backward's input gradient).
          const int to = fwd ? g + 1 : g - 1;
          if (to >= 0 && to < G) {
            const int dst = to % p;
            at(fwd ? forward_arrives : backward_arrives, o.micro_batch, g) = dst == r ? t0 + d : arrive(r, dst, t0 + d);
          }
        }
        free_at[static_cast<size_t>(r)] = t0 + d;
        busy[static_cast<size_t>(r)] += d;
        progress = true;
      }
    }
  }
  for (int r = 0; r < p; ++r) {
    if (next[static_cast<size_t>(r)] != ops[static_cast<size_t>(r)].size()) {
      throw UsageError(fmt::format("pp: schedule \"{}\" cannot complete on rank {} ({} stages, {} chunks, {} "
                                   "micro-batches)",
                                   schedule_name(s), r, p, shape.chunks, m));
    }
  }

  for (int r = 0; r < p; ++r) tl.makespan = std::max(tl.makespan, free_at[static_cast<size_t>(r)]);
  for (int r = 0; r < p; ++r) {
    tl.bubble.push_back(tl.makespan > 0.0 ? 1.0 - busy[static_cast<size_t>(r)] / tl.makespan : 0.0);
  }
  return tl;
}

Plan plan(Schedule s, const PipelineShape& shape) {
  const int p = shape.stages, G = shape.global_chunks();
  const Timeline tl = timeline(s, shape);  // unit times: exact in double, so the order is plain integers'
  auto at = [&](const std::vector<double>& v, int64_t b, int g) { return v[static_cast<size_t>(b * G + g)]; };

  // Every rank's actions sorted by (time, transfers before passes, kind, micro-batch, chunk, order).
  using Key = std::tuple<double, int, int, int64_t, int, size_t>;
  std::vector<std::vector<std::pair<Key, Action>>> items(static_cast<size_t>(p));
  Plan out;
  for (int r = 0; r < p; ++r) {
    const auto& list = tl.ops[static_cast<size_t>(r)];
    for (size_t i = 0; i < list.size(); ++i) {
      const Op& o = list[i];
      items[static_cast<size_t>(r)].push_back({Key{tl.start[static_cast<size_t>(r)][i], 1, 0, 0, 0, i}, Action{Action::kRun, o, {}}});
      const int g = o.chunk * p + r;
      const bool fwd = o.kind == Op::kForward;
      if (o.kind == Op::kWeight || (fwd ? g == G - 1 : g == 0)) continue;
      const int to = (fwd ? g + 1 : g - 1) % p;
      const Transfer x{o.kind, o.micro_batch, g, r, to};
      const Key key{at(fwd ? tl.forward_end : tl.backward_end, o.micro_batch, g), 0, fwd ? 0 : 1, o.micro_batch, g, 0};
      items[static_cast<size_t>(r)].push_back({key, Action{Action::kSend, {}, x}});
      items[static_cast<size_t>(to)].push_back({key, Action{Action::kRecv, {}, x}});
    }
  }
  for (int r = 0; r < p; ++r) {
    auto& it = items[static_cast<size_t>(r)];
    std::stable_sort(it.begin(), it.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<Action> acts;
    for (auto& [k, a] : it) acts.push_back(a);
    out.ranks.push_back(std::move(acts));
  }
  out.makespan = tl.makespan;  // a transfer's time is its producer's end, within the makespan
  out.bubble = tl.bubble;
  return out;
}

}  // namespace zs::pp
