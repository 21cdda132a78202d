// Model FLOPs per step (StepReport::model_flops, nn/flops.h): the kernels' count equals nn's analytic
// gpt_train_flops_per_token x tokens exactly where attention computes its whole T x T (seq_len <= 64,
// one causal panel), and that count with attention's causal panels (Note [causal panels] in
// nn/attention.cpp; the fused attention's query blocks cover the same area) beyond; recomputation
// (checkpointed blocks' re-runs, the fused attention's backward recomputing its scores, the plain
// kernel's selective score recompute) is counted apart and leaves the model's figure unchanged; fp32
// and bf16 alike.
#include <gtest/gtest.h>

#include <algorithm>

#include "comm/world.h"
#include "engine/dataset_source.h"
#include "engine/engine.h"
#include "engine/summary.h"
#include "nn/data.h"
#include "nn/flops.h"
#include "nn/gpt.h"
#include "run/run_config.h"

namespace zs::engine {
namespace {

using Blocks = RecomputeConfig::Blocks;

constexpr int64_t kMicro = 2, kAccumulation = 2;

zs::run::RunConfig config(int64_t seq_len, Precision precision,
                          nn::AttentionKernel attention = nn::AttentionKernel::kFused) {
  zs::run::RunConfig c;
  c.batch = resolve_batch(0, kMicro, kAccumulation, 1);
  c.precision = precision;
  c.model = nn::GptConfig{
      .n_layer = 2, .d_model = 32, .n_head = 2, .seq_len = seq_len, .vocab_size = 256, .attention = attention};
  c.device.memory_mb = 64;
  return c;
}

// Sum over attention's causal panels of rows x columns computed (Note [causal panels]): T^2 for one panel.
double causal_area(int64_t T) {
  double area = 0;
  for (int64_t r0 = 0; r0 < T; r0 += 64) {
    const int64_t r1 = std::min(T, r0 + 64);
    area += static_cast<double>((r1 - r0) * r1);
  }
  return area;
}

struct Counted {
  uint64_t model = 0, recomputed = 0;
};

Counted one_step(const zs::run::RunConfig& cfg, int steps = 2) {
  comm::World world(comm::World::Launch::kLocal);
  nn::GptModel model(*cfg.model);
  Engine engine(model, cfg, world.group());
  DatasetSource source(nn::Dataset::builtin(cfg.model->seq_len), 7);
  Counted c;
  for (int i = 0; i < steps; ++i) {
    // An evaluation between steps is not the next step's work.
    if (i > 0) engine.eval_batch(source, 0);
    const StepReport& r = engine.train_batch(source);
    if (i > 0) {
      EXPECT_EQ(r.model_flops, c.model) << "every step the same";
      EXPECT_EQ(r.recompute_flops, c.recomputed);
    }
    c = {r.model_flops, r.recompute_flops};
  }
  return c;
}

class ModelFlops : public ::testing::TestWithParam<Precision> {};

TEST_P(ModelFlops, EqualTheAnalyticCountWhereAttentionIsOnePanel) {
  const zs::run::RunConfig cfg = config(64, GetParam());
  const double tokens = static_cast<double>(kMicro * kAccumulation * 64);
  const Counted c = one_step(cfg);
  EXPECT_EQ(static_cast<double>(c.model), nn::gpt_train_flops_per_token(*cfg.model, 64) * tokens);
  // The fused attention's backward recomputes q k^T (2 x hs per score, summed over heads: 2 C).
  EXPECT_EQ(static_cast<double>(c.recomputed), 2.0 * kMicro * kAccumulation * 2 * 32 * causal_area(64));
  const Counted plain = one_step(config(64, GetParam(), nn::AttentionKernel::kPlain));
  EXPECT_EQ(plain.model, c.model);
  EXPECT_EQ(plain.recomputed, 0u);
}

TEST_P(ModelFlops, CountCausalPanelsBeyondOne) {
  const zs::run::RunConfig cfg = config(192, GetParam());
  const nn::GptConfig& g = *cfg.model;
  const double C = 32, L = 2, T = 192, sequences = kMicro * kAccumulation, tokens = sequences * T;
  const double n_matmul = L * 12 * C * C + 256 * C;
  // Per layer and sequence: 2 forward and 4 backward products over the causal area, each 2 x hs per
  // element, summed over heads (hs x H = C).
  const double attention = L * sequences * 12 * C * causal_area(192);
  const Counted c = one_step(cfg);
  EXPECT_EQ(static_cast<double>(c.model), 6 * n_matmul * tokens + attention);
  // The analytic count credits the full T x T: 3 panels compute (3 + 1) / (2 x 3) of it.
  const double full = nn::gpt_train_flops_per_token(g, 192) * tokens;
  EXPECT_EQ(full - static_cast<double>(c.model), L * sequences * 12 * C * (T * T - causal_area(192)));
  EXPECT_EQ(causal_area(192) / (T * T), 4.0 / 6.0);
}

TEST_P(ModelFlops, RecomputationIsCountedApart) {
  const double C = 32, L = 2, sequences = kMicro * kAccumulation, tokens = sequences * 128;
  // A block's forward: its four linears (2 x 12 C^2 per token) and attention's q k^T and P v.
  const double block_forward = L * (2 * 12 * C * C * tokens + sequences * 4 * C * causal_area(128));
  const double scores = L * sequences * 2 * C * causal_area(128);  // q k^T of every layer
  {
    zs::run::RunConfig cfg = config(128, GetParam());  // fused: its backward recomputes the scores
    const Counted fused = one_step(cfg);
    EXPECT_EQ(static_cast<double>(fused.recomputed), scores);
    cfg.recompute.blocks = Blocks::kEvery;
    const Counted every = one_step(cfg);
    EXPECT_EQ(every.model, fused.model);
    EXPECT_EQ(static_cast<double>(every.recomputed), block_forward + scores);
  }
  zs::run::RunConfig cfg = config(128, GetParam(), nn::AttentionKernel::kPlain);
  const Counted plain = one_step(cfg);
  EXPECT_EQ(plain.recomputed, 0u);
  cfg.recompute.blocks = Blocks::kEvery;  // every block re-runs its forward in backward
  const Counted every = one_step(cfg);
  EXPECT_EQ(every.model, plain.model);
  EXPECT_EQ(static_cast<double>(every.recomputed), block_forward);
  cfg.recompute.blocks = Blocks::kSelective;  // attention recomputes q k^T only
  const Counted selective = one_step(cfg);
  EXPECT_EQ(selective.model, plain.model);
  EXPECT_EQ(static_cast<double>(selective.recomputed), L * sequences * 2 * C * causal_area(128));
}

INSTANTIATE_TEST_SUITE_P(Precisions, ModelFlops, ::testing::Values(Precision::kFp32, Precision::kBf16),
                         [](const auto& info) { return std::string(precision_name(info.param)); });

TEST(Mfu, SummaryRelatesTheStepsToTheProbedPeak) {
  const zs::run::RunConfig cfg = config(64, Precision::kFp32);
  comm::World world(comm::World::Launch::kLocal);
  nn::GptModel model(*cfg.model);
  Engine engine(model, cfg, world.group());
  DatasetSource source(nn::Dataset::builtin(64), 7);
  SummaryRecorder rec(engine);
  for (int i = 0; i < 3; ++i) {
    const StepReport& r = engine.train_batch(source);
    rec.record(r, 0.5, kMicro * kAccumulation * 64);  // a fixed step time: the figures are exact
  }
  const boost::json::object s = rec.build(world.counters());
  const boost::json::object& m = s.at("mfu").as_object();
  const double flops = nn::gpt_train_flops_per_token(*cfg.model, 64) * kMicro * kAccumulation * 64;
  const memory::PeakFlops& peak = nn::product_peak(memory::DType::kF32);
  EXPECT_EQ(m.at("model_flops_per_step").as_double(), flops);
  // The fused attention's backward recomputes q k^T: 2 layers x 4 sequences x 2 C x 64^2.
  EXPECT_EQ(m.at("recompute_flops_per_step").as_double(), 2.0 * kMicro * kAccumulation * 2 * 32 * 64 * 64);
  EXPECT_DOUBLE_EQ(m.at("achieved_flops_per_s").as_double(), flops / 0.5);
  EXPECT_EQ(m.at("peak_flops_per_s").as_double(), static_cast<double>(static_cast<uint64_t>(peak.flops_per_s)));
  EXPECT_NEAR(m.at("mfu").as_double(), flops / 0.5 / peak.flops_per_s, 1e-9);
  EXPECT_NEAR(rec.mfu(), flops / 0.5 / peak.flops_per_s, 1e-9);
  EXPECT_EQ(m.at("peak").at("kind").as_string(), "fp32 FMA");
  EXPECT_EQ(m.at("peak").at("threads_per_rank").as_int64(), peak.threads);
}

}  // namespace
}  // namespace zs::engine
