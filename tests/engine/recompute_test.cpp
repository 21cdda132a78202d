// Activation checkpointing in the engine (engine/recompute_config.h): training with recomputed blocks
// equals training without (fp32: losses and parameters within 1e-5) at every ZeRO stage and world
// size, with accumulation, with the kept inputs on the host (cpu_checkpointing) or in the contiguous
// buffer, and with offload; and the kept inputs land where the config says.
#include <gtest/gtest.h>

#include <map>

#include "core/errors.h"
#include "tests/engine/train_harness.h"
#include "tests/support/mpi_test_env.h"
#include "run/run_config.h"

namespace zs::engine {
namespace {

using namespace test_harness;
using Blocks = RecomputeConfig::Blocks;

constexpr int kCkptSteps = 4;

zs::run::RunConfig base(int stage, int64_t accumulation) {
  return make_config(accumulation, test::world().group().size(), Precision::kFp32, stage);
}

// The same run without checkpointing, per (stage, accumulation, offload).
const RunResult& plain(const zs::run::RunConfig& cfg) {
  static std::map<std::tuple<int, int64_t, int, int>, RunResult> cache;
  auto key = std::make_tuple(cfg.zero.stage, cfg.batch.gradient_accumulation_steps,
                             static_cast<int>(cfg.zero.offload_optimizer.device), static_cast<int>(cfg.zero.offload_param.device));
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  zs::run::RunConfig c = cfg;
  c.recompute = {};
  return cache[key] = train(test::world().group(), c, kCkptSteps);
}

void check(zs::run::RunConfig cfg, const std::string& what) {
  const RunResult got = train(test::world().group(), cfg, kCkptSteps);
  expect_matches(got, plain(cfg), 1e-5, 1e-5,
                 fmt::format("{} stage {} np {} accumulation {}", what, cfg.zero.stage, test::world().group().size(),
                             cfg.batch.gradient_accumulation_steps));
}

class EveryStage : public ::testing::TestWithParam<std::tuple<int, int64_t>> {};

TEST_P(EveryStage, CheckpointedTrainingEqualsPlainTraining) {
  const auto [stage, accumulation] = GetParam();
  zs::run::RunConfig cfg = base(stage, accumulation);
  cfg.recompute.blocks = Blocks::kEvery;  // "all"
  check(cfg, "all blocks");
  cfg.recompute.cpu_checkpointing = true;
  check(cfg, "all blocks, cpu_checkpointing");
}

INSTANTIATE_TEST_SUITE_P(Stages, EveryStage,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(int64_t{1}, int64_t{3})),
                         [](const auto& info) {
                           return fmt::format("stage{}_accum{}", std::get<0>(info.param), std::get<1>(info.param));
                         });

TEST(RecomputeEngine, EveryChoiceAndStorageTrainsTheSame) {
  for (int stage : {0, 3}) {
    zs::run::RunConfig cfg = base(stage, 1);
    auto& ac = cfg.recompute;
    ac.blocks = Blocks::kEvery;
    ac.k = 2;
    check(cfg, "every 2nd block");
    ac.blocks = Blocks::kSelective;
    check(cfg, "selective");
    ac.blocks = Blocks::kFirst;
    ac.k = 1;
    ac.contiguous_memory_optimization = true;
    ac.synchronize_checkpoint_boundary = true;
    check(cfg, "first block, contiguous");
    ac.blocks = Blocks::kEvery;
    ac.cpu_checkpointing = true;
    check(cfg, "all blocks, contiguous on the host");
  }
}

TEST(RecomputeEngine, WithOffloadTrainsTheSame) {
  zs::run::RunConfig cfg = base(2, 1);
  cfg.zero.offload_optimizer.device = OffloadDevice::kCpu;
  cfg.recompute.blocks = Blocks::kEvery;
  check(cfg, "offload_optimizer cpu");
  cfg = base(3, 3);
  cfg.zero.offload_optimizer.device = OffloadDevice::kCpu;
  cfg.zero.offload_param.device = OffloadDevice::kCpu;
  cfg.recompute.blocks = Blocks::kEvery;
  cfg.recompute.cpu_checkpointing = true;
  check(cfg, "offload_optimizer and offload_param cpu, cpu_checkpointing");
}

TEST(RecomputeEngine, KeptInputsLiveWhereTheConfigSays) {
  const comm::Group& world = test::world().group();
  zs::run::RunConfig cfg = base(1, 1);
  const Engine::MemoryReport none = train(world, cfg, 2).memory;
  cfg.recompute.blocks = Blocks::kEvery;
  const Engine::MemoryReport device = train(world, cfg, 2).memory;
  cfg.recompute.cpu_checkpointing = true;
  const RunResult host = train(world, cfg, 2);
  EXPECT_LT(device.activation_peak_bytes, none.activation_peak_bytes);
  EXPECT_LE(host.memory.activation_peak_bytes, device.activation_peak_bytes);
  // The two blocks' kept inputs (micro-batch, seq_len, d_model) fp32 on the host, each 4096-rounded.
  const uint64_t input = static_cast<uint64_t>(cfg.batch.micro_batch_per_rank * tiny_gpt().seq_len * tiny_gpt().d_model) * 4;
  EXPECT_EQ(none.host_peak_bytes, 0u);
  EXPECT_GE(host.memory.host_peak_bytes, 2 * input);
  EXPECT_EQ(host.reports.back().transfers.host_to_device_bytes, 2 * input);  // copied back for the re-runs
  EXPECT_EQ(host.reports.back().transfers.device_to_host_bytes, 2 * input);
}

TEST(RecomputeEngine, RecomputeReportAndTooFewSlots) {
  const comm::Group& world = test::world().group();
  zs::run::RunConfig cfg = base(0, 1);
  cfg.recompute.blocks = Blocks::kEvery;
  cfg.recompute.contiguous_memory_optimization = true;
  {
    nn::GptModel model(*cfg.model);
    Engine engine(model, cfg, world);
    DatasetSource source(nn::Dataset::builtin(tiny_gpt().seq_len), 7);
    engine.train_batch(source);
    engine.train_batch(source);
    const Engine::RecomputeReport r = engine.recompute_report();
    EXPECT_EQ(r.blocks, "all");
    EXPECT_EQ(r.checkpointed_modules, 2);
    EXPECT_EQ(r.recomputes, 4);
    EXPECT_GT(r.recompute_s, 0.0);
    EXPECT_EQ(r.contiguous_buffer_bytes,
              2u * static_cast<uint64_t>(cfg.batch.micro_batch_per_rank * tiny_gpt().seq_len * tiny_gpt().d_model) * 4);
  }
  cfg.recompute.number_checkpoints = 1;
  nn::GptModel model(*cfg.model);
  Engine engine(model, cfg, world);
  DatasetSource source(nn::Dataset::builtin(tiny_gpt().seq_len), 7);
  try {
    engine.train_batch(source);
    FAIL() << "two kept inputs in one slot";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("activation_checkpointing.number_checkpoints"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zs::engine
