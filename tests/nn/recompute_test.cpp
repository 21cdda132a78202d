// Activation recomputation (DeepSpeed: activation checkpointing) through the Context (nn/module.h, Note
// [activation recomputation] in nn/context.cpp): checkpointed and selective-recompute GPTs compute the same
// loss and gradients as the plain one, keep only their blocks' inputs (the activation peak grows by one
// input per block instead of one block's activations), re-run each checkpointed module once per backward,
// and a user's own module marked checkpointed trains the same.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/host_context.h"
#include "nn/transformer.h"

namespace zs::nn {
namespace {

constexpr int64_t kB = 2, kT = 32;

GptConfig config(int64_t n_layer, AttentionKernel attention = AttentionKernel::kFused) {
  return {.n_layer = n_layer, .d_model = 32, .n_head = 4, .seq_len = kT, .vocab_size = 256, .attention = attention};
}

struct Pass {
  float loss = 0.0f;
  std::vector<std::vector<float>> grads;  // every parameter, canonical order
  size_t activation_peak = 0;
  int64_t recomputes = 0;
};

Pass run(int64_t n_layer, const GptRecompute& r, int micro_batches = 2,
         AttentionKernel attention = AttentionKernel::kFused) {
  GptModel model(config(n_layer, attention));
  materialize(model, 3);
  model.set_recompute(r);
  Dataset data = Dataset::builtin(kT);
  HostContext ctx;
  Pass p;
  for (int m = 0; m < micro_batches; ++m) {  // gradients accumulate over the micro-batches
    Batch batch;
    data.fill_batch(batch, 5, 0, static_cast<uint64_t>(m * kB), kB);
    p.loss += ctx.forward_loss(model, batch);
    ctx.backward_loss(model, 0.5f);
  }
  model.visit_params([&](Parameter& prm) {
    const float* g = prm.grad().data<float>();
    p.grads.emplace_back(g, g + prm.numel());
  });
  p.activation_peak = ctx.peak_bytes(MemoryUse::kActivation);
  p.recomputes = ctx.recompute_stats().modules;
  return p;
}

void expect_same(const Pass& a, const Pass& b) {
  EXPECT_NEAR(a.loss, b.loss, 1e-6f);
  ASSERT_EQ(a.grads.size(), b.grads.size());
  double worst = 0.0;
  for (size_t i = 0; i < a.grads.size(); ++i) {
    for (size_t j = 0; j < a.grads[i].size(); ++j) worst = std::max(worst, std::abs(double(a.grads[i][j]) - b.grads[i][j]));
  }
  EXPECT_LE(worst, 1e-6);
}

TEST(Recompute, RecomputeGivesTheSameLossAndGradientsWithThePlainKernel) {
  const Pass plain = run(3, GptRecompute::none(), 2, AttentionKernel::kPlain);
  for (const GptRecompute& r : {GptRecompute::every(3, 1), GptRecompute::scores_only()}) {
    SCOPED_TRACE(r.describe());
    const Pass p = run(3, r, 2, AttentionKernel::kPlain);
    expect_same(plain, p);
    EXPECT_EQ(p.recomputes, 2 * r.count());
  }
}

TEST(Recompute, RecomputeGivesTheSameLossAndGradients) {
  const Pass plain = run(3, GptRecompute::none());
  EXPECT_EQ(plain.recomputes, 0);
  for (const GptRecompute& r : {GptRecompute::every(3, 1), GptRecompute::every(3, 2), GptRecompute::first(3, 1),
                                GptRecompute::scores_only()}) {
    SCOPED_TRACE(r.describe());
    const Pass p = run(3, r);
    expect_same(plain, p);
    EXPECT_EQ(p.recomputes, 2 * r.count());  // each checkpointed block once per backward, two micro-batches
  }
}

TEST(Recompute, PeakIsKeptInputsPlusOneBlock) {
  // One more layer adds one kept input (B, T, C) fp32 with every block checkpointed, and one block's
  // whole activations without: the peak is the kept inputs plus one block's activations.
  const size_t input_bytes = kB * kT * config(1).d_model * sizeof(float);
  const size_t all3 = run(3, GptRecompute::every(3, 1), 1).activation_peak;
  const size_t all4 = run(4, GptRecompute::every(4, 1), 1).activation_peak;
  const size_t all5 = run(5, GptRecompute::every(5, 1), 1).activation_peak;
  EXPECT_EQ(all4 - all3, input_bytes);
  EXPECT_EQ(all5 - all4, input_bytes);
  const size_t none3 = run(3, GptRecompute::none(), 1).activation_peak;
  const size_t none4 = run(4, GptRecompute::none(), 1).activation_peak;
  const size_t block = none4 - none3;  // one block's activations
  EXPECT_GT(block, 10 * input_bytes);
  // So with n layers: n kept inputs plus what one layer's re-run and backward hold at their peak (the
  // one-layer run's peak less its kept input), which is at most one block's activations plus the
  // head's (the plain one-layer peak: the head's then live beside the block's).
  const size_t all1 = run(1, GptRecompute::every(1, 1), 1).activation_peak;
  EXPECT_EQ(all4, 4 * input_bytes + (all1 - input_bytes));
  EXPECT_LE(all1, run(1, GptRecompute::none(), 1).activation_peak);
  // Selective drops every block's (B, n_head, T, T) probabilities, which the plain kernel saves...
  const size_t probs = kB * config(1).n_head * kT * kT * sizeof(float);
  const size_t plain4 = run(4, GptRecompute::none(), 1, AttentionKernel::kPlain).activation_peak;
  EXPECT_EQ(run(4, GptRecompute::scores_only(), 1, AttentionKernel::kPlain).activation_peak, plain4 - 4 * probs);
  // ...and the fused one never does (it saves a log-sum-exp per row instead): selective changes nothing.
  const size_t lse = kB * config(1).n_head * kT * sizeof(float);
  EXPECT_EQ(none4, plain4 - 4 * probs + 4 * lse);
  EXPECT_EQ(run(4, GptRecompute::scores_only(), 1).activation_peak, none4);
}

TEST(Recompute, EvaluationDoesNotCheckpoint) {
  GptModel model(config(2));
  materialize(model, 3);
  model.set_recompute(GptRecompute::every(2, 1));
  Batch batch;
  Dataset::builtin(kT).fill_batch(batch, 5, 0, 0, kB);
  HostContext ctx(/*training=*/false);
  ctx.forward_loss(model, batch);
  ctx.forward_loss(model, batch);  // evaluation may repeat the forward
  EXPECT_EQ(ctx.recompute_stats().modules, 0);
  EXPECT_FALSE(model.forward_pending());
}

// A user's own model: two Mlps in a Sequential, the first marked checkpointed.
class TwoMlps : public Model {
 public:
  TwoMlps() : seq_(add_child<Sequential>("seq")) {
    first_ = &seq_.append<Mlp>(16);
    seq_.append<Mlp>(16);
    assign_names(*this);
  }
  std::string_view type_name() const override { return "TwoMlps"; }
  Module& first() { return *first_; }

