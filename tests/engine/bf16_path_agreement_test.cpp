// The ranks of a job take one bf16 product path (Note [ranks agree the bf16 path] in nn/layers.h): a
// rank whose own probe chose sgemm (as a probe slowed by load once did) trains on the kernel its
// peers chose, so the job computes with one arithmetic. Runs at np 1 and 2.
#include <gtest/gtest.h>

#include "nn/detail/gemm.h"
#include "nn/layers.h"
#include "tests/engine/train_harness.h"
#include "tests/support/mpi_test_env.h"
#include "run/run_config.h"

namespace zs::engine {
namespace {

using namespace test_harness;
using nn::detail::GemmPath;

constexpr int kAgreementSteps = 3;

RunResult run_bf16(GemmPath own_choice) {
  nn::detail::set_bf16_gemm_path(own_choice, "the test's own choice for this rank");
  const comm::Group& world = zs::test::world().group();
  return train(world, make_config(1, world.size(), Precision::kBf16, 1), kAgreementSteps);
}

TEST(Bf16PathAgreement, ARankWhoseProbeChoseSgemmTrainsOnItsPeersKernel) {
  if (!nn::bf16_products_vote().kernel_allowed) GTEST_SKIP() << "this process cannot run the bf16 kernel";
  const nn::detail::Bf16GemmChoice before = nn::detail::bf16_gemm_choice();
  const int rank = zs::test::world().group().rank();
  const RunResult agreed = run_bf16(GemmPath::kAvx512Bf16);
  EXPECT_EQ(nn::detail::bf16_gemm_path(), GemmPath::kAvx512Bf16);
  // Odd ranks start from sgemm: with a peer on the kernel, every rank ends on it.
  const bool alone = zs::test::world().group().size() == 1;
  const RunResult split = run_bf16(rank % 2 == 1 ? GemmPath::kSgemm : GemmPath::kAvx512Bf16);
  EXPECT_EQ(nn::detail::bf16_gemm_path(), GemmPath::kAvx512Bf16) << "rank " << rank;
  EXPECT_EQ(split.final_digest, agreed.final_digest) << "rank " << rank << ": the same arithmetic as the agreed run";
  EXPECT_EQ(split.losses, agreed.losses);
  EXPECT_EQ(split.memory.device_peak_bytes, agreed.memory.device_peak_bytes) << "rank " << rank;
  // Every rank on sgemm stays on sgemm (nobody chose the kernel).
  run_bf16(GemmPath::kSgemm);
  EXPECT_EQ(nn::detail::bf16_gemm_path(), GemmPath::kSgemm) << "rank " << rank << (alone ? " (alone)" : "");
  nn::detail::set_bf16_gemm_path(before.path, before.why);
}

}  // namespace
}  // namespace zs::engine
