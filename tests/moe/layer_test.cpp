// moe::MoE on one process (HostContext): backward (input and every parameter) against central finite
// differences of L = sum(y * r) + a * l_aux, for top-1 with drops and RTS, top-2 with sampling, top-3,
// PR-MoE and the Jitter policy; the parameter contract (names, tags); config errors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/errors.h"
#include "moe/moe.h"
#include "nn/host_context.h"
#include "nn/transformer.h"

namespace zs::moe {
namespace {

using memory::DType;
using memory::Tensor;

constexpr int64_t kD = 6;

ExpertFactory mlp_factory() {
  return [] { return std::make_unique<nn::Mlp>(kD, 0.3f, 0.3f); };
}

Tensor random_tensor(memory::Shape shape, uint64_t seed, float scale) {
  Tensor t = Tensor::empty(std::move(shape), DType::kF32);
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  for (float& v : t.f32()) v = dist(gen);
  return t;
}

// The position the engine sets for the first micro-batch of step 0 on one process: x's dim 0 samples.
void at_start(nn::Context& ctx, const Tensor& x) {
  ctx.set_batch_position({.step = 0, .first_sample = 0, .samples = x.size(0)});
}

// Training-mode forward whose state is dropped again (at the real pass's batch position: the same draws).
double probe_loss(MoE& m, const Tensor& x, const Tensor& r, float a) {
  nn::HostContext ctx;
  at_start(ctx, x);
  Tensor y = ctx.forward(m, x);
  double sum = a * m.l_aux();
  for (int64_t i = 0; i < y.numel(); ++i) sum += static_cast<double>(y.data<float>()[i]) * r.data<float>()[i];
  m.clear_saved();
  return sum;
}

void check_gradients(const MoEOptions& o, const std::string& what) {
  SCOPED_TRACE(what);
  MoE m(kD, mlp_factory(), o);
  nn::materialize(m, 3);
  // A gate with some spread, so routing is decided by margins well above the probe step.
  m.visit_params([&](nn::Parameter& p) {
    if (p.full_name() == "gate.wg.weight") p.data().copy_from(random_tensor(p.shape(), 5, 1.0f));
  });
  const int64_t S = 16;
  Tensor x = random_tensor({2, S / 2, kD}, 7, 1.0f);
  Tensor r = random_tensor({2, S / 2, kD}, 8, 1.0f);
  const float a = 0.5f;

  // Finite differences first (each probe a forward at the same batch position as the real pass).
  const float h = 1e-3f;
  struct Probe {
    float* v;
    double fd;
    std::string name;
    const Tensor* grad;  // nullptr: x
    int64_t index;
  };
  std::vector<Probe> probes;
  auto probe = [&](float* v, const std::string& name, const Tensor* grad, int64_t index) {
    const float saved = *v;
    *v = saved + h;
    const double lp = probe_loss(m, x, r, a);
    *v = saved - h;
    const double lm = probe_loss(m, x, r, a);
    *v = saved;
    probes.push_back({v, (lp - lm) / (2.0 * h), name, grad, index});
  };
  for (int64_t i = 0; i < x.numel(); i += 3) probe(x.data<float>() + i, fmt::format("x[{}]", i), nullptr, i);
  for (nn::Parameter* p : m.all_params()) {
    const int64_t step = std::max<int64_t>(1, p->numel() / 12);
    for (int64_t i = 0; i < p->numel(); i += step)
      probe(p->data().data<float>() + i, fmt::format("{}[{}]", p->full_name(), i), &p->grad(), i);
  }

  nn::HostContext ctx;
  at_start(ctx, x);
  nn::zero_grads(m);
  Tensor y = ctx.forward(m, x);
  EXPECT_EQ(y.shape(), x.shape());
  m.set_aux_loss_grad(a);
  Tensor dx = ctx.backward(m, r);
  int checked = 0;
  for (const Probe& p : probes) {
    const float analytic = (p.grad ? *p.grad : dx).data<float>()[p.index];
    EXPECT_NEAR(analytic, p.fd, 4e-3 + 1e-2 * std::abs(p.fd)) << p.name;
    ++checked;
  }
  EXPECT_GT(checked, 100);
}

TEST(MoELayer, TopOneWithDropsAndRandomTokenSelection) {
  check_gradients({.num_experts = 4, .k = 1, .capacity_factor = 0.75, .min_capacity = 1, .use_rts = true}, "top-1");
}

TEST(MoELayer, TopTwoWithSecondExpertSampling) {
  check_gradients({.num_experts = 4, .k = 2, .capacity_factor = 0.75, .min_capacity = 1}, "top-2");
}

TEST(MoELayer, TopThreeWithoutDrops) {
  check_gradients({.num_experts = 5, .k = 3, .drop_tokens = false}, "top-3");
}

TEST(MoELayer, ResidualMoEAndJitter) {
  check_gradients({.num_experts = 4, .k = 2, .use_residual = true, .noisy_gate_policy = NoisyGatePolicy::kJitter},
                  "PR-MoE, Jitter");
}

TEST(MoELayer, ParametersAreNamedGloballyAndTagged) {
  MoE m(kD, mlp_factory(), {.num_experts = 4, .k = 2, .use_residual = true});
  nn::assign_names(m);
  EXPECT_NE(m.find_param("gate.wg.weight"), nullptr);
  EXPECT_NE(m.find_param("experts.3.fc.weight"), nullptr);
  EXPECT_NE(m.find_param("coefficient.bias"), nullptr);
  for (nn::Parameter* p : m.all_params()) {
    const bool expert = p->full_name().rfind("experts.", 0) == 0;
    EXPECT_EQ(p->has_tag(nn::kTagExpert), expert) << p->full_name();
    EXPECT_EQ(p->expert_parallel_size(), 1) << p->full_name();
  }
}

TEST(MoELayer, BackwardNeedsTheAuxLossGradient) {
  MoE m(kD, mlp_factory(), {.num_experts = 2});
  nn::materialize(m, 1);
  nn::HostContext ctx;
  Tensor x = random_tensor({8, kD}, 1, 1.0f);
  at_start(ctx, x);
  Tensor y = ctx.forward(m, x);
  EXPECT_THROW(ctx.backward(m, y), UsageError);
}

TEST(MoELayer, RandomDrawsNeedTheBatchPosition) {
  Tensor x = random_tensor({8, kD}, 1, 1.0f);
  {  // random token selection draws: the position keys them
    MoE m(kD, mlp_factory(), {.num_experts = 2});
    nn::materialize(m, 1);
    nn::HostContext ctx;
    EXPECT_THROW(ctx.forward(m, x), UsageError);
  }
  {  // no draws (no RTS, no noise, top-1): no position needed
    MoE m(kD, mlp_factory(), {.num_experts = 2, .use_rts = false});
    nn::materialize(m, 1);
    nn::HostContext ctx;
    Tensor y = ctx.forward(m, x);
    EXPECT_EQ(y.numel(), x.numel());
    m.clear_saved();
  }
  {  // tokens are numbered per sample: 8 tokens cannot be 3 samples
    MoE m(kD, mlp_factory(), {.num_experts = 2});
    nn::materialize(m, 1);
    nn::HostContext ctx;
    ctx.set_batch_position({.step = 0, .first_sample = 0, .samples = 3});
    EXPECT_THROW(ctx.forward(m, x), ModelError);
  }
}

// A token's draws depend on its global index and the step only: the second half of a batch drawn as a
// micro-batch of its own (first_sample 2 of 4-token samples) routes exactly as within the whole batch.
TEST(MoELayer, DrawsFollowTheGlobalSampleIndex) {
  MoE m(kD, mlp_factory(), {.num_experts = 4, .k = 2, .drop_tokens = false});
  nn::materialize(m, 1);
  Tensor whole = random_tensor({4, 4, kD}, 9, 0.05f);  // small logits: the sampled second expert varies
  nn::HostContext eval(false);
  auto route = [&](const Tensor& x, int64_t step, int64_t first) {
    eval.set_batch_position({.step = step, .first_sample = first, .samples = x.size(0)});
    eval.forward(m, x);
    return m.stats().expert_counts;
  };
  std::vector<int64_t> all = route(whole, 5, 0);
  std::vector<int64_t> a = route(whole.slice(0, 0, 2), 5, 0);
  std::vector<int64_t> b = route(whole.slice(0, 2, 4), 5, 2);
  for (size_t e = 0; e < all.size(); ++e) EXPECT_EQ(all[e], a[e] + b[e]) << "expert " << e;
  // Another step draws other numbers: some token's sampled second expert changes.
  bool differs = false;
  for (int64_t step = 6; step < 12 && !differs; ++step) differs = route(whole, step, 0) != all;
  EXPECT_TRUE(differs);
}

TEST(MoELayer, EvalModeAndNoTokens) {
  MoE m(kD, mlp_factory(), {.num_experts = 4, .k = 2});
  nn::materialize(m, 1);
  nn::HostContext eval(false);
  Tensor x = random_tensor({5, kD}, 2, 1.0f);
  at_start(eval, x);
  Tensor y1 = eval.forward(m, x);
  Tensor y2 = eval.forward(m, x);
  EXPECT_EQ(y1.numel(), 5 * kD);
  nn::HostContext ctx;
  Tensor none = Tensor::empty({0, kD}, DType::kF32);
  at_start(ctx, none);
  Tensor y = ctx.forward(m, none);
  EXPECT_EQ(y.numel(), 0);
  EXPECT_EQ(m.l_aux(), 0.0f);
  m.set_aux_loss_grad(1.0f);
  Tensor dx = ctx.backward(m, y);
  EXPECT_EQ(dx.numel(), 0);
}

// The memory estimator's run: no arithmetic, groups simulated (nothing received is valid).
class MeasuringContext : public nn::HostContext {
 public:
  bool computes() const override { return false; }
};

TEST(MoELayer, MeasuringRunWithSimulatedGroups) {
  comm::ExpertGroups groups{comm::Group::simulated(1, 2, "dp"), comm::Group::simulated(1, 2, "ep"),
                            comm::Group::simulated(0, 1, "edp")};
  MoE m(kD, mlp_factory(),
        {.num_experts = 4, .ep_size = 2, .k = 2, .drop_tokens = false, .top2_2nd_expert_sampling = false}, &groups);
  nn::materialize(m, 1);
  MeasuringContext ctx;
  Tensor x = Tensor::empty({12, kD}, DType::kF32);
  Tensor y = ctx.forward(m, x);
  EXPECT_EQ(y.numel(), 12 * kD);
  // Balanced routing: token s to experts s and s+1 (mod 4): 6 choices per expert.
  EXPECT_EQ(m.stats().expert_counts, (std::vector<int64_t>{6, 6, 6, 6}));
  m.set_aux_loss_grad(1.0f);
  Tensor dx = ctx.backward(m, y);
  EXPECT_EQ(dx.numel(), 12 * kD);
  EXPECT_EQ(m.first_expert(), 2);
}

TEST(MoELayer, ConfigErrorsNameTheKeys) {
  try {
    MoEOptions{.num_experts = 6, .ep_size = 4}.validate("model.moe.");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.moe.num_experts"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("model.moe.ep_size"), std::string::npos) << e.what();
  }
  EXPECT_THROW(MoE(kD, mlp_factory(), {.num_experts = 4, .ep_size = 2}), ConfigError);  // no groups
  EXPECT_THROW(MoE(kD, nullptr, {.num_experts = 4}), ModelError);
}

}  // namespace
}  // namespace zs::moe