 protected:
  float forward_loss(Context& ctx, const Batch& batch) override {
    y_ = ctx.forward(seq_, batch.inputs);
    float s = 0.0f;
    for (int64_t i = 0; i < y_.numel(); ++i) s += y_.data<float>()[i] * static_cast<float>(i % 7);
    return s;
  }
  void backward_loss(Context& ctx, float grad_scale) override {
    memory::Tensor dy = ctx.allocate(y_.shape(), memory::DType::kF32, MemoryUse::kGradient);
    for (int64_t i = 0; i < dy.numel(); ++i) dy.data<float>()[i] = grad_scale * static_cast<float>(i % 7);
    ctx.backward(seq_, dy);
    y_ = {};
  }
  void clear_own_saved() override { y_ = {}; }

 private:
  Sequential& seq_;
  Module* first_ = nullptr;
  memory::Tensor y_;
};

TEST(Recompute, AUsersModuleMarkedCheckpointed) {
  std::vector<std::vector<float>> grads[2];
  for (int marked = 0; marked < 2; ++marked) {
    TwoMlps model;
    materialize(model, 11);
    model.first().set_recomputed(marked == 1);
    Batch batch{memory::Tensor::empty({3, 4, 16}, memory::DType::kF32), {}};
    for (int64_t i = 0; i < batch.inputs.numel(); ++i) batch.inputs.data<float>()[i] = std::sin(0.37f * i);
    HostContext ctx;
    ctx.forward_loss(model, batch);
    EXPECT_TRUE(model.first().forward_pending());  // checkpointed: pending, its children's state dropped
    ctx.backward_loss(model, 1.0f);
    EXPECT_EQ(ctx.recompute_stats().modules, marked);
    model.visit_params([&](Parameter& p) {
      const float* g = p.grad().data<float>();
      grads[marked].emplace_back(g, g + p.numel());
    });
  }
  EXPECT_EQ(grads[0], grads[1]);
}

}  // namespace
}  // namespace zs::nn
