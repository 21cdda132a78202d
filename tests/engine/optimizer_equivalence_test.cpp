// Every optimizer at every ZeRO stage against its own single-process run, the one-bit optimizers'
// communication saving, and the memory-reuse modes against the modes off.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "optim/cadam.h"
#include "optim/lamb.h"
#include "optim/lion.h"
#include "optim/onebit_adam.h"
#include "tests/engine/train_harness.h"
#include "tests/support/mpi_test_env.h"
#include "tests/support/temp_dir.h"
#include "run/run_config.h"

namespace zs::engine {
namespace {

using namespace test_harness;

constexpr int kCompressedSteps = 16;

zs::run::RunConfig with_optimizer(zs::run::RunConfig c, const std::string& type) {
  c.optimizer = OptimizerConfig(type);
  if (type == "CAdam") {
    // Lion's rule: a learning rate several times smaller and a decay several times larger than AdamW's.
    c.optimizer.params<optim::CAdamConfig>() = {.lr = 1e-3, .betas = {0.9, 0.99}, .weight_decay = 0.3};
    c.scheduler.warmup_max_lr = 1e-3;
  } else if (type == "Lion") {
    c.optimizer.params<optim::LionConfig>() = {.lr = 1e-3, .betas = {0.9, 0.99}, .weight_decay = 0.3};
    c.scheduler.warmup_max_lr = 1e-3;
  } else if (type == "Lamb") {
    // Decay on, so the trust ratio's ||u|| includes the decay term; the default clamps [0.01, 10].
    // The ratio is about ||w|| / ||u|| = 0.02 here (init std 0.02, Adam-sized u), so lr 0.05 moves an
    // element by about 1e-3 per step, as Adam's 1e-3 does: a trust ratio taken from a rank's part of
    // a tensor instead of the whole tensor then shows beyond the 1e-5 tolerance.
    c.optimizer.params<optim::LambConfig>() = {.lr = 5e-2, .weight_decay = 0.01};
    c.scheduler.warmup_max_lr = 5e-2;
  } else if (type == "OneBitAdam") {
    // A short run: beta2 0.9 lets the variance settle before it freezes (DeepSpeed freezes after
    // thousands of steps with 0.999; frozen too early, the un-bias-corrected variance is far too small).
    c.optimizer.params<optim::OneBitAdamConfig>() = {.lr = 1e-3, .betas = {0.9, 0.9}, .weight_decay = 0.01, .freeze_step = 8};
    c.scheduler.warmup_max_lr = 1e-3;
  } else if (type == "ZeroOneAdam") {
    // Every phase within the run: variance steps at growing intervals until step 6, then local steps
    // with the sync interval growing to 4.
    c.optimizer.params<optim::ZeroOneAdamConfig>() = {.lr = 1e-3, .betas = {0.9, 0.9}, .weight_decay = 0.01, .var_freeze_step = 8, .var_update_scaler = 2,
                            .local_step_scaler = 2, .local_step_clipper = 2};
    c.scheduler.warmup_max_lr = 1e-3;
  }
  return c;
}

// 0/1 Adam takes local steps only where each rank holds whole weights (stage 0); at stages 1-3 every
// frozen step synchronises (Note [compressed optimizers] in engine/compressed_step.cpp), so those
// stages compare with stage 1.
int reference_stage(const std::string& type, int stage) { return type == "ZeroOneAdam" && stage > 0 ? 1 : 0; }

int steps_for(const std::string& type) { return type == "OneBitAdam" || type == "ZeroOneAdam" ? kCompressedSteps : kSteps; }

const RunResult& single_process(const std::string& type, int stage) {
  static std::map<std::pair<std::string, int>, RunResult> cache;
  auto key = std::make_pair(type, stage);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const comm::Group& world = test::world().group();
  comm::Group self = world.split(world.rank(), 0, "self");
  return cache[key] = train(self, with_optimizer(make_config(1, 1, Precision::kFp32, stage), type), steps_for(type));
}

// The run on the whole world at `stage` (computed once per type and stage).
const RunResult& on_world(const std::string& type, int stage) {
  static std::map<std::pair<std::string, int>, RunResult> cache;
  auto key = std::make_pair(type, stage);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const comm::Group& world = test::world().group();
  return cache[key] = train(world, with_optimizer(make_config(1, world.size(), Precision::kFp32, stage), type), steps_for(type));
}

// Fraction of elements that differ by more than `atol`.
double fraction_differing(const std::vector<float>& a, const std::vector<float>& b, double atol) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::abs(double(a[i]) - b[i]) > atol;
  return a.empty() ? 0.0 : double(n) / double(a.size());
}

class EveryOptimizer : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(EveryOptimizer, OneRankGivesTheSameBitsAtEveryStage) {
  const auto& [type, stage] = GetParam();
  EXPECT_EQ(single_process(type, stage).final_digest, single_process(type, reference_stage(type, stage)).final_digest)
      << type << " stage " << stage;
}

TEST_P(EveryOptimizer, MatchesItsSingleProcessRun) {
  const auto& [type, stage] = GetParam();
  const comm::Group& world = test::world().group();
  const std::string what = fmt::format("{} stage {} np {}", type, stage, world.size());
  const RunResult& got = on_world(type, stage);
  const RunResult& ref = single_process(type, reference_stage(type, stage));
  if (type == "Adam" || type == "AdamW" || type == "Lamb") {
    // Lamb: its per-tensor norms are summed per shard and allreduced (Note [two-pass step]).
    expect_matches(got, ref, 1e-5, 1e-5, what);
  } else if (type == "CAdam" || type == "Lion") {
    // The sign of the interpolated momentum flips where it is within rounding of zero: summing the
    // gradients in another order moves such an element by 2 lr. Everything else matches. The bound
    // depends on the order the ranks' gradients are summed in: OpenMPI's gave 0.2%, the shared-memory
    // collectives' rank order (comm/detail/shm.h) gives up to 0.73% of qkv at np 3; both are fp32 sums.
    for (size_t i = 0; i < ref.losses.size(); ++i) EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-4 * ref.losses[i]) << what;
    EXPECT_LE(fraction_differing(got.wte, ref.wte, 1e-5), 1e-2) << what;
    EXPECT_LE(fraction_differing(got.qkv, ref.qkv, 1e-5), 1e-2) << what;
  } else {
    // The one-bit optimizers compress what they average: with more ranks the compression error is a
    // different one. The exact steps before the first compressed one match like Adam's; after that
    // every step stays within 10% and the last five together within 3%.
    size_t exact = 0;
    while (exact < got.reports.size() && !got.reports[exact].compressed) ++exact;
    EXPECT_GE(exact, 2u) << what;
    for (size_t i = 0; i <= exact && i < ref.losses.size(); ++i) {
      EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-5 * ref.losses[i]) << what << " step " << i + 1;
    }
    for (size_t i = 0; i < ref.losses.size(); ++i) EXPECT_NEAR(got.losses[i], ref.losses[i], 0.1 * ref.losses[i]) << what << " step " << i + 1;
    double got_tail = 0, ref_tail = 0;
    for (size_t i = ref.losses.size() - 5; i < ref.losses.size(); ++i) {
      got_tail += got.losses[i];
      ref_tail += ref.losses[i];
    }
    EXPECT_NEAR(got_tail, ref_tail, 0.03 * ref_tail) << what << ": mean of the last five losses";
  }
}

