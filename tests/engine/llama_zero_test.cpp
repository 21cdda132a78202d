// LLaMA (nn/llama.h) under the engine: every ZeRO stage, with and without activation recompute, gives
// the losses and weights of one process training on the whole global batch at stage 0 (the property
// equivalence_test.cpp checks for the GPT), and bf16 storage tracks it within bf16 rounding.
#include <gtest/gtest.h>

#include <map>

#include "nn/llama.h"
#include "tests/engine/train_harness.h"
#include "tests/support/mpi_test_env.h"

namespace zs::engine {
namespace {

using namespace test_harness;

// d_model 36 in 6 heads of 6 over 2 kv heads, d_ff 50: a flat layout that splits unevenly over 2-4 ranks.
nn::LlamaConfig tiny_llama() {
  return {.n_layer = 2, .d_model = 36, .n_head = 6, .n_kv_head = 2, .d_ff = 50, .max_seq_len = 16, .vocab_size = 256,
          .norm_eps = 1e-5f};
}

constexpr int kLlamaSteps = 6;

struct LlamaRun {
  std::vector<double> losses;
  std::vector<float> q, k, ln;  // parameters spanning shard boundaries
  std::string digest;
};

LlamaRun train_llama(const comm::Group& group, run::RunConfig cfg, const nn::GptRecompute& recompute = {}) {
  nn::LlamaModel model(tiny_llama());
  model.set_recompute(recompute);
  cfg.model.reset();
  Engine engine(model, cfg, group);
  DatasetSource source(nn::Dataset::builtin(tiny_llama().max_seq_len), 7);
  LlamaRun r;
  for (int i = 0; i < kLlamaSteps; ++i) r.losses.push_back(engine.train_batch(source).loss);
  r.q = engine.fp32_param("blocks.1.attn.q.weight");
  r.k = engine.fp32_param("blocks.0.attn.k.weight");
  r.ln = engine.fp32_param("blocks.1.ln2.weight");
  r.digest = engine.param_digest();
  return r;
}

const LlamaRun& reference(Precision precision) {
  static std::map<Precision, LlamaRun> cache;
  auto it = cache.find(precision);
  if (it != cache.end()) return it->second;
  const comm::Group& world = test::world().group();
  comm::Group self = world.split(world.rank(), 0, "self");
  return cache[precision] = train_llama(self, make_config(1, 1, precision, 0));
}

void expect_llama_matches(const LlamaRun& got, const LlamaRun& ref, double loss_rtol, double param_atol,
                          const std::string& what) {
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], ref.losses[i], loss_rtol * std::abs(ref.losses[i])) << what << ", step " << i + 1;
  }
  EXPECT_LE(max_abs_diff(got.q, ref.q), param_atol) << what << ": blocks.1.attn.q.weight";
  EXPECT_LE(max_abs_diff(got.k, ref.k), param_atol) << what << ": blocks.0.attn.k.weight";
  EXPECT_LE(max_abs_diff(got.ln, ref.ln), param_atol) << what << ": blocks.1.ln2.weight";
}

TEST(LlamaZero, EveryStageMatchesSingleProcessStage0) {
  const comm::Group& world = test::world().group();
  const LlamaRun& ref = reference(Precision::kFp32);
  EXPECT_LT(ref.losses.back(), ref.losses.front()) << "the reference run must learn something";
  for (int stage = 0; stage <= 3; ++stage) {
    for (int64_t accumulation : {1, 3}) {
      expect_llama_matches(train_llama(world, make_config(accumulation, world.size(), Precision::kFp32, stage)), ref, 1e-5,
                           1e-5, fmt::format("stage {} np {} accumulation {}", stage, world.size(), accumulation));
    }
  }
}

TEST(LlamaZero, RecomputeChangesNothing) {
  const comm::Group& world = test::world().group();
  const LlamaRun plain = train_llama(world, make_config(1, world.size(), Precision::kFp32, 3));
  for (const nn::GptRecompute& r : {nn::GptRecompute::every(2, 1), nn::GptRecompute::scores_only()}) {
    const LlamaRun got = train_llama(world, make_config(1, world.size(), Precision::kFp32, 3), r);
    EXPECT_EQ(got.losses, plain.losses) << r.describe();
    EXPECT_EQ(got.digest, plain.digest) << r.describe();
  }
}

TEST(LlamaZero, Bf16TracksItsSingleProcessRun) {
  const comm::Group& world = test::world().group();
  for (int stage : {0, 3}) {
    expect_llama_matches(train_llama(world, make_config(1, world.size(), Precision::kBf16, stage)),
                         reference(Precision::kBf16), 5e-3, 2e-2, fmt::format("bf16 stage {}", stage));
  }
}

}  // namespace
}  // namespace zs::engine
