// Shared by the engine's MPI equivalence tests: a tiny GPT whose flat layout splits unevenly over 2, 3
// and 4 ranks, a config builder, and a training run that records losses and two parameters.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/dataset_source.h"
#include "engine/engine.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "optim/adam.h"
#include "run/run_config.h"

namespace zs::engine::test_harness {

inline constexpr int64_t kGlobalBatch = 36;  // accumulation 1 and 3 divide it at every world size 1-4
inline constexpr int kSteps = 12;

// d_model 33, 3 heads: the flat layout has 1151 blocks of 32 elements, which split evenly over none of 2, 3, 4 ranks
// (checked by LayoutSplitsUnevenly), so every shard-boundary case is exercised.
inline nn::GptConfig tiny_gpt() { return {.n_layer = 2, .d_model = 33, .n_head = 3, .seq_len = 16, .vocab_size = 256}; }

inline zs::run::RunConfig make_config(int64_t accumulation, int world, Precision precision, int stage) {
  zs::run::RunConfig c;
  c.batch = resolve_batch(kGlobalBatch, 0, accumulation, world);
  c.precision = precision;
  c.zero.stage = stage;
  c.zero.reduce_bucket_size = 3000;                 // many buckets, so reductions overlap backward
  c.zero.allgather_bucket_size = 5000;
  c.zero.stage3_prefetch_bucket_size = 4000;        // a prefetch window of a few modules
  c.zero.stage3_param_persistence_threshold = 100;  // the LayerNorms stay gathered
  c.optimizer = OptimizerConfig("AdamW", optim::AdamConfig{.lr = 3e-3, .weight_decay = 0.1});
  c.gradient_clipping = 1.0;
  c.scheduler = {.type = optim::ScheduleType::kWarmupLR, .warmup_min_lr = 0.0, .warmup_max_lr = 3e-3,
                 .warmup_num_steps = 5, .warmup_type = optim::WarmupType::kLinear};
  c.device.memory_mb = 64;
  c.seed = 42;
  c.model = tiny_gpt();
  // A scale that cannot overflow these gradients: with 2^16, whether a micro-batch overflows depends on
  // how the batch is split, and a skipped step changes the whole trajectory (fp16 working as designed;
  // LossScaler's own tests cover skipping).
  c.loss_scaler.initial_scale_power = 8;
  return c;
}

struct RunResult {
  std::vector<double> losses;
  int skipped = 0;
  std::string initial_digest;
  std::vector<float> wte;  // the largest parameter, compared element by element
  std::vector<float> qkv;  // a parameter spanning shard boundaries
  Engine::MemoryReport memory;
  std::vector<StepReport> reports;
  std::string final_digest;
};

inline RunResult train(const comm::Group& group, const zs::run::RunConfig& cfg, int steps = kSteps) {
  nn::GptModel model(*cfg.model);
  Engine engine(model, cfg, group);
  DatasetSource source(nn::Dataset::builtin(tiny_gpt().seq_len), 7);
  RunResult r;
  r.initial_digest = engine.param_digest();
  for (int i = 0; i < steps; ++i) {
    const StepReport& report = engine.train_batch(source);
    r.losses.push_back(report.loss);
    r.skipped += report.skipped;
    r.reports.push_back(report);
  }
  r.wte = engine.fp32_param("wte");
  r.qkv = engine.fp32_param("blocks.1.attn.qkv.weight");
  r.memory = engine.memory_report();
  r.final_digest = engine.param_digest();
  return r;
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]));
  return worst;
}

inline void expect_matches(const RunResult& got, const RunResult& ref, double loss_rtol, double param_atol, const std::string& what) {
  EXPECT_EQ(got.skipped, ref.skipped) << what;
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], ref.losses[i], loss_rtol * std::abs(ref.losses[i])) << what << ", step " << i + 1;
  }
  ASSERT_EQ(got.wte.size(), ref.wte.size());
  EXPECT_LE(max_abs_diff(got.wte, ref.wte), param_atol) << what << ": largest wte difference";
  EXPECT_LE(max_abs_diff(got.qkv, ref.qkv), param_atol) << what << ": largest blocks.1.attn.qkv.weight difference";
}

}  // namespace zs::engine::test_harness
