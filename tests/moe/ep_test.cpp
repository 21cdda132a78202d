// Expert parallelism under mpirun: the MoE layer at ep_size 1, 2, 3 and 4 (those dividing the world)
// gives every rank the same outputs, input gradients, l_aux and gate gradients, and the same expert
// gradients summed over the ranks that hold each expert (what the engine's edp reduction adds up), to
// 1e-5, for the same tokens; ranks route different numbers of tokens (one none, one all to one expert)
// without hanging.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "core/errors.h"
#include "core/rng.h"
#include "moe/moe.h"
#include "nn/host_context.h"
#include "nn/transformer.h"
#include "tests/support/mpi_test_env.h"

namespace zs::moe {
namespace {

using memory::DType;
using memory::Tensor;

constexpr int64_t kD = 8;
constexpr int kExperts = 12;  // divisible by every ep_size tested

enum class Tokens { kUneven, kSkewed };

int64_t tokens_of(int rank, Tokens mode) {
  if (mode == Tokens::kSkewed) return rank == 1 ? 0 : 10 + rank;
  return 5 + 3 * rank;
}

int64_t first_token(int rank, Tokens mode) {
  int64_t n = 0;
  for (int r = 0; r < rank; ++r) n += tokens_of(r, mode);
  return n;
}

// Row values keyed by the global token index: the same tokens whatever the ep_size.
Tensor tokens(int rank, Tokens mode, const char* stream, uint64_t pass) {
  const int64_t n = tokens_of(rank, mode), first = first_token(rank, mode);
  Tensor t = Tensor::empty({n, kD}, DType::kF32);
  CounterRng rng(pass, stream);
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t j = 0; j < kD; ++j) {
      float v = rng.normal(static_cast<uint64_t>((first + s) * kD + j));
      // Skewed: rank 0 sends every token to expert 0 (the gate below maps feature 0 to it).
      if (mode == Tokens::kSkewed && rank == 0 && std::string_view(stream) == "x") v = j == 0 ? 3.0f + 0.1f * v : 0.1f * v;
      t.data<float>()[s * kD + j] = v;
    }
  }
  return t;
}

struct Result {
  std::vector<float> y, dx, gate_grad, expert_grads;
  std::vector<float> l_aux;
};

Result run(const comm::ExpertGroups* groups, MoEOptions o, Tokens mode, int passes = 2) {
  const int rank = test::world().rank();
  MoE m(kD, [] { return std::make_unique<nn::Mlp>(kD, 0.2f, 0.2f); }, o, groups);
  nn::materialize(m, 17);
  if (mode == Tokens::kSkewed) {
    Tensor w = m.find_param("gate.wg.weight")->data();
    w.zero();
    w.data<float>()[0] = 4.0f;  // logit 0 = 4 * x_0
  }
  nn::zero_grads(m);
  Result res;
  for (int pass = 0; pass < passes; ++pass) {
    nn::HostContext ctx;
    // Each token its own sample: numbered over the ranks as the engine numbers samples.
    ctx.set_batch_position({.step = pass, .first_sample = first_token(rank, mode), .samples = tokens_of(rank, mode)});
    Tensor x = tokens(rank, mode, "x", static_cast<uint64_t>(pass));
    Tensor r = tokens(rank, mode, "r", static_cast<uint64_t>(pass));
    Tensor y = ctx.forward(m, x);
    m.set_aux_loss_grad(0.3f);
    Tensor dx = ctx.backward(m, r);
    res.y.insert(res.y.end(), y.f32().begin(), y.f32().end());
    res.dx.insert(res.dx.end(), dx.f32().begin(), dx.f32().end());
    res.l_aux.push_back(m.l_aux());
  }
  Tensor g = m.find_param("gate.wg.weight")->grad();
  res.gate_grad.assign(g.f32().begin(), g.f32().end());
  // Expert e's gradients in slot e of a world-summed buffer.
  const int64_t per_expert = m.expert(0).param_count();
  Tensor all = Tensor::empty({kExperts * per_expert}, DType::kF32);
  for (int l = 0; l < m.local_experts(); ++l) {
    int64_t at = (m.first_expert() + l) * per_expert;
    m.expert(l).visit_params([&](nn::Parameter& p) {
      std::copy_n(p.grad().data<float>(), p.numel(), all.data<float>() + at);
      at += p.numel();
    });
  }
  test::world().group().allreduce(all);
  res.expert_grads.assign(all.f32().begin(), all.f32().end());
  return res;
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], 1e-5 * std::max(1.0f, std::abs(a[i]))) << what << "[" << i << "]";
}

