// Budget-driven recompute (estimate/recompute_budget.h): for three budgets between "no recompute
// fits" and "full recompute needed" the choice is the fewest blocks whose predicted peak fits, and the
// run then fits an arena of that budget (its reserved peak equal to the prediction on one rank); a
// budget below full recompute's need, or above the arena, is a ConfigError before any training.
#include <gtest/gtest.h>

#include <string>

#include "core/errors.h"
#include "engine/dataset_source.h"
#include "engine/engine.h"
#include "estimate/recompute_budget.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "tests/support/mpi_test_env.h"
#include "run/run_config.h"

namespace zs::engine {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

// Activations dominate: each block holds about 3.5 MiB (its (8, 4, 128, 128) probabilities 2 MiB).
zs::run::RunConfig make_config(int world, int64_t memory_mb) {
  zs::run::RunConfig c;
  c.batch = resolve_batch(0, 8, 1, world);
  c.zero.stage = world > 1 ? 2 : 0;
  c.device.memory_mb = memory_mb;
  c.model = nn::GptConfig{.n_layer = 4, .d_model = 64, .n_head = 4, .seq_len = 128, .vocab_size = 256};
  return c;
}

RecomputeChoice choose(int world, int64_t memory_mb, int64_t budget_mb) {
  zs::run::RunConfig c = make_config(world, memory_mb);
  c.recompute.device_budget_mb = budget_mb;
  return resolve_recompute_budget(c, world);
}

std::string error_of(int world, int64_t memory_mb, int64_t budget_mb) {
  try {
    choose(world, memory_mb, budget_mb);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(RecomputeBudget, ThreeBudgetsBetweenNoneAndFullRecomputeFit) {
  const comm::Group& world = test::world().group();
  const int ranks = world.size();
  // The two ends: a budget of the whole arena needs no recompute; just below that, every block's peak is measured.
  const RecomputeChoice roomy = choose(ranks, 1024, 1024);
  EXPECT_TRUE(roomy.applies);
  EXPECT_EQ(roomy.blocks, 0);
  const int64_t none_mb = static_cast<int64_t>((roomy.none_peak_bytes + kMiB - 1) / kMiB);
  const RecomputeChoice tight = choose(ranks, 1024, none_mb - 1);
  ASSERT_GT(tight.all_peak_bytes, 0u);
  const int64_t all_mb = static_cast<int64_t>((tight.all_peak_bytes + kMiB - 1) / kMiB);
  ASSERT_GE(none_mb - all_mb, 6) << "the recompute span must hold three distinct budgets";
  int64_t previous_blocks = 4;
  for (int i = 0; i < 3; ++i) {
    const int64_t budget_mb = all_mb + i * (none_mb - 1 - all_mb) / 3;
    SCOPED_TRACE(fmt::format("budget {} MiB (full recompute {} MiB, none {} MiB)", budget_mb, all_mb, none_mb));
    zs::run::RunConfig cfg = make_config(ranks, budget_mb);  // the arena is the budget: "auto"
    cfg.recompute.budget_auto = true;
    const RecomputeChoice c = resolve_recompute_budget(cfg, ranks);
    EXPECT_GE(c.blocks, 1);
    EXPECT_LE(c.blocks, previous_blocks);  // a larger budget never needs more blocks
    previous_blocks = c.blocks;
    EXPECT_LE(c.predicted_peak_bytes, static_cast<uint64_t>(budget_mb) * kMiB);
    EXPECT_EQ(cfg.recompute.blocks, RecomputeConfig::Blocks::kFirst);
    EXPECT_EQ(cfg.recompute.k, c.blocks);
    if (c.blocks > 1) {  // the fewest: one block fewer does not fit
      zs::run::RunConfig fewer = make_config(ranks, 1024);
      fewer.recompute.device_budget_mb = budget_mb;
      EXPECT_EQ(resolve_recompute_budget(fewer, ranks).blocks, c.blocks);
    }
    // The run fits the arena of that budget.
    nn::GptModel model(*cfg.model);
    Engine engine(model, cfg, world);
    DatasetSource source(nn::Dataset::builtin(128), 3);
    engine.train_batch(source);
    engine.train_batch(source);
    const Engine::MemoryReport m = engine.memory_report();
    EXPECT_LE(m.device_reserved_peak_bytes, static_cast<uint64_t>(budget_mb) * kMiB);
    if (ranks == 1) EXPECT_EQ(m.device_reserved_peak_bytes, c.predicted_peak_bytes);
    EXPECT_EQ(engine.recompute_report().checkpointed_modules, c.blocks);
  }
  // Below full recompute's need: an error naming the key and the peak needed.
  const std::string e = error_of(ranks, 1024, all_mb - 1);
  EXPECT_NE(e.find("activation_checkpointing.device_budget_mb"), std::string::npos) << e;
  EXPECT_NE(e.find("every one of the 4 blocks recomputed"), std::string::npos) << e;
}

TEST(RecomputeBudget, RefusedWhereItCannotApply) {
  const int ranks = test::world().group().size();
  EXPECT_NE(error_of(ranks, 64, 128).find("exceeds the device arena"), std::string::npos);
  zs::run::RunConfig c = make_config(ranks, 64);
  c.model.reset();
  c.recompute.budget_auto = true;
  try {
    resolve_recompute_budget(c, ranks);
    FAIL() << "a budget without the built-in GPT";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("built-in GPT"), std::string::npos) << e.what();
  }
  // An unresolved budget reaching the engine is refused by name.
  zs::run::RunConfig unresolved = make_config(ranks, 64);
  unresolved.recompute.budget_auto = true;
  nn::GptModel model(*unresolved.model);
  EXPECT_THROW(Engine(model, unresolved, test::world().group()), ConfigError);
}

}  // namespace
}  // namespace zs::engine
