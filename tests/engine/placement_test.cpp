// The placement plan (engine/placement.h) against Note [model-state placement]: which buffers exist,
// whole or sharded, on which tier. The engine allocates exactly this plan (the estimator agreement
// tests compare a real engine's allocation with it), so this is the table written down once.
#include "engine/placement.h"

#include <gtest/gtest.h>

#include "engine/offload_rules.h"
#include "optim/adam.h"
#include "optim/cadam.h"

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

// The error feedback as comm::OneBitAllreduce holds it, in each compression_scale mode: the flat
// buffer plus one server chunk with scale blocks; per tensor, every tensor padded to a multiple of
// N x DeepSpeed's divider (np 3: 72) plus this rank's chunk of each (Note [Per-tensor scales]).
TEST(Placement, ErrorFeedbackFollowsTheCompressionScale) {
  const Partition part(kTotal, 3, 1);
  // Tensors of 100, 7 and 31000 elements at 32-element alignment: 72 x 2, 72, 72 x 431.
  const std::vector<memory::ShardRange> tensors = {{0, 100}, {128, 7}, {160, 31000}};
  PlacementRules r;
  r.stage = 1;
  r.precision = Precision::kFp32;
  r.compressed = true;
  // Blocks: Ψ + ceil(Ψ/3) rounded up to 256 (10752).
  EXPECT_EQ(plan_placement(r, kTotal, part, "dp", tensors).find(BufferRole::kErrorFeedback)->bytes, 4 * (kTotal + 10752));
  EXPECT_EQ(plan_placement(r, kTotal, part).find(BufferRole::kErrorFeedback)->bytes, 4 * (kTotal + 10752))
      << "blocks do not depend on the tensors";
  r.per_tensor_scales = true;
  const uint64_t padded = 144 + 72 + 31032;
  const PlannedBuffer* e = plan_placement(r, kTotal, part, "dp", tensors).find(BufferRole::kErrorFeedback);
  EXPECT_EQ(e->bytes, 4 * (padded + padded / 3));
  EXPECT_TRUE(e->owned_by_comm);
  EXPECT_EQ(plan_placement(r, 0, Partition(0, 3, 1)).find(BufferRole::kErrorFeedback)->bytes, 0u);
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

// Every planned buffer carries the role the engine dispatches on, and its name follows the role (the
// optimizer states keep their own names).
TEST(Placement, BuffersCarryTheirRoles) {
  const Partition part(kTotal, 4, 1);
  PlacementRules r = adam(2, Precision::kBf16);
  r.memory.release_fp32_grad = false;
  const PlacementPlan p = plan_placement(r, kTotal, part);
  for (const PlannedBuffer& b : p.buffers) {
    if (b.role == BufferRole::kOptimizerState) {
      EXPECT_TRUE(b.name == "exp_avg" || b.name == "exp_avg_sq") << b.name;
    } else {
      EXPECT_EQ(b.name, buffer_role_name(b.role));
    }
  }
  EXPECT_EQ(p.find(BufferRole::kMaster), p.find("master"));
  EXPECT_EQ(p.find(BufferRole::kFp32Grads), p.find("fp32_grads"));
  EXPECT_EQ(p.find(BufferRole::kOptimizerState), p.find("exp_avg"));
  EXPECT_EQ(p.find(BufferRole::kResidual), nullptr);
}

// Note [NVMe sub-group items]: the master, each state, then the parameters; offsets from a
// sub-group's first element, block-quantised states by their blocks.
TEST(Placement, NvmeSubGroupItemsByName) {
  NvmeSubGroupItems items;
  items.optimizer = true;
  auto specs = optim::CAdam(optim::CAdamConfig{}).state_specs();
  items.states.assign(specs.begin(), specs.end());
  items.param_bytes = 2;
  const uint64_t from = 2 * kSubGroupAlign, n = kSubGroupAlign;
  const auto list = items.items(from, n);
  ASSERT_EQ(list.size(), 2 + specs.size());
  EXPECT_EQ(list.front().kind, NvmeSubGroupItems::Kind::kMaster);
  EXPECT_EQ(list.front().offset, 4 * from);
  EXPECT_EQ(list.front().bytes, 4 * n);
  for (size_t k = 0; k < specs.size(); ++k) {
    const auto& it = list[1 + k];
    EXPECT_EQ(it.kind, NvmeSubGroupItems::Kind::kState);
    EXPECT_EQ(it.state, k);
    EXPECT_EQ(it.offset, from / specs[k].elements_per_value * specs[k].value_bytes) << specs[k].name;
    EXPECT_EQ(it.bytes, specs[k].bytes_for(n)) << specs[k].name;
  }
  EXPECT_EQ(list.back().kind, NvmeSubGroupItems::Kind::kParams);
  EXPECT_EQ(list.back().offset, 2 * from);
  EXPECT_EQ(list.back().bytes, 2 * n);

  // The swapper's buffers in that order, found by name.
  std::vector<std::vector<std::byte>> storage;
  std::vector<std::span<std::byte>> bufs;
  for (const auto& it : list) storage.emplace_back(it.bytes);
  for (auto& b : storage) bufs.emplace_back(b);
  const NvmeSubGroupItems::Buffers b = items.buffers(bufs);
  EXPECT_EQ(static_cast<void*>(b.master), static_cast<void*>(storage[0].data()));
  ASSERT_EQ(b.states.size(), specs.size());
  EXPECT_EQ(b.states.back(), storage[specs.size()].data());
  EXPECT_EQ(b.params, storage.back().data());

  // Parameters alone on NVMe: one item.
  NvmeSubGroupItems params_only;
  params_only.param_bytes = 4;
  const auto one = params_only.items(0, n);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].kind, NvmeSubGroupItems::Kind::kParams);
  EXPECT_EQ(one[0].bytes, 4 * n);
}

}  // namespace
}  // namespace zs::engine
