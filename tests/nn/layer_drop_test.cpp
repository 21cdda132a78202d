// Progressive layer drop (nn/layer_drop.h): DeepSpeed's schedule theta(t) and the per-block keep
// probability, the draws' frequencies and determinism, and a GPT and a LLaMA whose dropped block passes
// its input through: at a step that drops block 1 of 2, the loss and every gradient equal those of the
// model with block 1 left out (the dropped block's parameters get zero gradients); in evaluation no
// block is dropped.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/host_context.h"
#include "nn/layer_drop.h"
#include "nn/llama.h"

namespace zs::nn {
namespace {

TEST(ProgressiveLayerDrop, ScheduleFollowsDeepSpeed) {
  const ProgressiveLayerDrop p{.enabled = true, .theta = 0.5, .gamma = 0.001};
  EXPECT_DOUBLE_EQ(p.theta_at(0), 1.0);
  EXPECT_NEAR(p.theta_at(1000), 0.5 * std::exp(-1.0) + 0.5, 1e-15);
  EXPECT_NEAR(p.theta_at(1000000), 0.5, 1e-12);
  EXPECT_DOUBLE_EQ(p.keep_probability(0, 4, 0), 1.0);  // step 0 keeps everything
  EXPECT_NEAR(p.keep_probability(3, 4, 1000000), 0.5, 1e-12);   // the last block: theta
  EXPECT_NEAR(p.keep_probability(1, 4, 1000000), 0.75, 1e-12);  // 1 - 2/4 (1 - theta)
}

TEST(ProgressiveLayerDrop, DrawsAreDeterministicAndHaveTheirProbability) {
  const ProgressiveLayerDrop p{.enabled = true, .theta = 0.4, .gamma = 1.0, .seed = 3};
  ProgressiveLayerDrop other = p;
  other.seed = 4;
  int kept_last = 0, kept_first = 0, differ = 0;
  const int n = 20000;
  for (int64_t step = 100; step < 100 + n; ++step) {
    kept_last += p.keeps(3, 4, step) ? 1 : 0;
    kept_first += p.keeps(0, 4, step) ? 1 : 0;
    EXPECT_EQ(p.keeps(2, 4, step), p.keeps(2, 4, step));
    differ += p.keeps(3, 4, step) != other.keeps(3, 4, step) ? 1 : 0;
  }
  EXPECT_NEAR(kept_last / double(n), 0.4, 0.02);
  EXPECT_NEAR(kept_first / double(n), 0.85, 0.02);
  EXPECT_GT(differ, n / 10);  // another seed, other draws
  EXPECT_TRUE(ProgressiveLayerDrop{}.keeps(3, 4, 12345));  // off: every block runs
}

// The first step >= 10 at which `p` keeps block 0 and drops block 1 of 2.
int64_t step_dropping_block1(const ProgressiveLayerDrop& p) {
  for (int64_t s = 10; s < 1000; ++s) {
    if (p.keeps(0, 2, s) && !p.keeps(1, 2, s)) return s;
  }
  ADD_FAILURE() << "no step drops block 1 only";
  return 0;
}

struct Pass {
  float loss = 0.0f;
  std::vector<std::pair<std::string, std::vector<float>>> grads;
};

// One forward and backward at `step`; the two-block model's blocks.1 gradients must be zero, and
// are left out of the result so it compares with the one-block model's.
Pass run(Model& model, const Batch& batch, int64_t step, bool training = true) {
  HostContext ctx(training);
  ctx.set_batch_position({.step = step});
  Pass r;
  r.loss = ctx.forward_loss(model, batch);
  if (!training) return r;
  zero_grads(model);
  ctx.backward_loss(model, 1.0f);
  model.visit_params([&](Parameter& p) {
    std::vector<float> g(p.grad().f32().begin(), p.grad().f32().end());
    if (p.full_name().rfind("blocks.1.", 0) == 0) {
      for (float v : g) EXPECT_EQ(v, 0.0f) << p.full_name();
      return;
    }
    r.grads.emplace_back(p.full_name(), std::move(g));
  });
  return r;
}

template <typename M, typename C>
void check_dropped_block_is_left_out(C two) {
  two.layer_drop = {.enabled = true, .theta = 0.3, .gamma = 0.5, .seed = 11};
  C one = two;
  one.n_layer = 1;
  one.layer_drop = {};
  M a(two), b(one);
  materialize(a, 5);
  materialize(b, 5);
  // b's parameters are a's of the same name.
  b.visit_params([&](Parameter& p) { p.data().copy_from(a.find_param(p.full_name())->data()); });
  Batch batch;
  Dataset::builtin(16).fill_batch(batch, 1, 0, 0, 3);
  const int64_t step = step_dropping_block1(two.layer_drop);
  const Pass da = run(a, batch, step), db = run(b, batch, step);
  EXPECT_EQ(da.loss, db.loss);
  ASSERT_EQ(da.grads.size(), db.grads.size());
  for (size_t i = 0; i < da.grads.size(); ++i) {
    EXPECT_EQ(da.grads[i].first, db.grads[i].first);
    EXPECT_EQ(da.grads[i].second, db.grads[i].second) << da.grads[i].first;
  }
  // Evaluation runs both blocks: not the one-block loss.
  EXPECT_NE(run(a, batch, step, false).loss, run(b, batch, step, false).loss);
}

TEST(ProgressiveLayerDrop, GptDroppedBlockPassesItsInputThrough) {
  check_dropped_block_is_left_out<GptModel>(
      GptConfig{.n_layer = 2, .d_model = 32, .n_head = 4, .seq_len = 16, .vocab_size = 256});
}

TEST(ProgressiveLayerDrop, LlamaDroppedBlockPassesItsInputThrough) {
  check_dropped_block_is_left_out<LlamaModel>(LlamaConfig{
      .n_layer = 2, .d_model = 32, .n_head = 4, .n_kv_head = 2, .d_ff = 48, .max_seq_len = 16, .vocab_size = 256});
}

}  // namespace
}  // namespace zs::nn