void check_every_ep_size(const MoEOptions& base, Tokens mode) {
  const int world = test::world().size();
  std::optional<Result> ref;
  for (int ep : {1, 2, 3, 4}) {
    if (world % ep != 0) continue;
    comm::ExpertGroups groups = test::world().split_groups(ep);
    MoEOptions o = base;
    o.ep_size = ep;
    Result r = run(&groups, o, mode);
    if (!ref) {
      ref = std::move(r);
      continue;
    }
    SCOPED_TRACE(fmt::format("ep_size {} against ep_size 1", ep));
    expect_close(r.y, ref->y, "y");
    expect_close(r.dx, ref->dx, "dx");
    expect_close(r.l_aux, ref->l_aux, "l_aux");
    expect_close(r.gate_grad, ref->gate_grad, "gate grad");
    expect_close(r.expert_grads, ref->expert_grads, "expert grads");
  }
}

TEST(ExpertParallel, TopOneWithRandomTokenSelection) {
  check_every_ep_size({.num_experts = kExperts, .k = 1, .capacity_factor = 1.0, .min_capacity = 1}, Tokens::kUneven);
}

TEST(ExpertParallel, TopTwoWithSampling) {
  check_every_ep_size({.num_experts = kExperts, .k = 2, .capacity_factor = 1.5, .min_capacity = 2}, Tokens::kUneven);
}

TEST(ExpertParallel, NoDropResidualAndNoise) {
  check_every_ep_size({.num_experts = kExperts, .k = 1, .use_residual = true,
                       .noisy_gate_policy = NoisyGatePolicy::kRSample, .drop_tokens = false},
                      Tokens::kUneven);
  check_every_ep_size({.num_experts = kExperts, .k = 3, .noisy_gate_policy = NoisyGatePolicy::kJitter},
                      Tokens::kUneven);
}

TEST(ExpertParallel, SkewedRoutingDoesNotHang) {
  // Rank 0 routes all its tokens to expert 0, rank 1 has none; with and without dropping.
  check_every_ep_size({.num_experts = kExperts, .k = 1, .drop_tokens = false}, Tokens::kSkewed);
  check_every_ep_size({.num_experts = kExperts, .k = 2, .min_capacity = 0}, Tokens::kSkewed);
  if (test::world().size() > 1) {
    comm::ExpertGroups groups = test::world().split_groups(test::world().size());
    MoE m(kD, [] { return std::make_unique<nn::Mlp>(kD); }, {.num_experts = kExperts, .ep_size = groups.ep.size(),
                                                              .drop_tokens = false}, &groups);
    nn::materialize(m, 1);
    Tensor w = m.find_param("gate.wg.weight")->data();
    w.zero();
    w.data<float>()[0] = 4.0f;
    Tensor x = tokens(test::world().rank(), Tokens::kSkewed, "x", 0);
    nn::HostContext ctx;
    ctx.set_batch_position({.step = 0, .first_sample = first_token(test::world().rank(), Tokens::kSkewed),
                            .samples = tokens_of(test::world().rank(), Tokens::kSkewed)});
    ctx.forward(m, x);
    if (test::world().rank() == 0) {
      EXPECT_EQ(m.stats().expert_counts[0], tokens_of(0, Tokens::kSkewed));
      EXPECT_EQ(m.stats().capacity, tokens_of(0, Tokens::kSkewed));  // the agreed maximum load
    }
    // Every rank agrees on the maximum load, bounded by its own token count for top-1 (as DeepSpeed).
    EXPECT_EQ(m.stats().capacity, std::min(tokens_of(0, Tokens::kSkewed), tokens_of(test::world().rank(), Tokens::kSkewed)));
    m.clear_saved();
  }
}

TEST(ExpertParallel, GroupsMustMatchEpSize) {
  comm::ExpertGroups groups = test::world().split_groups(1);
  if (test::world().size() % 2 == 0) {
    EXPECT_THROW(MoE(kD, [] { return std::make_unique<nn::Mlp>(kD); }, {.num_experts = 4, .ep_size = 2}, &groups),
                 ConfigError);
  }
  EXPECT_THROW(test::world().split_groups(test::world().size() + 1), ConfigError);
}

}  // namespace
}  // namespace zs::moe
