// The placement plan (engine/placement.h) against Note [model-state placement]: which buffers exist,
// whole or sharded, on which tier. The engine allocates exactly this plan (the estimator agreement
// tests compare a real engine's allocation with it), so this is the table written down once.
#include "engine/placement.h"

#include <gtest/gtest.h>

#include "optim/adam.h"

namespace zs::engine {
namespace {

constexpr size_t kTotal = 1000 * 32;

PlacementRules adam(int stage, Precision p) {
  PlacementRules r;
  r.stage = stage;
  r.precision = p;
  auto specs = optim::Adam(optim::AdamConfig{}).state_specs();
  r.states.assign(specs.begin(), specs.end());
  return r;
}

TEST(Placement, TheStageTable) {
  const Partition part(kTotal, 4, 1);
  const memory::ShardRange whole{0, kTotal};
  for (int stage = 0; stage <= 3; ++stage) {
    const PlacementPlan p = plan_placement(adam(stage, Precision::kBf16), kTotal, part);
    EXPECT_EQ(p.find("params")->elements, stage == 3 ? part.mine : whole) << stage;
    EXPECT_EQ(p.find("grads")->elements, stage >= 2 ? part.mine : whole) << stage;
    EXPECT_EQ(p.find("master")->elements, stage >= 1 ? part.mine : whole) << stage;
    EXPECT_EQ(p.find("exp_avg")->bytes, 4 * p.stepped.size) << stage;
    EXPECT_EQ(p.find("params")->bytes, 2 * p.params.size) << stage;
    for (const PlannedBuffer& b : p.buffers) EXPECT_EQ(b.where, Where::kDevice) << b.name;
  }
  // fp32 without offload: the parameters are the master.
  EXPECT_EQ(plan_placement(adam(1, Precision::kFp32), kTotal, part).find("master"), nullptr);
}

TEST(Placement, OffloadMovesWhatTheStageAllows) {
  const Partition part(kTotal, 2, 0);
  PlacementRules r = adam(2, Precision::kBf16);
  r.offload_optimizer = OffloadDevice::kCpu;
  PlacementPlan p = plan_placement(r, kTotal, part);
  EXPECT_EQ(p.find("master")->where, Where::kHost);
  EXPECT_EQ(p.find("exp_avg_sq")->where, Where::kHost);
  EXPECT_EQ(p.find("grads")->where, Where::kHost);  // the gradient shard goes where the step runs
  EXPECT_EQ(p.find("params")->where, Where::kDevice);
  r.stage = 1;  // stage 1 reduce-scatters in place in the whole gradient buffer: it stays
  EXPECT_EQ(plan_placement(r, kTotal, part).find("grads")->where, Where::kDevice);
  r = adam(3, Precision::kFp32);
  r.offload_param = OffloadDevice::kNvme;
  p = plan_placement(r, kTotal, part);
  EXPECT_EQ(p.find("params")->where, Where::kNvme);
  ASSERT_NE(p.find("master"), nullptr) << "fp32 keeps a separate master once the parameters are on NVMe";
  EXPECT_EQ(p.bytes(memory::Category::kParams, Where::kNvme, true), (part.mine.size * 4 + 4095) / 4096 * 4096);
}

TEST(Placement, CompressedOptimizersKeepWholeMomentumAndGradients) {
  const Partition part(kTotal, 3, 2);
  PlacementRules r;
  r.stage = 2;
  r.precision = Precision::kBf16;
  r.compressed = true;
  r.local_steps = true;
  PlacementPlan p = plan_placement(r, kTotal, part);
  EXPECT_EQ(p.grad_stage, 1);
  EXPECT_EQ(p.find("grads")->elements.size, kTotal);
  EXPECT_EQ(p.find("momentum")->bytes, 4 * kTotal);
  EXPECT_EQ(p.find("variance")->bytes, 4 * part.mine.size);
  EXPECT_EQ(p.find("accumulator"), nullptr) << "only stage 0 takes local steps";
  EXPECT_TRUE(p.find("error_feedback")->owned_by_comm);
  r.stage = 0;
  EXPECT_NE(plan_placement(r, kTotal, part).find("accumulator"), nullptr);
}

TEST(Placement, MemoryModes) {
  const Partition part(kTotal, 2, 1);
  PlacementRules r = adam(1, Precision::kBf16);
  r.memory.reuse_fp32_param = true;
  r.memory.release_fp32_grad = false;
  const PlacementPlan p = plan_placement(r, kTotal, part);
  EXPECT_EQ(p.find("master"), nullptr);
  EXPECT_EQ(p.find("residual")->bytes, 2 * part.mine.size);
  EXPECT_EQ(p.find("fp32_grads")->elements, part.mine);
}

}  // namespace
}  // namespace zs::engine
