// The guarded backend catches what the seam forbids: host code reading device memory outside a
// backend operation or a DeviceAccess scope dies with the guard's message (a CUDA backend would
// fault the same way). Not an MPI test: death tests fork.
#include <gtest/gtest.h>

#include "comm/world.h"
#include "memory/guarded_backend.h"
#include "tests/engine/train_harness.h"
#include "run/run_config.h"

namespace zs::engine {
namespace {

using test_harness::make_config;

TEST(GuardedEngine, StrayReadOfAParameterBetweenStepsDies) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        comm::World world(comm::World::Launch::kLocal);
        zs::run::RunConfig cfg = make_config(1, 1, Precision::kBf16, 0);
        cfg.device.backend = "guarded";
        nn::GptModel model(*cfg.model);
        Engine engine(model, cfg, world.group());
        volatile uint16_t v = *static_cast<const uint16_t*>(model.find_param("wte")->data().raw());
        (void)v;
      },
      "outside a backend operation or DeviceAccess scope");
}

TEST(GuardedEngine, TheSameReadInsideAnAccessScopeIsAllowed) {
  comm::World world(comm::World::Launch::kLocal);
  zs::run::RunConfig cfg = make_config(1, 1, Precision::kFp32, 0);
  auto backend = std::make_unique<memory::GuardedBackend>(size_t{64} << 20);
  memory::GuardedBackend& guard = *backend;
  nn::GptModel model(*cfg.model);
  Engine engine(model, cfg, world.group(), std::move(backend));
  EXPECT_FALSE(guard.accessible());
  memory::DeviceAccess access(guard);
  const float* w = static_cast<const float*>(model.find_param("wte")->data().raw());
  EXPECT_EQ(w[0], engine.fp32_param("wte")[0]);
}

}  // namespace
}  // namespace zs::engine
