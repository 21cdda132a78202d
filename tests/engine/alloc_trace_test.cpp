// device.alloc_trace: a training run's arena trace, replayed into the arena's own policy, reproduces
// the run's allocated and reserved peaks exactly at every ZeRO stage; only rank 0 writes; an
// unwritable path is refused before training.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "comm/world.h"
#include "core/errors.h"
#include "memory/alloc_trace.h"
#include "train_harness.h"
#include "run/run_config.h"

namespace zs::engine {
namespace {

namespace fs = std::filesystem;

TEST(EngineAllocTrace, ReplayReproducesTheRunsPeaks) {
  comm::World world(comm::World::Launch::kLocal);
  const fs::path dir = fs::temp_directory_path() / ("zs_alloc_trace_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (int stage = 0; stage <= 3; ++stage) {
    zs::run::RunConfig cfg = test_harness::make_config(1, 1, Precision::kBf16, stage);
    cfg.device.alloc_trace = (dir / ("stage" + std::to_string(stage) + ".trace")).string();
    test_harness::RunResult run = test_harness::train(world.group(), cfg, 2);
    memory::AllocTrace trace = memory::load_trace(cfg.device.alloc_trace);
    EXPECT_EQ(trace.capacity_bytes, size_t{64} << 20);
    memory::TwoEndedBestFit policy(trace.capacity_bytes);
    memory::ReplayResult r = memory::replay(trace, policy, /*check_each_step=*/true);
    EXPECT_EQ(r.failed_allocs, 0u) << "stage " << stage;
    EXPECT_EQ(r.peak_allocated_bytes, run.memory.device_peak_bytes) << "stage " << stage;
    EXPECT_EQ(r.peak_reserved_bytes, run.memory.device_reserved_peak_bytes) << "stage " << stage;
    EXPECT_GT(r.peak_requested_bytes, 0u);
    EXPECT_LE(r.peak_requested_bytes, r.peak_allocated_bytes);
  }
  fs::remove_all(dir);
}

TEST(EngineAllocTrace, UnwritablePathIsAConfigError) {
  comm::World world(comm::World::Launch::kLocal);
  zs::run::RunConfig cfg = test_harness::make_config(1, 1, Precision::kFp32, 0);
  cfg.device.alloc_trace = "/nonexistent-dir/run.trace";
  nn::GptModel model(*cfg.model);
  try {
    Engine engine(model, cfg, world.group());
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("device.alloc_trace"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zs::engine
