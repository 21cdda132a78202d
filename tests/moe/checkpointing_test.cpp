// Activation checkpointing of GPT-MoE blocks (nn/module.h, "Activation checkpointing"): the gate's
// random draws (RSample noise, random token selection, Jitter) are keyed by the micro-batch's place in
// the global batch (nn::BatchPosition), which the re-run inside a checkpointed block's backward shares
// with its forward, so it routes every token as the forward did, and training is the same.
#include <gtest/gtest.h>

#include <vector>

#include "moe/gpt_moe.h"
#include "nn/data.h"
#include "nn/host_context.h"

namespace zs::moe {
namespace {

struct Result {
  std::vector<float> losses;
  std::vector<std::vector<float>> grads;
  int64_t recomputes = 0;
};

Result train(NoisyGatePolicy policy, bool checkpointed) {
  GptMoeConfig cfg{.gpt = {.n_layer = 2, .d_model = 32, .n_head = 4, .seq_len = 16, .vocab_size = 256, .tied_embeddings = false},
                   .moe = {.num_experts = 4, .k = 2, .capacity_factor = 1.0, .noisy_gate_policy = policy, .rng_seed = 9},
                   .every_n_layers = 1};
  GptMoeModel model(cfg);
  nn::materialize(model, 4);
  for (nn::Module* m : model.named_modules()) {
    if (m->name() == "blocks.0" || m->name() == "blocks.1") m->set_recomputed(checkpointed);
  }
  nn::Dataset data = nn::Dataset::builtin(16);
  nn::HostContext ctx;
  Result r;
  for (int64_t pass = 0; pass < 3; ++pass) {  // the noise key changes every step
    nn::Batch batch;
    data.fill_batch(batch, 2, static_cast<uint64_t>(pass), 0, 4);
    ctx.set_batch_position({.step = pass, .first_sample = 0, .samples = 4});
    r.losses.push_back(ctx.forward_loss(model, batch));
    ctx.backward_loss(model, 1.0f);
  }
  model.visit_params([&](nn::Parameter& p) {
    const float* g = p.grad().data<float>();
    r.grads.emplace_back(g, g + p.numel());
  });
  r.recomputes = ctx.recompute_stats().modules;
  return r;
}

TEST(MoECheckpointing, NoisyGatingReplaysInTheRecompute) {
  for (NoisyGatePolicy policy : {NoisyGatePolicy::kRSample, NoisyGatePolicy::kJitter}) {
    SCOPED_TRACE(std::string(noisy_gate_policy_name(policy)));
    const Result plain = train(policy, false);
    const Result ckpt = train(policy, true);
    EXPECT_EQ(plain.recomputes, 0);
    EXPECT_EQ(ckpt.recomputes, 6);
    EXPECT_EQ(plain.losses, ckpt.losses);
    EXPECT_EQ(plain.grads, ckpt.grads);
  }
}

}  // namespace
}  // namespace zs::moe
