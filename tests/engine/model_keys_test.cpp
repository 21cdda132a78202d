// DeepSpeed's model-side sections under the engine (2 ranks): progressive_layer_drop and
// sparse_attention give the losses of one process training the same model on the whole batch at
// stage 0 - at ZeRO-3 (whose recorded module order a dropped block must keep, Context::skip_forward)
// and with the tensor-parallel GPT and LLaMA (a layout per head: each rank reads its own heads' layouts).
// And each key changes training (the runs differ from the same runs without it).
#include <gtest/gtest.h>

#include <memory>

#include "comm/topology.h"
#include "nn/llama.h"
#include "tests/engine/train_harness.h"
#include "tests/support/mpi_test_env.h"
#include "tp/gpt.h"
#include "tp/llama.h"

namespace zs::engine {
namespace {

using namespace test_harness;

constexpr int kRunSteps = 4;

const nn::ProgressiveLayerDrop kDrop{.enabled = true, .theta = 0.2, .gamma = 0.5, .seed = 42};
// 4-position blocks on 16-token sequences: 4 block rows, windows of 2, a global pattern per head.
const nn::SparseAttentionConfig kSparse{.mode = nn::SparsityMode::kFixed, .block = 4, .different_layout_per_head = true,
                                        .num_local_blocks = 2, .num_different_global_patterns = 2};

std::vector<double> losses_of(nn::Model& model, const comm::Group& dp, const comm::Group* tp, run::RunConfig cfg) {
  cfg.model.reset();
  std::unique_ptr<Engine> engine = tp != nullptr ? std::make_unique<Engine>(model, cfg, dp, *tp)
                                                 : std::make_unique<Engine>(model, cfg, dp);
  DatasetSource source(nn::Dataset::builtin(16), 7);
  std::vector<double> losses;
  for (int i = 0; i < kRunSteps; ++i) losses.push_back(engine->train_batch(source).loss);
  return losses;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& ref, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], 1e-5 * std::abs(ref[i])) << what << ", step " << i + 1;
}

bool differs(const std::vector<double>& a, const std::vector<double>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::abs(a[i] - b[i]) > 1e-4 * std::abs(b[i])) return true;
  }
  return false;
}

comm::Group self_group() { return test::world().group().split(test::world().group().rank(), 0, "self"); }

TEST(ModelKeys, LayerDropAtZero3MatchesSingleProcessStage0) {
  const comm::Group& world = test::world().group();
  nn::GptConfig g = tiny_gpt();
  g.n_layer = 3;
  int dropped = 0;
  for (int64_t step = 1; step < kRunSteps; ++step) {
    for (int64_t b = 0; b < 3; ++b) dropped += kDrop.keeps(b, 3, step) ? 0 : 1;
  }
  ASSERT_GT(dropped, 0) << "the schedule drops nothing in these steps: the test would not see it";
  const nn::GptConfig plain = g;
  g.layer_drop = kDrop;
  const comm::Group self = self_group();
  nn::GptModel ref_model(g), plain_model(plain), model(g);
  const auto ref = losses_of(ref_model, self, nullptr, make_config(1, 1, Precision::kFp32, 0));
  const auto without = losses_of(plain_model, self, nullptr, make_config(1, 1, Precision::kFp32, 0));
  const auto got = losses_of(model, world, nullptr, make_config(1, world.size(), Precision::kFp32, 3));
  expect_close(got, ref, "stage 3 with layer drop");
  EXPECT_TRUE(differs(ref, without)) << "dropping blocks changed no loss";
}

TEST(ModelKeys, SparseTensorParallelGptMatchesSingleProcess) {
  static comm::Topology topology(test::world().group(), {.tensor_parallel_size = 2});
  nn::GptConfig g{.n_layer = 2, .d_model = 32, .n_head = 4, .seq_len = 16, .vocab_size = 256};
  const nn::GptConfig dense = g;
  g.sparse_attention = kSparse;
  const comm::Group self = self_group();
  nn::GptModel ref_model(g), dense_model(dense);
  tp::GptModel model(g, {.tensor_parallel_size = 2}, &topology.tensor_parallel());
  const auto ref = losses_of(ref_model, self, nullptr, make_config(1, 1, Precision::kFp32, 0));
  const auto without = losses_of(dense_model, self, nullptr, make_config(1, 1, Precision::kFp32, 0));
  const auto got = losses_of(model, topology.data_parallel(), &topology.tensor_parallel(),
                             make_config(1, topology.data_parallel().size(), Precision::kFp32, 2));
  expect_close(got, ref, "tp 2 GPT with a sparse layout");
  EXPECT_TRUE(differs(ref, without)) << "the sparse layout changed no loss";
}

TEST(ModelKeys, SparseLayerDropTensorParallelLlamaMatchesSingleProcess) {
  static comm::Topology topology(test::world().group(), {.tensor_parallel_size = 2});
  nn::LlamaConfig l{.n_layer = 3, .d_model = 32, .n_head = 4, .n_kv_head = 2, .d_ff = 48, .max_seq_len = 16,
                    .vocab_size = 256, .norm_eps = 1e-5f};
  l.sparse_attention = kSparse;
  l.layer_drop = kDrop;
  const comm::Group self = self_group();
  nn::LlamaModel ref_model(l);
  tp::LlamaModel model(l, &topology.tensor_parallel());
  const auto ref = losses_of(ref_model, self, nullptr, make_config(1, 1, Precision::kFp32, 0));
  const auto got = losses_of(model, topology.data_parallel(), &topology.tensor_parallel(),
                             make_config(1, topology.data_parallel().size(), Precision::kFp32, 3));
  expect_close(got, ref, "tp 2 LLaMA with a sparse layout and layer drop, stage 3");
}

}  // namespace
}  // namespace zs::engine
