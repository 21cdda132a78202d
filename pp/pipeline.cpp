#include "pp/pipeline.h"

#include <algorithm>
#include <map>
#include <memory>
#include <tuple>

#include <fmt/format.h>

#include "core/clock.h"
#include "core/errors.h"
#include "nn/module.h"

namespace zs::pp {

using memory::DType;
using memory::Tensor;

// Instances of one local chunk (Note [micro-batches in flight]); inst[0] holds the storage.
struct Pipeline::Chunk {
  ChunkFactory factory;
  std::vector<std::unique_ptr<StageModel>> owned;  // the instances this pipeline built
  std::vector<StageModel*> inst;                   // inst[0]: the first (owned, or the caller's)
  std::vector<int64_t> holds;  // the micro-batch each instance holds, -1: free
};

namespace {

// Points `copy`'s parameters at `master`'s data and grad (the same model, parameter by parameter).
void bind(StageModel& copy, StageModel& master) {
  auto a = master.all_params(), b = copy.all_params();
  ZS_ASSERT(a.size() == b.size(), "pp: a chunk factory built {} parameters, then {}", a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ZS_ASSERT(a[i]->full_name() == b[i]->full_name() && a[i]->shape() == b[i]->shape(),
              "pp: a chunk factory built parameter {} then {}", a[i]->full_name(), b[i]->full_name());
    b[i]->set_data(a[i]->data());
    b[i]->set_grad(a[i]->grad());
  }
}

// One pass's wall and thread CPU seconds, into StepStats.
struct Timer {
  double wall = now_seconds(), cpu = thread_cpu_seconds();
  void stop(StepStats& st) const {
    const double w = now_seconds() - wall;
    st.busy_seconds += w;
    st.pass_seconds.push_back(w);
    st.pass_cpu_seconds.push_back(thread_cpu_seconds() - cpu);
  }
};

using Key = std::tuple<int, int64_t, int>;  // (Op::Kind, micro-batch, producing global chunk)

struct Slot {
  Tensor t;
  comm::Work w;
  bool send = false;    // a send (else a receive)
  bool aged = false;    // a send: the action it was posted in has ended
  bool waited = false;  // a send: complete, its tensor free to go
};

}  // namespace

Pipeline::Pipeline(const comm::Group& group, const PipelineConfig& cfg, std::vector<ChunkFactory> factories,
                   std::vector<StageModel*> first)
    : group_(group), cfg_(cfg) {
  ZS_ASSERT(!factories.empty(), "pp::Pipeline needs at least one chunk factory");
  ZS_ASSERT(first.empty() || first.size() == factories.size(), "pp::Pipeline: {} first instances for {} chunks",
            first.size(), factories.size());
  for (size_t i = 0; i < factories.size(); ++i) {
    auto c = std::make_unique<Chunk>();
    c->factory = std::move(factories[i]);
    if (first.empty()) {
      c->owned.push_back(c->factory());
      c->inst.push_back(c->owned.back().get());
    } else {
      c->inst.push_back(first[i]);
    }
    c->holds.push_back(-1);
    chunks_.push_back(std::move(c));
  }
}

Pipeline::~Pipeline() = default;

StageModel& Pipeline::chunk(int c) { return *chunks_.at(static_cast<size_t>(c))->inst[0]; }

StageModel& Pipeline::acquire(int c, int64_t mb, int* in_flight) {
  Chunk& ch = *chunks_[static_cast<size_t>(c)];
  auto it = std::find(ch.holds.begin(), ch.holds.end(), int64_t{-1});
  size_t i = static_cast<size_t>(it - ch.holds.begin());
  if (it == ch.holds.end()) {
    ch.owned.push_back(ch.factory());
    ch.inst.push_back(ch.owned.back().get());
    ch.holds.push_back(-1);
    bind(*ch.inst.back(), *ch.inst[0]);
  }
  ch.holds[i] = mb;
  int n = 0;
  for (auto& x : chunks_) n += static_cast<int>(std::count_if(x->holds.begin(), x->holds.end(), [](int64_t h) { return h >= 0; }));
  *in_flight = std::max(*in_flight, n);
  return *ch.inst[i];
}

StageModel& Pipeline::holder(int c, int64_t mb) {
  Chunk& ch = *chunks_[static_cast<size_t>(c)];
  auto it = std::find(ch.holds.begin(), ch.holds.end(), mb);
  ZS_ASSERT(it != ch.holds.end(), "pp: backward of micro-batch {} on chunk {} without its forward", mb, c);
  return *ch.inst[static_cast<size_t>(it - ch.holds.begin())];
}

void Pipeline::release(int c, int64_t mb) {
  Chunk& ch = *chunks_[static_cast<size_t>(c)];
  *std::find(ch.holds.begin(), ch.holds.end(), mb) = -1;
}

StepStats Pipeline::run(nn::Context& ctx, std::span<const nn::Batch> micro_batches, float grad_scale) {
  const double t_start = now_seconds();
  const int p = group_.size(), r = group_.rank(), G = p * chunks();
  const int64_t m = static_cast<int64_t>(micro_batches.size());

  // Agree on (micro-batches, batch, sequence) once (Note [micro-batches in flight] in pipeline.h).
  int64_t B = -1, T = -1;
  if (m > 0) {
    const Tensor& t = micro_batches[0].inputs.defined() && micro_batches[0].inputs.dim() == 2 ? micro_batches[0].inputs
                                                                                              : micro_batches[0].targets;
    if (t.raw() != nullptr && t.dim() == 2) B = t.size(0), T = t.size(1);
  }
  Tensor mine = Tensor::empty({3}, DType::kI32), all = Tensor::empty({3 * p}, DType::kI32);
  mine.data<int32_t>()[0] = static_cast<int32_t>(m);
  mine.data<int32_t>()[1] = static_cast<int32_t>(B);
  mine.data<int32_t>()[2] = static_cast<int32_t>(T);
  // Every slot starts as this rank's: a simulated group (the memory estimator) moves nothing, and every
  // stage it plays then agrees with itself; a real allgather overwrites them all.
  for (int q = 0; q < p; ++q) std::copy_n(mine.data<int32_t>(), 3, all.data<int32_t>() + 3 * q);
  group_.allgather(mine, all);
  const int32_t* a = all.data<int32_t>();
  for (int q = 0; q < p; ++q) {
    if (a[3 * q] != a[0]) {
      throw UsageError(fmt::format("pp: rank {} of the \"{}\" group runs {} micro-batches this step, rank 0 {}; every "
                                   "stage must run the same gradient_accumulation_steps",
                                   q, group_.name(), a[3 * q], a[0]));
    }
  }
  for (int q = 0; q < p; ++q) {
    if (a[3 * q + 1] < 0) continue;
    if ((B >= 0 && (a[3 * q + 1] != B || a[3 * q + 2] != T)) || (B < 0 && (B = a[3 * q + 1], T = a[3 * q + 2], false))) {
      throw UsageError(fmt::format("pp: rank {} of the \"{}\" group has micro-batches of ({}, {}) tokens, another "
                                   "({}, {}); every stage must read the same micro-batch shape",
                                   q, group_.name(), a[3 * q + 1], a[3 * q + 2], B, T));
    }
  }
  ZS_ASSERT(B > 0 && T > 0, "pp: no stage of the \"{}\" group has micro-batch tensors", group_.name());

  const PipelineShape shape{.stages = p, .chunks = chunks(), .micro_batches = m};
  const Plan pl = plan(cfg_.schedule, shape);
  for (auto& ch : chunks_) {
    for (size_t i = 0; i < ch->inst.size(); ++i) {
      if (i > 0) bind(*ch->inst[i], *ch->inst[0]);
      // A run that threw (a model error) left instances mid-pass: this one starts clean.
      if (ch->holds[i] >= 0) ch->inst[i]->clear_saved();
      ch->holds[i] = -1;
    }
  }
  const memory::Shape boundary = chunk(0).boundary_shape(B, T);

  StepStats st;
  st.ideal_bubble = pl.bubble[static_cast<size_t>(r)];
  std::map<Key, std::shared_ptr<Slot>> inbox;  // received (or handed over locally), until the consuming pass
  std::map<Key, Tensor> outbox;                 // produced, until its send
  std::vector<std::shared_ptr<Slot>> posted;    // transfers not yet known complete, in posting order
  double loss_sum = 0.0;
  // ZB-H1: each backward's deferred weight gradients, until its W pass (Note [ZB-H1] in pp/schedule.h).
  const bool split = cfg_.schedule == Schedule::kZeroBubbleH1;
  std::map<std::pair<int, int64_t>, std::vector<nn::DeferredGrad>> deferred;
  struct SinkScope {
    nn::Context& ctx;
    ~SinkScope() { ctx.set_weight_grad_sink(nullptr); }
  };
  // Waits for one transfer. When it fails, the first failed transfer before it is rethrown instead:
  // comm runs them in posting order, so that one names the stuck peer and the timeout, while the later
  // ones only say the group is unusable after it.
  auto wait = [&](Slot& slot) {
    try {
      slot.w.wait();
    } catch (...) {
      for (auto& q : posted) {
        if (q.get() == &slot) break;
        q->w.test();
      }
      throw;
    }
  };
  auto take = [&](const Key& k) {
    auto it = inbox.find(k);
    ZS_ASSERT(it != inbox.end(), "pp: a pass's input never arrived (plan bug)");
    wait(*it->second);
    Tensor t = std::move(it->second->t);
    inbox.erase(it);
    return t;
  };
  for (const Action& act : pl.ranks[static_cast<size_t>(r)]) {
    const Transfer& x = act.xfer;
    const Key xk{x.kind, x.micro_batch, x.from_chunk};
    if (act.kind == Action::kRecv) {
      if (x.src == r) continue;  // handed over by the send below
      Tensor t = ctx.allocate(boundary, DType::kF32, x.kind == Op::kForward ? nn::MemoryUse::kActivation : nn::MemoryUse::kGradient);
      comm::Work w = group_.recv_async(t, x.src);
      inbox[xk] = std::make_shared<Slot>(Slot{std::move(t), std::move(w)});
      posted.push_back(inbox[xk]);
    } else if (act.kind == Action::kSend) {
      auto it = outbox.find(xk);
      ZS_ASSERT(it != outbox.end(), "pp: a send before its pass (plan bug)");
      Tensor t = std::move(it->second);
      outbox.erase(it);
      if (x.dst == r) {
        inbox[xk] = std::make_shared<Slot>(Slot{std::move(t), {}});
      } else {
        st.bytes_sent += static_cast<int64_t>(t.nbytes());
        comm::Work w = group_.send_async(t, x.dst);
        posted.push_back(std::make_shared<Slot>(Slot{std::move(t), std::move(w), true}));
      }
    } else {
      const Op& o = act.op;
      const int g = o.chunk * p + r;
      const nn::Batch& mb = micro_batches[static_cast<size_t>(o.micro_batch)];
      if (o.kind == Op::kForward) {
        nn::Batch in{g == 0 ? mb.inputs : take(Key{Op::kForward, o.micro_batch, g - 1}), mb.targets};
        StageModel& s = acquire(o.chunk, o.micro_batch, &st.max_in_flight);
        const Timer timer;
        const float loss = ctx.forward_loss(s, in);
        if (g == G - 1) loss_sum += loss; else outbox[Key{Op::kForward, o.micro_batch, g}] = s.take_output();
        timer.stop(st);
      } else if (o.kind == Op::kWeight) {
        auto it = deferred.find({o.chunk, o.micro_batch});
        ZS_ASSERT(it != deferred.end(), "pp: W pass of micro-batch {} before its B (plan bug)", o.micro_batch);
        const Timer timer;
        ctx.run_deferred(it->second);
        timer.stop(st);
        deferred.erase(it);
      } else {
        StageModel& s = holder(o.chunk, o.micro_batch);
        if (g != G - 1) s.set_output_grad(take(Key{Op::kBackward, o.micro_batch, g + 1}));
        const Timer timer;
        if (split) {
          SinkScope scope{ctx};
          ctx.set_weight_grad_sink(&deferred[{o.chunk, o.micro_batch}], s.grads_intact());
          ctx.backward_loss(s, grad_scale);
        } else {
          ctx.backward_loss(s, grad_scale);
        }
        if (g != 0) outbox[Key{Op::kBackward, o.micro_batch, g}] = s.take_input_grad();
        timer.stop(st);
        release(o.chunk, o.micro_batch);
      }
    }
    // A send is waited for, and its tensor goes back to the Context, once one more action has run
    // since it was posted (Note [send retirement] in pipeline.h); receives are forgotten when done.
    for (auto& q : posted) {
      if (!q->send) continue;
      if (q->aged) {
        wait(*q);
        q->waited = true;
      }
      q->aged = true;
    }
    std::erase_if(posted, [](const std::shared_ptr<Slot>& q) { return q->send ? q->waited : q->w.test(); });
  }
  for (auto& q : posted) wait(*q);
  ZS_ASSERT(inbox.empty() && outbox.empty() && deferred.empty(), "pp: {} transfers or W passes left over (plan bug)",
            inbox.size() + outbox.size() + deferred.size());

  // The mean loss, from the last stage to every stage.
  Tensor l = Tensor::empty({1}, DType::kF32);
  l.data<float>()[0] = static_cast<float>(loss_sum / static_cast<double>(m));
  group_.broadcast(l, p - 1);
  st.loss = l.data<float>()[0];
  st.seconds = now_seconds() - t_start;
  st.bubble = st.seconds > 0.0 ? 1.0 - st.busy_seconds / st.seconds : 0.0;
  return st;
}

}  // namespace zs::pp
