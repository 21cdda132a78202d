// The GPT-MoE with tensor parallelism through the engine, at np 4 (Note [experts under tensor
// parallelism] in moe/gpt_moe.cpp): dp 4 x tp 1 (the reference: every rank holds every expert, ep_size
// 1), dp 2 x tp 2 (ep_size 1 and 2, the expert-parallel groups a comm::Topology's) and dp 1 x tp 4 train
// the same model on the same global batch and give the same losses and gradient norms (fp32: 1e-5
// relative), with sequence parallelism off and on, at ZeRO stages 0-3 with 2 to 8 accumulation steps;
// every parameter (dense slices gathered to the full tensor, experts, gate) ends equal to the
// reference's, the initial param_digest is the same bits, and after training the replicated
// parameters (experts, gate, norms) are still bitwise equal over the tp group (param_digest checks).
// Clipping below the gradient norm makes every update depend on the norm, so a whole expert counted
// once per tp rank instead of once would change the losses.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "comm/topology.h"
#include "engine/config.h"
#include "engine/dataset_source.h"
#include "engine/engine.h"
#include "moe/moe.h"
#include "nn/data.h"
#include "optim/adam.h"
#include "tests/support/mpi_test_env.h"

namespace zs::moe {
namespace {

constexpr int kSteps = 10;

GptMoeConfig tiny(int ep_size) {
  return {.gpt = {.n_layer = 2, .d_model = 32, .n_head = 4, .seq_len = 16, .vocab_size = 256, .tied_embeddings = false},
          .moe = {.num_experts = 4, .ep_size = ep_size, .k = 2, .capacity_factor = 1.25},
          .every_n_layers = 2,
          .aux_loss_coef = 0.01f};
}

engine::EngineConfig config(int stage, int dp) {
  engine::EngineConfig c;
  // One sample per micro-batch at every dp: a gate's capacity, dropped tokens and l_aux are functions of
  // the tokens it sees at once, so every layout must route the same micro-batches (8 / dp accumulation
  // steps: 2 at dp 4, 4 at dp 2, 8 at dp 1).
  c.batch = engine::resolve_batch(8, /*micro=*/1, 8 / dp, dp);
  c.zero.stage = stage;
  c.zero.reduce_bucket_size = 3000;
  c.zero.allgather_bucket_size = 5000;
  c.zero.stage3_prefetch_bucket_size = 4000;
  c.zero.stage3_param_persistence_threshold = 0;
  // eps 1e-6 as tests/moe/engine_test: an expert's gradient summed in another order (ep_size, tp) must
  // not turn a rounding difference on a near-zero element into a sizeable part of an Adam step.
  c.optimizer = engine::OptimizerConfig("AdamW", optim::AdamConfig{.lr = 3e-3, .eps = 1e-6});
  c.gradient_clipping = 0.05;  // below the norm (about 0.2 to 1): every update is clipped
  c.device.memory_mb = 64;
  c.seed = 42;
  return c;
}

struct TrainRun {
  std::vector<double> losses, norms;
  std::string initial_digest;
  std::map<std::string, std::vector<float>> params;  // every parameter this rank holds, full tensors
  uint64_t tp_bytes = 0;
};

TrainRun train(int tp_size, int ep_size, bool sequence_parallel, int stage) {
  const comm::Group& world = test::world().group();
  comm::Topology topo(world, {.tensor_parallel_size = tp_size, .expert_parallel_size = ep_size});
  comm::ExpertGroups groups{topo.data_parallel().dup("dp", world.config()), topo.take_expert_parallel(),
                            topo.take_expert_data_parallel()};
  const tp::TensorParallel tp{.group = tp_size > 1 ? &topo.tensor_parallel() : nullptr,
                              .sequence_parallel = sequence_parallel};
  GptMoeModel model(tiny(ep_size), &groups, tp);
  const engine::EngineConfig cfg = config(stage, topo.data_parallel_size());
  engine::Engine engine(model, cfg, topo.data_parallel(), topo.tensor_parallel());
  engine::DatasetSource source(nn::Dataset::builtin(16), 7);
  TrainRun r;
  r.initial_digest = engine.param_digest();
  for (int i = 0; i < kSteps; ++i) {
    const engine::StepReport report = engine.train_batch(source);
    r.losses.push_back(report.loss);
    r.norms.push_back(report.grad_norm);
    r.tp_bytes += report.tp_comm_bytes_sent;
  }
  engine.param_digest();  // throws ModelError if a replicated parameter differs over tp
  model.visit_params([&](nn::Parameter& p) { r.params[p.full_name()] = engine.fp32_param(p.full_name()); });
  return r;
}

class MoeTp : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (test::world().size() != 4) GTEST_SKIP() << "dp x tp over 4 ranks";
  }
};

TEST_P(MoeTp, TrainsAsTp1) {
  const int stage = GetParam();
  const TrainRun ref = train(1, 1, false, stage);
  EXPECT_EQ(ref.tp_bytes, 0u);
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.1) << "the loss should fall";
  struct Layout {
    int tp, ep;
    bool sp;
  };
  for (const Layout l : {Layout{2, 1, false}, Layout{2, 2, true}, Layout{2, 2, false}, Layout{4, 1, stage % 2 == 1}}) {
    const std::string what = fmt::format("stage {}, dp {} x tp {}, ep_size {}{}", stage, 4 / l.tp, l.tp, l.ep,
                                         l.sp ? ", sequence parallel" : "");
    SCOPED_TRACE(what);
    const TrainRun got = train(l.tp, l.ep, l.sp, stage);  // collective: every rank runs every layout
    EXPECT_EQ(got.initial_digest, ref.initial_digest) << "the initial model differs from tp 1's";
    EXPECT_GT(got.tp_bytes, 0u);
    double worst = 0;
    for (size_t i = 0; i < ref.losses.size(); ++i) {
      worst = std::max(worst, std::abs(got.losses[i] / ref.losses[i] - 1));
      EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-5 * ref.losses[i]) << "step " << i + 1;
      EXPECT_NEAR(got.norms[i], ref.norms[i], 1e-4 * ref.norms[i]) << "grad norm of step " << i + 1;
    }
    if (test::world().rank() == 0) std::printf("%s: losses within %.2e relative of tp 1's\n", what.c_str(), worst);
    // Every parameter this rank holds (experts: those of its ep rank; the reference holds all).
    size_t compared = 0, experts = 0;
    for (const auto& [name, values] : got.params) {
      const auto it = ref.params.find(name);
      ASSERT_NE(it, ref.params.end()) << name;
      ASSERT_EQ(values.size(), it->second.size()) << name << ": fp32_param must give the full tp = 1 tensor";
      double diff = 0;
      for (size_t i = 0; i < values.size(); ++i) diff = std::max(diff, double(std::abs(values[i] - it->second[i])));
      EXPECT_LE(diff, 1e-5) << name;
      ++compared;
      experts += name.find(".experts.") != std::string::npos ? 1 : 0;
    }
    EXPECT_EQ(experts, 4u * 4 / l.ep) << "each rank holds num_experts / ep_size experts of 4 tensors";
    EXPECT_EQ(compared + 4 * 4 - experts, ref.params.size());
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, MoeTp, ::testing::Values(0, 1, 2, 3));

}  // namespace
}  // namespace zs::moe