TEST_P(EveryOptimizer, StagesAgreeAtThisWorldSize) {
  const auto& [type, stage] = GetParam();
  const int base_stage = reference_stage(type, stage);
  if (stage == base_stage) GTEST_SKIP() << "the reference stage";
  const comm::Group& world = test::world().group();
  const std::string what = fmt::format("{} stage {} vs stage {}, np {}", type, stage, base_stage, world.size());
  const RunResult& got = on_world(type, stage);
  const RunResult& base = on_world(type, base_stage);
  // Stages reduce in a different order (allreduce vs reduce-scatter, the norm summed per shard), so the
  // gradients differ in their last bits. Smooth optimizers keep that at 1e-4; a one-bit compression
  // turns a last-bit change of an element near zero into a sign flip, so after the first compressed
  // step the one-bit optimizers get 2e-3.
  bool compressed_yet = false;
  for (size_t i = 0; i < base.losses.size(); ++i) {
    const double rtol = compressed_yet ? 2e-3 : 1e-4;
    EXPECT_NEAR(got.losses[i], base.losses[i], rtol * base.losses[i]) << what << " step " << i + 1;
    compressed_yet = compressed_yet || base.reports[i].compressed;
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, EveryOptimizer,
                         ::testing::Combine(::testing::Values("Adam", "CAdam", "Lion", "Lamb", "OneBitAdam", "ZeroOneAdam"),
                                            ::testing::Values(0, 1, 2, 3)),
                         [](const auto& info) { return fmt::format("{}_stage{}", std::get<0>(info.param), std::get<1>(info.param)); });

// OneCycle's momentum reaches the optimizer on every step path: with cycle_min_mom = cycle_max_mom the
// schedule's betas are (0.85, 0.99) on every step (DeepSpeed sets beta2 to 0.99), so the run equals
// one whose optimizer was configured with those betas, and differs from the configured defaults.
TEST(OneCycle, MomentumCyclingSetsTheOptimizersBetas) {
  const comm::Group& world = test::world().group();
  for (int stage : {0, 3}) {
    zs::run::RunConfig cycled = make_config(1, world.size(), Precision::kFp32, stage);
    cycled.scheduler = {.type = optim::ScheduleType::kOneCycle};
    cycled.scheduler.one_cycle = {.cycle_min_lr = 1e-3, .cycle_max_lr = 3e-3, .cycle_first_step_size = 3,
                                  .cycle_min_mom = 0.85, .cycle_max_mom = 0.85};
    zs::run::RunConfig configured = cycled;
    configured.scheduler.one_cycle.cycle_momentum = false;
    configured.optimizer.params<optim::AdamConfig>().betas = {0.85, 0.99};
    zs::run::RunConfig defaults = cycled;
    defaults.scheduler.one_cycle.cycle_momentum = false;
    const RunResult a = train(world, cycled, 6);
    const RunResult b = train(world, configured, 6);
    const RunResult c = train(world, defaults, 6);
    EXPECT_EQ(a.final_digest, b.final_digest) << "stage " << stage;
    EXPECT_NE(a.final_digest, c.final_digest) << "stage " << stage;
    EXPECT_NEAR(a.reports[3].lr, 3e-3, 1e-15);  // the peak: iteration 2 of a 3-step rise
  }
}

TEST(OneBitOptimizers, CompressedStepsSendAFractionOfTheBytes) {
  const comm::Group& world = test::world().group();
  if (world.size() == 1) GTEST_SKIP() << "one rank sends nothing";
  for (const std::string type : {"OneBitAdam", "ZeroOneAdam"}) {
    RunResult r = train(world, with_optimizer(make_config(1, world.size(), Precision::kFp32, 0), type), kCompressedSteps);
    double exact = 0, compressed = 0;
    int n_exact = 0, n_compressed = 0;
    for (size_t i = 1; i < r.reports.size(); ++i) {  // the first step also carries set-up traffic
      const StepReport& s = r.reports[i];
      (s.compressed ? compressed : exact) += static_cast<double>(s.comm_bytes_sent);
      (s.compressed ? n_compressed : n_exact) += 1;
    }
    ASSERT_GT(n_exact, 0) << type;
    ASSERT_GT(n_compressed, 0) << type;
    // fp32 gradients: 32 bits per element against 1 bit plus a scale per chunk; 0/1 Adam's local steps
    // between syncs send nothing but the loss.
    EXPECT_LT(compressed / n_compressed, exact / n_exact / 20) << type;
  }
}

TEST(MemoryModes, ReleasingTheFp32GradientCopyChangesNothingButMemory) {
  const comm::Group& world = test::world().group();
  for (int stage = 0; stage <= 3; ++stage) {
    zs::run::RunConfig on = make_config(1, world.size(), Precision::kBf16, stage);
    zs::run::RunConfig off = on;
    off.memory.release_fp32_grad = false;
    RunResult a = train(world, on), b = train(world, off);
    EXPECT_EQ(a.final_digest, b.final_digest) << "stage " << stage;
    EXPECT_GT(b.memory.model_states.grads, a.memory.model_states.grads) << "stage " << stage;
    // The copy holds the stepped elements in fp32: the optimizer's fp32 master has the same size.
    EXPECT_EQ(b.memory.model_states.grads - a.memory.model_states.grads, a.memory.model_states.optimizer / 3) << "stage " << stage;
  }
}

TEST(MemoryModes, ReusingTheFp32ParamKeepsTheMasterExactly) {
  const comm::Group& world = test::world().group();
  for (int stage = 0; stage <= 3; ++stage) {
    zs::run::RunConfig off = make_config(1, world.size(), Precision::kBf16, stage);
    zs::run::RunConfig on = off;
    on.memory.reuse_fp32_param = true;
    RunResult a = train(world, off), b = train(world, on);
    // Same master weights from the same start: the digest is of the fp32 masters.
    EXPECT_EQ(a.initial_digest, b.initial_digest) << "stage " << stage;
    // The masters are stored exactly, but the bf16 copies round half-way cases away from zero instead of
    // to even (Note [reuse_fp32_param]): about one element in 2^17 per step, so the runs drift apart by
    // bf16 ulps of single elements. The lossless encoding itself is checked bit for bit in
    // reuse_fp32_param_test.
    for (size_t i = 0; i < a.losses.size(); ++i) {
      EXPECT_NEAR(a.losses[i], b.losses[i], 1e-4 * a.losses[i]) << "stage " << stage << " step " << i + 1;
    }
    EXPECT_LE(max_abs_diff(a.wte, b.wte), 1e-3) << "stage " << stage;
    // 4-byte master replaced by a 2-byte residual: optimizer bytes go from 12 to 10 per stepped element.
    EXPECT_EQ(b.memory.model_states.optimizer * 12, a.memory.model_states.optimizer * 10) << "stage " << stage;
  }
}

// Pass 1 of Lamb's two-pass step reads the master without writing it; with reuse_fp32_param that is a
// decode into scratch (Note [two-pass step]). The masters stay exact, as for AdamW above.
TEST(MemoryModes, LambWithTheReusedFp32ParamMatchesTheModeOff) {
  const comm::Group& world = test::world().group();
  for (int stage = 0; stage <= 3; ++stage) {
    zs::run::RunConfig off = with_optimizer(make_config(1, world.size(), Precision::kBf16, stage), "Lamb");
    zs::run::RunConfig on = off;
    on.memory.reuse_fp32_param = true;
    RunResult a = train(world, off), b = train(world, on);
    for (size_t i = 0; i < a.losses.size(); ++i) {
      EXPECT_NEAR(a.losses[i], b.losses[i], 1e-4 * a.losses[i]) << "stage " << stage << " step " << i + 1;
    }
    EXPECT_LE(max_abs_diff(a.wte, b.wte), 1e-3) << "stage " << stage;
    EXPECT_LT(a.losses.back(), a.losses.front()) << "stage " << stage;
  }
}

}  // namespace
}  // namespace zs::engine

