// communication_data_type: gradients averaged in bf16 (or fp16) send exactly half the bytes of fp32
// averaging at every ZeRO stage, and train like it (within the precision test's 2%); bf16 training
// averages in bf16 unless told otherwise (DeepSpeed's default). Runs at np 1, 2, 3.
#include <gtest/gtest.h>

#include "tests/engine/train_harness.h"
#include "tests/support/mpi_test_env.h"
#include "run/run_config.h"

namespace zs::engine {
namespace {

using namespace test_harness;
using memory::DType;

constexpr int kCommSteps = 6;
constexpr double kLossRtol = 0.02;  // tests/engine/precision_test.cpp's bound (bf16 against fp32)

RunResult run(Precision precision, int stage, std::optional<DType> comm_dtype) {
  const comm::Group& world = zs::test::world().group();
  zs::run::RunConfig cfg = make_config(1, world.size(), precision, stage);
  cfg.communication_data_type = comm_dtype;
  return train(world, cfg, kCommSteps);
}

// Every step's gradient bytes of `half` are exactly half of `full`'s (0 = 0 on one rank).
void expect_half_bytes(const RunResult& half, const RunResult& full, const std::string& what) {
  const bool one_rank = zs::test::world().group().size() == 1;
  for (size_t i = 0; i < full.reports.size(); ++i) {
    const uint64_t h = half.reports[i].grad_comm_bytes_sent, f = full.reports[i].grad_comm_bytes_sent;
    EXPECT_EQ(2 * h, f) << what << ", step " << i + 1;
    EXPECT_EQ(f == 0, one_rank) << what << ", step " << i + 1 << ": gradients were averaged, so bytes moved";
    // The gradient bytes are part of the step's whole traffic.
    EXPECT_LE(h, half.reports[i].comm_bytes_sent) << what;
  }
}

TEST(CommDtype, Bf16GradientTrafficIsHalfOfFp32AtEveryStage) {
  for (int stage = 0; stage <= 3; ++stage) {
    const std::string what = fmt::format("fp32 training, stage {}", stage);
    const RunResult full = run(Precision::kFp32, stage, std::nullopt);  // the compute dtype: fp32
    const RunResult half = run(Precision::kFp32, stage, DType::kBF16);
    expect_half_bytes(half, full, what);
    for (size_t i = 0; i < full.losses.size(); ++i) {
      EXPECT_NEAR(half.losses[i], full.losses[i], kLossRtol * full.losses[i]) << what << ", step " << i + 1;
    }
    EXPECT_LT(half.losses.back(), half.losses.front()) << what << ": it trains";
  }
}

TEST(CommDtype, Bf16TrainingAveragesInBf16UnlessToldFp32) {
  for (int stage = 0; stage <= 3; ++stage) {
    const std::string what = fmt::format("bf16 training, stage {}", stage);
    const RunResult by_default = run(Precision::kBf16, stage, std::nullopt);
    const RunResult bf16 = run(Precision::kBf16, stage, DType::kBF16);
    const RunResult fp32 = run(Precision::kBf16, stage, DType::kF32);
    // The default is the compute dtype: the very same run as an explicit bf16.
    EXPECT_EQ(by_default.final_digest, bf16.final_digest) << what;
    expect_half_bytes(bf16, fp32, what);
    // bf16 values sum to the same fp32 total and round once either way: averaging bf16 gradients in
    // bf16 on the wire loses nothing against fp32's wire.
    EXPECT_EQ(bf16.final_digest, fp32.final_digest) << what;
  }
}

TEST(CommDtype, Fp16TrainingAveragesInFp16OrBf16) {
  for (int stage : {0, 2}) {
    const std::string what = fmt::format("fp16 training, stage {}", stage);
    const RunResult fp16 = run(Precision::kFp16, stage, std::nullopt);
    const RunResult fp32 = run(Precision::kFp16, stage, DType::kF32);
    const RunResult bf16 = run(Precision::kFp16, stage, DType::kBF16);
    expect_half_bytes(fp16, fp32, what);
    expect_half_bytes(bf16, fp32, what + ", bf16 wire");
    EXPECT_EQ(fp16.final_digest, fp32.final_digest) << what;
    for (size_t i = 0; i < fp32.losses.size(); ++i) {
      EXPECT_NEAR(bf16.losses[i], fp32.losses[i], kLossRtol * fp32.losses[i]) << what << ", step " << i + 1;
    }
  }
}

}  // namespace
}  // namespace zs::engine
