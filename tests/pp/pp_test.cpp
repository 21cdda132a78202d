// Pipeline parallelism (pp/) under mpirun at 1, 2 and 4 ranks: the world as one pipeline, and at 4
// ranks also two pipelines of 2 (comm::Topology's "pp" groups). For every schedule (all-forward-all-
// backward, 1F1B, interleaved with 2 chunks per rank, ZB-H1), tied and untied embeddings, activation
// recomputation on: the mean loss over the micro-batches and every parameter's gradient equal
// nn::GptModel's run over the same micro-batches (fp32 1e-5), each parameter under its GptModel name
// and init; pp x tp (pp::TpGptStage) at 2 and 4 ranks, sequence parallelism off and on; the compute partition's uneven split (vocabulary 512) likewise. Partitioning and the schedules' plans (every pass once, the ideal bubble against
// (pp - 1) / (m + pp - 1), micro-batches in flight) without MPI; errors name the config keys.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "comm/comm.h"
#include "core/errors.h"
#include "nn/gpt.h"
#include "nn/host_context.h"
#include "nn/layers.h"
#include "pp/pp.h"
#include "tests/tp/tp_test_util.h"

namespace zs::pp {
namespace {

using memory::DType;
using memory::Tensor;
using zs::tp::test::expect_close;
using zs::tp::test::randomize;

constexpr int64_t kB = 2, kT = 8, kV = 16;

nn::GptConfig config(bool tied, int64_t vocab = kV) {
  return {.n_layer = 8, .d_model = 16, .n_head = 2, .seq_len = kT, .vocab_size = vocab, .tied_embeddings = tied};
}

std::vector<nn::Batch> micro_batches(int64_t m) {
  std::vector<nn::Batch> out;
  for (int64_t k = 0; k < m; ++k) {
    nn::Batch b{Tensor::empty({kB, kT}, DType::kI32), Tensor::empty({kB, kT}, DType::kI32)};
    CounterRng rng(static_cast<uint64_t>(k), "pp tokens");
    for (int64_t i = 0; i < b.inputs.numel(); ++i) {
      b.inputs.data<int32_t>()[i] = static_cast<int32_t>(rng.uniform(2 * static_cast<uint64_t>(i)) * kV) % kV;
      b.targets.data<int32_t>()[i] = static_cast<int32_t>(rng.uniform(2 * static_cast<uint64_t>(i) + 1) * kV) % kV;
    }
    out.push_back(b);
  }
  return out;
}

// ---- Partitioning ----

TEST(Partition, ParametersBalanceTheLargestStage) {
  const std::vector<int64_t> cost = {10, 1, 1, 1, 1, 10};
  EXPECT_EQ(partition({.method = PartitionMethod::kParameters}, cost, 2), (std::vector<int64_t>{0, 3, 6}));
  EXPECT_EQ(partition({.method = PartitionMethod::kParameters}, cost, 3), (std::vector<int64_t>{0, 1, 5, 6}));
  EXPECT_EQ(partition({.method = PartitionMethod::kParameters}, cost, 6), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  const std::vector<int64_t> zeros = {0, 0, 0, 5};  // no stage is left empty
  EXPECT_EQ(partition({.method = PartitionMethod::kParameters}, zeros, 4), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(partition({.method = PartitionMethod::kUniform}, cost, 4), (std::vector<int64_t>{0, 2, 4, 5, 6}));
  EXPECT_EQ(partition({.method = PartitionMethod::kExplicit, .boundaries = {0, 5, 6}}, cost, 2),
            (std::vector<int64_t>{0, 5, 6}));
}

TEST(Partition, ErrorsNameTheKeys) {
  const std::vector<int64_t> cost = {1, 1, 1};
  auto message = [&](const PartitionConfig& c, int stages) {
    try {
      partition(c, cost, stages);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({}, 4).find("model.pipeline_parallel_size: 4 stages"), std::string::npos) << message({}, 4);
  EXPECT_NE(message({}, 0).find("model.pipeline_parallel_size"), std::string::npos);
  for (auto b : {std::vector<int64_t>{0, 3}, {0, 2, 2, 3}, {1, 2, 3}, {0, 1, 4}}) {
    EXPECT_NE(message({.method = PartitionMethod::kExplicit, .boundaries = b}, static_cast<int>(b.size()) - 1 == 1 ? 2 : 3)
                  .find("pipeline.partition_boundaries"),
              std::string::npos);
  }
  EXPECT_THROW(parse_partition_method("layers"), ConfigError);
  EXPECT_EQ(parse_partition_method("uniform"), PartitionMethod::kUniform);
  // The GPT's layers are its blocks: 8 blocks fit at most 8 global chunks.
  EXPECT_THROW(gpt_partition(config(true), {}, 9), ConfigError);
  EXPECT_EQ(gpt_partition(config(true), {.method = PartitionMethod::kUniform}, 4), (std::vector<int64_t>{0, 2, 4, 6, 8}));
  EXPECT_EQ(parse_partition_method("compute"), PartitionMethod::kCompute);
}

// Note [compute partition] in pp/gpt.cpp: at vocabulary 512 and d_model 16 the head's products cost
// 2.46 blocks and the embedding lookup none, while the parameter count weighs the embedding (3.5
// blocks of elements) as much as the head: "parameters" splits 4 / 4, "compute" gives the last
// stage fewer blocks (5 + 3 blocks, costs 5 and 5.46; 4 / 4 would be 4 and 6.46).
TEST(Partition, ComputeCountsTheHeadAndNotTheEmbeddingLookup) {
  const nn::GptConfig big = config(true, 512);
  EXPECT_EQ(gpt_partition(big, {.method = PartitionMethod::kParameters}, 2), (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(gpt_partition(big, {.method = PartitionMethod::kCompute}, 2), (std::vector<int64_t>{0, 5, 8}));
  EXPECT_EQ(gpt_partition(big, {.method = PartitionMethod::kCompute}, 4), (std::vector<int64_t>{0, 3, 6, 7, 8}));
  // The head of a 16-token vocabulary is 8% of a block: no whole-block split beats the uniform one.
  EXPECT_EQ(gpt_partition(config(true), {.method = PartitionMethod::kCompute}, 4), (std::vector<int64_t>{0, 2, 4, 6, 8}));
  // The stage's parameters are counted as such whatever balanced the split: stage 0 holds 5 blocks and
  // the embeddings (wte 512 x 16, wpe 8 x 16).
  EXPECT_EQ(gpt_stage_param_count(big, {.method = PartitionMethod::kCompute}, 2, 1, 0),
            5 * (12 * 16 * 16 + 13 * 16) + 512 * 16 + 8 * 16);
}

// ---- Schedules ----

TEST(Schedule, PlansRunEveryPassOnceWithTheFormulaBubble) {
  for (Schedule s : {Schedule::kAllForwardAllBackward, Schedule::kOneFOneB, Schedule::kInterleaved, Schedule::kZeroBubbleH1}) {
    for (int p : {1, 2, 4}) {
      for (int64_t m : {4, 8, 16}) {
        const PipelineShape shape{.stages = p, .chunks = s == Schedule::kInterleaved ? 2 : 1, .micro_batches = m};
        SCOPED_TRACE(fmt::format("{} pp {} m {}", schedule_name(s), p, m));
        const Plan pl = plan(s, shape);
        for (int r = 0; r < p; ++r) {
          std::set<std::tuple<int, int64_t, int>> seen;
          int in_flight = 0, most = 0, awaiting_w = 0, most_w = 0;
          for (const Action& a : pl.ranks[static_cast<size_t>(r)]) {
            if (a.kind != Action::kRun) continue;
            EXPECT_TRUE(seen.insert({a.op.kind, a.op.micro_batch, a.op.chunk}).second);
            if (a.op.kind != Op::kWeight) in_flight += a.op.kind == Op::kForward ? 1 : -1;
            if (a.op.kind != Op::kBackward) awaiting_w += a.op.kind == Op::kForward ? 1 : -1;
            most = std::max(most, in_flight);
            most_w = std::max(most_w, awaiting_w);
          }
          EXPECT_EQ(static_cast<int64_t>(seen.size()), (s == Schedule::kZeroBubbleH1 ? 3 : 2) * m * shape.chunks);
          // The plan's count is what max_in_flight (the memory estimator's per-stage figure) says.
          EXPECT_EQ(max_in_flight(s, shape, r), most);
          if (s == Schedule::kOneFOneB || s == Schedule::kZeroBubbleH1) {  // stage r holds pp - r
            EXPECT_EQ(most, std::min<int64_t>(p - r, m));
          }
          if (s == Schedule::kAllForwardAllBackward) {
            EXPECT_EQ(most, m);
          }
          const double formula = static_cast<double>(p - 1) / static_cast<double>(m + p - 1);
          if (s == Schedule::kAllForwardAllBackward || s == Schedule::kOneFOneB) {
            EXPECT_NEAR(pl.bubble[static_cast<size_t>(r)], formula, 1e-12);
          }
          if (s == Schedule::kInterleaved && p > 1) {
            EXPECT_LT(pl.bubble[static_cast<size_t>(r)], formula);
          }
          if (s == Schedule::kZeroBubbleH1) {  // ZB-H1: (pp - 1) (F + B - W) per rank, at most half of 1F1B's
            EXPECT_NEAR(pl.bubble[static_cast<size_t>(r)], static_cast<double>(p - 1) / static_cast<double>(3 * m + p - 1),
                        1e-12);
            EXPECT_LE(pl.bubble[static_cast<size_t>(r)], 0.5 * formula + 1e-12);
            EXPECT_LE(most_w, std::max(2 * p - r - 1, 1));  // deferred W passes stay bounded (Note [ZB-H1])
          }
        }
      }
    }
  }
}

// Note [transfer delay]: 1F1B over 2 stages, 2 micro-batches, F 1 and B 2, each transfer 0.5.
// Rank 0: F0 [0, 1], F1 [1, 2] (its send does not hold it), B0 [4.5 + 0.5, 7], B1 [7.5 + 0.5, 10].
// Rank 1: F0 [1 + 0.5, 2.5], B0 [2.5, 4.5], F1 [4.5, 5.5] (its input arrived at 2.5), B1 [5.5, 7.5].
TEST(Schedule, TimelineDelaysOnlyThePassThatReceives) {
  const PipelineShape shape{.stages = 2, .chunks = 1, .micro_batches = 2};
  const std::vector<std::vector<double>> secs{{1, 1, 2, 2}, {1, 2, 1, 2}};
  const Timeline tl = timeline(Schedule::kOneFOneB, shape, secs, 0.5);
  EXPECT_EQ(tl.ops[0], (std::vector<Op>{{Op::kForward, 0, 0}, {Op::kForward, 1, 0}, {Op::kBackward, 0, 0}, {Op::kBackward, 1, 0}}));
  EXPECT_EQ(tl.start[0], (std::vector<double>{0, 1, 5, 8}));
  EXPECT_EQ(tl.start[1], (std::vector<double>{1.5, 2.5, 4.5, 5.5}));
  EXPECT_EQ(tl.makespan, 10.0);
  EXPECT_DOUBLE_EQ(tl.bubble[0], 0.4);  // 6 of 10 busy on each rank
  EXPECT_DOUBLE_EQ(tl.bubble[1], 0.4);
  // No transfer time: the timeline of before (9: the two transfers on the critical path gone).
  const Timeline none = timeline(Schedule::kOneFOneB, shape, secs, 0.0);
  EXPECT_EQ(none.makespan, 9.0);
  EXPECT_EQ(none.start, timeline(Schedule::kOneFOneB, shape, secs).start);
  EXPECT_EQ(none.start[1], (std::vector<double>{1, 2, 4, 5}));
}

// A transfer whose time depends on the ones before it (project's link per stage: Note [a pipeline's
// sends through the link] in project/project.cpp): each is asked for as its pass ends, each rank's in
// order. Here each rank's link sends one transfer at a time, 1.5 each: rank 0's F1 output waits for F0's.
// Rank 0: F0 [0, 1] (arrives 2.5), F1 [1, 2] (link free at 2.5: arrives 4), B0 [7, 9], B1 [10, 12].
// Rank 1: F0 [2.5, 3.5], B0 [3.5, 5.5] (arrives 7), F1 [5.5, 6.5], B1 [6.5, 8.5] (arrives 10).
TEST(Schedule, TimelineAsksEachTransferAsItsPassEnds) {
  const PipelineShape shape{.stages = 2, .chunks = 1, .micro_batches = 2};
  const std::vector<std::vector<double>> secs{{1, 1, 2, 2}, {1, 2, 1, 2}};
  std::vector<std::tuple<int, int, double>> asked;
  std::vector<double> link_free(2, 0.0);
  const Timeline tl = timeline(Schedule::kOneFOneB, shape, secs, [&](int src, int dst, double ready) {
    asked.emplace_back(src, dst, ready);
    double& free = link_free[static_cast<size_t>(src)];
    free = std::max(free, ready) + 1.5;
    return free;
  });
  EXPECT_EQ(asked, (std::vector<std::tuple<int, int, double>>{{0, 1, 1.0}, {0, 1, 2.0}, {1, 0, 5.5}, {1, 0, 8.5}}));
  EXPECT_EQ(tl.start[0], (std::vector<double>{0, 1, 7, 10}));
  EXPECT_EQ(tl.start[1], (std::vector<double>{2.5, 3.5, 5.5, 6.5}));
  EXPECT_EQ(tl.makespan, 12.0);
  // A fixed delay through the same path is the double overload's timeline.
  const Timeline fixed = timeline(Schedule::kOneFOneB, shape, secs, [](int, int, double ready) { return ready + 0.5; });
  EXPECT_EQ(fixed.start, timeline(Schedule::kOneFOneB, shape, secs, 0.5).start);
}

TEST(Schedule, ErrorsNameTheKeys) {
  auto message = [](Schedule s, PipelineShape shape) {
    try {
      validate(s, shape);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(Schedule::kInterleaved, {.stages = 4, .chunks = 2, .micro_batches = 6}).find("gradient_accumulation_steps"),
            std::string::npos);
  EXPECT_NE(message(Schedule::kOneFOneB, {.stages = 2, .chunks = 2, .micro_batches = 4}).find("model.virtual_pipeline_size"),
            std::string::npos);
  EXPECT_NE(message(Schedule::kInterleaved, {.stages = 2, .chunks = 1, .micro_batches = 4}).find("model.virtual_pipeline_size"),
            std::string::npos);
  EXPECT_THROW(parse_schedule("zb-h2"), ConfigError);
  EXPECT_EQ(parse_schedule("1f1b"), Schedule::kOneFOneB);
}

// ---- Deferred weight gradients (ZB-H1's W pass, Note [deferred weight gradients] in nn/context.h) ----

TEST(DeferredWeightGrads, LinearQueuesItsWeightGradientAndRunDeferredAddsIt) {
  nn::Linear now(6, 5), later(6, 5);
  nn::materialize(now, 4);
  nn::materialize(later, 4);
  randomize(now, 5);
  randomize(later, 5);
  Tensor x = Tensor::empty({3, 6}, DType::kF32), dy = Tensor::empty({3, 5}, DType::kF32);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
  for (int64_t i = 0; i < dy.numel(); ++i) dy.data<float>()[i] = 0.2f * static_cast<float>(i % 5) - 0.4f;
  nn::HostContext ctx;
  ctx.forward(now, x);
  Tensor dx_now = ctx.backward(now, dy);
  std::vector<nn::DeferredGrad> sink;
  ctx.forward(later, x);
  ctx.set_weight_grad_sink(&sink);
  Tensor dx_later = ctx.backward(later, dy);
  ctx.set_weight_grad_sink(nullptr);
  expect_close(dx_later, dx_now, "input gradient", 0.0);
  ASSERT_EQ(sink.size(), 1u);
  for (nn::Parameter* p : later.all_params()) {  // nothing yet: the weight and bias gradients wait
    for (float g : p->grad().f32()) ASSERT_EQ(g, 0.0f) << p->full_name();
  }
  dy.zero();  // the caller may reuse dy: the deferred gradient kept its own copy
  ctx.run_deferred(sink);
  EXPECT_TRUE(sink.empty());
  expect_close(later.all_params()[0]->grad(), now.all_params()[0]->grad(), "weight gradient", 0.0);
  expect_close(later.all_params()[1]->grad(), now.all_params()[1]->grad(), "bias gradient", 0.0);
}

TEST(DeferredWeightGrads, GradsIntactSinkKeepsDyWithoutACopy) {
  nn::Linear later(6, 5);
  nn::materialize(later, 4);
  Tensor x = Tensor::empty({3, 6}, DType::kF32), dy = Tensor::empty({3, 5}, DType::kF32);
  for (int64_t i = 0; i < dy.numel(); ++i) dy.data<float>()[i] = 0.2f * static_cast<float>(i % 5) - 0.4f;
  for (bool intact : {false, true}) {
    nn::HostContext ctx;
    ctx.forward(later, x);
    std::vector<nn::DeferredGrad> sink;
    ctx.set_weight_grad_sink(&sink, intact);
    EXPECT_EQ(ctx.weight_grad_sink_grads_intact(), intact);
    const size_t before = ctx.live_bytes(nn::MemoryUse::kGradient);
    Tensor dx = ctx.backward(later, dy);
    // The input gradient, plus dy's copy unless the model keeps its gradients intact.
    EXPECT_EQ(ctx.live_bytes(nn::MemoryUse::kGradient) - before, dx.nbytes() + (intact ? 0 : dy.nbytes())) << intact;
    ctx.set_weight_grad_sink(nullptr);
    EXPECT_FALSE(ctx.weight_grad_sink_grads_intact());
    ctx.run_deferred(sink);
  }
}

// ---- The GPT as a pipeline against nn::GptModel ----

struct Case {
  Schedule schedule;
  int chunks = 1;
  bool tied = true;
  PartitionMethod method = PartitionMethod::kParameters;
  int64_t vocab = kV;
};

// `tpg`: each stage tensor-parallel over it (pp::TpGptStage), gradients compared as slices.
void check(const comm::Group& group, const Case& c, int64_t m, const comm::Group* tpg = nullptr, bool sp = false) {
  SCOPED_TRACE(fmt::format("pp {} tp {} sp {} {} chunks {} tied {} partition {} vocab {} m {}", group.size(),
                           tpg ? tpg->size() : 1, sp, schedule_name(c.schedule), c.chunks, c.tied,
                           partition_method_name(c.method), c.vocab, m));
  const nn::GptConfig cfg = config(c.tied, c.vocab);
  const auto mbs = micro_batches(m);
  const float scale = 1.0f / static_cast<float>(m);

  nn::GptModel ref(cfg);
  nn::materialize(ref, 7);
  randomize(ref, 8, 0.3f);
  ref.set_recompute(nn::GptRecompute::every(cfg.n_layer, 1));
  nn::HostContext rctx;
  double ref_loss = 0.0;
  for (const auto& b : mbs) {
    ref_loss += rctx.forward_loss(ref, b);
    rctx.backward_loss(ref, scale);
  }
  ref_loss /= static_cast<double>(m);

  GptPipeline gpt(cfg, group,
                  {.virtual_pipeline_size = c.chunks, .pipeline = {.schedule = c.schedule}, .partition = {.method = c.method},
                   .recompute = true, .tensor_parallel_group = tpg, .sequence_parallel = sp});
  gpt.materialize(7);
  for (int ch = 0; ch < gpt.pipeline().chunks(); ++ch) randomize(gpt.pipeline().chunk(ch), 8, 0.3f);
  nn::HostContext ctx;
  const StepStats st = gpt.step(ctx, mbs, scale);
  EXPECT_NEAR(st.loss, ref_loss, 1e-5 * std::abs(ref_loss));
  EXPECT_GT(st.max_in_flight, 0);
  // The instances the pipeline held are the schedule's bound (the memory estimator reports it).
  EXPECT_EQ(st.max_in_flight,
            max_in_flight(c.schedule, {.stages = group.size(), .chunks = c.chunks, .micro_batches = m}, group.rank()));
  if (c.schedule == Schedule::kOneFOneB || c.schedule == Schedule::kZeroBubbleH1) {
    EXPECT_LE(st.max_in_flight, group.size() - group.rank());
  }
  int64_t checked = 0;
  for (nn::Parameter* p : gpt.params()) {
    nn::Parameter* r = ref.find_param(p->full_name());
    ASSERT_NE(r, nullptr) << p->full_name() << " is not a parameter of nn::GptModel";
    ASSERT_EQ(p->full_shape(), r->shape()) << p->full_name();
    expect_close(p->grad(), zs::tp::test::slice_for(*p, r->grad()), "grad of " + p->full_name());
    ++checked;
  }
  // Every parameter of the model is on some stage (the tied head's copy counted once more).
  Tensor n = Tensor::empty({1}, DType::kI32);
  n.data<int32_t>()[0] = static_cast<int32_t>(checked);
  group.allreduce(n);
  const bool copy = c.tied && group.size() * c.chunks > 1;
  EXPECT_EQ(n.data<int32_t>()[0], static_cast<int32_t>(ref.all_params().size()) + (copy ? 1 : 0));
}

TEST(GptPipeline, EveryScheduleMatchesGptModel) {
  auto& world = zs::test::world();
  std::vector<int> sizes = {world.size()};
  if (world.size() == 4) sizes.push_back(2);
  for (int p : sizes) {
    comm::Topology topo(world.group(), {.pipeline_parallel_size = p});
    const comm::Group& group = topo.pipeline_parallel();
    ASSERT_EQ(group.name(), "pp");
    for (bool tied : {true, false}) {
      check(group, {.schedule = Schedule::kAllForwardAllBackward, .tied = tied}, 4);
      check(group, {.schedule = Schedule::kOneFOneB, .tied = tied}, 4);
      check(group, {.schedule = Schedule::kOneFOneB, .tied = tied, .method = PartitionMethod::kUniform}, 3);
      // The compute partition's uneven split (5 + 3 blocks at pp 2) trains the same model.
      check(group, {.schedule = Schedule::kOneFOneB, .tied = tied, .method = PartitionMethod::kCompute, .vocab = 512}, 4);
      check(group, {.schedule = Schedule::kInterleaved, .chunks = 2, .tied = tied}, 4);
      check(group, {.schedule = Schedule::kZeroBubbleH1, .tied = tied}, 4);
    }
  }
}

// ZB-H1 moves the weight gradients (the tied head's too, off the first chunk) into W passes that run
// in micro-batch order, keeping dy itself (Note [stage gradients intact] in pp/gpt.cpp): the same
// sums in the same order as 1F1B's, so the same bits.
TEST(GptPipeline, ZeroBubbleGradientsEqualOneFOneBBitForBit) {
  auto& world = zs::test::world();
  comm::Topology topo(world.group(), {.pipeline_parallel_size = world.size()});
  const comm::Group& group = topo.pipeline_parallel();
  for (bool tied : {true, false}) {
    const nn::GptConfig cfg = config(tied);
    const auto mbs = micro_batches(5);
    std::vector<std::vector<float>> grads[2];
    for (int k = 0; k < 2; ++k) {
      GptPipeline gpt(cfg, group, {.pipeline = {.schedule = k == 0 ? Schedule::kOneFOneB : Schedule::kZeroBubbleH1}});
      gpt.materialize(7);
      for (int ch = 0; ch < gpt.pipeline().chunks(); ++ch) randomize(gpt.pipeline().chunk(ch), 8, 0.3f);
      nn::HostContext ctx;
      gpt.step(ctx, mbs, 0.2f);
      for (nn::Parameter* p : gpt.params()) {
        const auto g = p->grad().f32();
        grads[k].emplace_back(g.begin(), g.end());
      }
    }
    ASSERT_EQ(grads[0].size(), grads[1].size());
    for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_EQ(grads[0][i], grads[1][i]) << "parameter " << i << " tied " << tied;
  }
}

TEST(GptPipeline, TensorParallelStagesMatchGptModel) {
  auto& world = zs::test::world();
  if (world.size() % 2 != 0) GTEST_SKIP() << "needs tp = 2";
  const int p = world.size() / 2;  // np 2: pp 1 x tp 2; np 4: pp 2 x tp 2
  comm::Topology topo(world.group(), {.tensor_parallel_size = 2, .pipeline_parallel_size = p});
  ASSERT_EQ(topo.tensor_parallel().name(), "tp");
  for (bool sp : {false, true}) {
    for (bool tied : {true, false}) {
      check(topo.pipeline_parallel(), {.schedule = Schedule::kOneFOneB, .tied = tied}, 4, &topo.tensor_parallel(), sp);
    }
    check(topo.pipeline_parallel(), {.schedule = Schedule::kInterleaved, .chunks = 2}, 4, &topo.tensor_parallel(), sp);
    check(topo.pipeline_parallel(), {.schedule = Schedule::kZeroBubbleH1}, 4, &topo.tensor_parallel(), sp);
  }
}

TEST(GptPipeline, ParametersKeepGptModelNamesAndInit) {
  auto& world = zs::test::world();
  comm::Topology topo(world.group(), {.pipeline_parallel_size = world.size()});
  for (bool tied : {true, false}) {
    nn::GptModel ref(config(tied));
    nn::materialize(ref, 3);
    GptPipeline gpt(config(tied), topo.pipeline_parallel(), {});
    gpt.materialize(3);
    for (nn::Parameter* p : gpt.params()) {
      nn::Parameter* r = ref.find_param(p->full_name());
      ASSERT_NE(r, nullptr) << p->full_name();
      expect_close(p->data(), r->data(), "initial " + p->full_name(), 0.0);
    }
  }
}

TEST(GptPipeline, MismatchedMicroBatchCountsFailOnEveryRank) {
  auto& world = zs::test::world();
  if (world.size() == 1) GTEST_SKIP() << "needs two stages";
  comm::Topology topo(world.group(), {.pipeline_parallel_size = world.size()});
  GptPipeline gpt(config(true), topo.pipeline_parallel(), {});
  gpt.materialize(3);
  nn::HostContext ctx;
  const auto mbs = micro_batches(world.rank() == 0 ? 3 : 4);
  try {
    gpt.step(ctx, mbs, 0.25f);
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("gradient_accumulation_steps"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zs::pp
