// What happens to a model's memory when the Engine goes first: an exception between a forward and its
// backward, a program that ends after a forward, a model that outlives its engine, a Tensor a user
// kept. Each must leave the user's error intact, free nothing twice and touch no freed memory
// (Note [engine memory lifetime] in engine/detail/engine_context.h). The debug preset runs these
// under ASan; the guarded backend faults on any stray device access in the release build too.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "comm/world.h"
#include "engine/engine.h"
#include "examples/mlp_model.h"
#include "optim/adam.h"

namespace zs::engine {
namespace {

using examples::MlpConfig;
using examples::Regressor;
using examples::TeacherData;

constexpr int64_t kBatch = 8;

EngineConfig mlp_config(int stage, const std::string& backend) {
  EngineConfig c;
  c.batch = resolve_batch(kBatch, 0, 1, 1);
  c.zero.stage = stage;
  c.zero.stage3_param_persistence_threshold = 0;  // every stage-3 parameter is gathered and released
  c.optimizer = OptimizerConfig("AdamW", optim::AdamConfig{.lr = 1e-2});
  c.device.memory_mb = 16;
  c.device.backend = backend;
  c.seed = 7;
  return c;
}

nn::Batch make_batch(const MlpConfig& mlp) {
  TeacherData data(mlp, 7, kBatch);
  nn::Batch batch;
  data.fill(batch, 0, 0, kBatch);
  return batch;
}

// The shape of standalone_mlp's main: the model declared before the engine (so it dies after it),
// and a user error thrown between forward and backward.
std::string throw_between_forward_and_backward(int stage, const std::string& backend) {
  comm::World world(comm::World::Launch::kLocal);
  MlpConfig mlp;
  const nn::Batch batch = make_batch(mlp);
  try {
    Regressor model(mlp);
    Engine engine(model, mlp_config(stage, backend), world.group());
    engine.forward(batch);
    throw std::runtime_error("the user's own error");
  } catch (const std::exception& e) {
    return e.what();
  }
}

class EngineLifetime : public ::testing::TestWithParam<const char*> {};

TEST_P(EngineLifetime, AnExceptionBetweenForwardAndBackwardReachesTheUserAtStage0) {
  EXPECT_EQ(throw_between_forward_and_backward(0, GetParam()), "the user's own error");
}

TEST_P(EngineLifetime, AnExceptionBetweenForwardAndBackwardReachesTheUserAtStage3) {
  EXPECT_EQ(throw_between_forward_and_backward(3, GetParam()), "the user's own error");
}

TEST_P(EngineLifetime, EngineDestroyedAfterAForwardWithNoBackward) {
  comm::World world(comm::World::Launch::kLocal);
  MlpConfig mlp;
  const nn::Batch batch = make_batch(mlp);
  Regressor model(mlp);
  {
    Engine engine(model, mlp_config(0, GetParam()), world.group());
    engine.forward(batch);
    EXPECT_TRUE(model.forward_pending());
  }
  // The engine dropped what the model saved and its views into the engine's buffers.
  EXPECT_FALSE(model.forward_pending());
  for (nn::Parameter* p : model.all_params()) {
    EXPECT_FALSE(p->data().defined()) << p->full_name();
    EXPECT_FALSE(p->grad().defined()) << p->full_name();
  }
  // The model can be trained by a new engine.
  Engine again(model, mlp_config(3, GetParam()), world.group());
  again.forward(batch);
  again.backward();
  EXPECT_TRUE(again.step());
}

TEST_P(EngineLifetime, ModelDestroyedAfterTheEngineMidStage3Forward) {
  comm::World world(comm::World::Launch::kLocal);
  MlpConfig mlp;
  const nn::Batch batch = make_batch(mlp);
  auto model = std::make_unique<Regressor>(mlp);
  auto engine = std::make_unique<Engine>(*model, mlp_config(3, GetParam()), world.group());
  engine->forward(batch);
  engine.reset();
  model.reset();
}

// A model that hands its prediction to the user (a logging hook, say): the Tensor shares the arena
// block the engine served.
class KeepingRegressor : public Regressor {
 public:
  using Regressor::Regressor;
  memory::Tensor kept;

 protected:
  float forward_loss(nn::Context& ctx, const nn::Batch& batch) override {
    kept = ctx.allocate({4}, memory::DType::kF32, nn::MemoryUse::kActivation);
    if (ctx.computes()) {
      for (size_t i = 0; i < 4; ++i) kept.f32()[i] = float(i) + 0.5f;
    }
    return Regressor::forward_loss(ctx, batch);
  }
};

TEST(EngineLifetimeCpu, ATensorKeptPastTheEngineStaysValid) {
  comm::World world(comm::World::Launch::kLocal);
  MlpConfig mlp;
  const nn::Batch batch = make_batch(mlp);
  memory::Tensor kept;
  {
    KeepingRegressor model(mlp);
    Engine engine(model, mlp_config(0, "cpu"), world.group());
    engine.forward(batch);
    engine.backward();
    engine.step();
    kept = model.kept;  // a copy outlives both the engine and the model
  }
  ASSERT_TRUE(kept.defined());
  // The cpu backend's device memory is host memory: the block is still the Tensor's to read.
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(kept.f32()[i], float(i) + 0.5f);
  kept = {};  // the last owner returns the block, then the arena
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineLifetime, ::testing::Values("cpu", "guarded"));

}  // namespace
}  // namespace zs::engine