namespace zs::engine {
namespace {

using namespace test_harness;

// Offload none / cpu / nvme give the same bits (Note [offload] in engine/model_states_nvme.cpp): the
// arithmetic is the same, only where the states live changes.
TEST(Offload, NoneCpuAndNvmeGiveTheSameBits) {
  const comm::Group& world = test::world().group();
  // Every rank names its own directory the same way: one per rank, so no file is shared.
  test::TempDir dir;  // removed after (the engine removes its own files first)
  for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
    for (int stage = 1; stage <= 3; ++stage) {
      zs::run::RunConfig base = make_config(1, world.size(), precision, stage);
      base.zero.sub_group_size = 40'000;  // several sub-groups even on this tiny model
      const RunResult ref = train(world, base);
      for (OffloadDevice device : {OffloadDevice::kCpu, OffloadDevice::kNvme}) {
        zs::run::RunConfig cfg = base;
        cfg.zero.offload_optimizer = {.device = device, .nvme_path = dir.path()};
        if (stage == 3) cfg.zero.offload_param = {.device = device, .nvme_path = dir.path()};
        const std::string what = fmt::format("{} stage {} offload {}", precision_name(precision), stage, offload_device_name(device));
        RunResult got = train(world, cfg);
        EXPECT_EQ(got.final_digest, ref.final_digest) << what;
        for (size_t i = 0; i < ref.losses.size(); ++i) EXPECT_EQ(got.losses[i], ref.losses[i]) << what << " step " << i + 1;
        // The states moved off the device: the arena peak drops, the host (and NVMe) tiers hold them.
        EXPECT_LT(got.memory.device_peak_bytes, ref.memory.device_peak_bytes) << what;
        EXPECT_GT(got.memory.host_peak_bytes, 0u) << what;
        if (device == OffloadDevice::kNvme) {
          EXPECT_GT(got.memory.nvme_bytes, 0u) << what;
        } else {
          EXPECT_EQ(got.memory.nvme_bytes, 0u) << what;
        }
      }
    }
  }
  // Every swap file was removed when its engine went.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

// Lamb's two-pass step with its states on the host gives the same bits; NVMe is refused by name
// (Note [two-pass step] in engine/model_states_step.cpp).
TEST(Offload, LambStepsWithCpuOffloadAndRefusesNvme) {
  const comm::Group& world = test::world().group();
  test::TempDir dir;
  for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
    for (int stage = 1; stage <= 3; ++stage) {
      zs::run::RunConfig base = with_optimizer(make_config(1, world.size(), precision, stage), "Lamb");
      zs::run::RunConfig cpu = base;
      cpu.zero.offload_optimizer = {.device = OffloadDevice::kCpu};
      const std::string what = fmt::format("{} stage {}", precision_name(precision), stage);
      EXPECT_EQ(train(world, cpu).final_digest, train(world, base).final_digest) << what;
    }
  }
  zs::run::RunConfig nvme = with_optimizer(make_config(1, world.size(), Precision::kBf16, 2), "Lamb");
  nvme.zero.offload_optimizer = {.device = OffloadDevice::kNvme, .nvme_path = dir.path()};
  try {
    train(world, nvme);
    ADD_FAILURE() << "Lamb with NVMe offload was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("Lamb needs each parameter tensor's norms"), std::string::npos) << e.what();
  }
}

TEST(Offload, CAdamStatesStreamThroughNvmeToo) {
  const comm::Group& world = test::world().group();
  test::TempDir dir;  // removed after (the engine removes its own files first)
  zs::run::RunConfig base = with_optimizer(make_config(1, world.size(), Precision::kBf16, 2), "CAdam");
  base.zero.sub_group_size = 40'000;
  zs::run::RunConfig cfg = base;
  cfg.zero.offload_optimizer = {.device = OffloadDevice::kNvme, .nvme_path = dir.path()};
  EXPECT_EQ(train(world, cfg).final_digest, train(world, base).final_digest);
}

}  // namespace
}  // namespace zs::engine
