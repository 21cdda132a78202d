// The device-backend seam (memory/backend.h): the engine reaches device memory only through the
// backend. Run over the guarded backend, whose device memory faults outside backend operations and
// DeviceAccess scopes, every stage, precision, offload target and optimizer family trains to the same
// bits as over the cpu backend, and host<->device transfers are counted per step. (A stray access
// dying is tested in guarded_engine_test.cpp: death tests cannot fork under MPI.)
#include <gtest/gtest.h>

#include <cctype>

#include "engine/flat_layout.h"
#include "engine/partition.h"
#include "memory/guarded_backend.h"
#include "optim/onebit_adam.h"
#include "tests/engine/train_harness.h"
#include "tests/support/mpi_test_env.h"
#include "tests/support/temp_dir.h"
#include "run/run_config.h"

namespace zs::engine {
namespace {

using namespace test_harness;

constexpr int kSeamSteps = 4;

struct SeamCase {
  int stage;
  Precision precision;
  OffloadDevice offload;  // optimizer at stages 1-3, parameters too at stage 3
  std::string optimizer = "AdamW";
  bool reuse_fp32_param = false;
};

std::string name_of(const SeamCase& c) {
  return fmt::format("stage {} {} offload {} {}{}", c.stage, precision_name(c.precision), offload_device_name(c.offload),
                     c.optimizer, c.reuse_fp32_param ? " reuse_fp32_param" : "");
}

zs::run::RunConfig seam_config(const SeamCase& c, int world, const std::string& dir, const std::string& backend) {
  zs::run::RunConfig cfg = make_config(1, world, c.precision, c.stage);
  cfg.device.backend = backend;
  if (c.optimizer != "AdamW") cfg.optimizer = OptimizerConfig(c.optimizer);
  if (c.optimizer == "OneBitAdam") {
    cfg.optimizer.params<optim::OneBitAdamConfig>() = {.lr = 1e-3, .betas = {0.9, 0.9}, .weight_decay = 0.01, .freeze_step = 2};
  }
  cfg.memory.reuse_fp32_param = c.reuse_fp32_param;
  if (c.offload != OffloadDevice::kNone) {
    cfg.zero.offload_optimizer.device = c.offload;
    cfg.zero.offload_optimizer.nvme_path = dir;
    cfg.zero.sub_group_size = 4096;  // several sub-groups
    if (c.stage == 3) {
      cfg.zero.offload_param.device = c.offload;
      cfg.zero.offload_param.nvme_path = dir;
    }
  }
  return cfg;
}

class Seam : public ::testing::TestWithParam<SeamCase> {};

TEST_P(Seam, GuardedBackendTrainsToTheSameBitsAsCpu) {
  const SeamCase c = GetParam();
  const comm::Group& world = test::world().group();
  test::TempDir dir;
  const RunResult cpu = train(world, seam_config(c, world.size(), dir.path(), "cpu"), kSeamSteps);
  const RunResult guarded = train(world, seam_config(c, world.size(), dir.path(), "guarded"), kSeamSteps);
  EXPECT_EQ(guarded.final_digest, cpu.final_digest) << name_of(c);
  EXPECT_EQ(guarded.losses, cpu.losses) << name_of(c);
  EXPECT_EQ(guarded.memory.device_peak_bytes, cpu.memory.device_peak_bytes) << name_of(c);
}

INSTANTIATE_TEST_SUITE_P(
    Engine, Seam,
    ::testing::Values(SeamCase{0, Precision::kFp32, OffloadDevice::kNone}, SeamCase{0, Precision::kBf16, OffloadDevice::kNone},
                      SeamCase{1, Precision::kBf16, OffloadDevice::kNone}, SeamCase{2, Precision::kFp16, OffloadDevice::kNone},
                      SeamCase{3, Precision::kBf16, OffloadDevice::kNone}, SeamCase{3, Precision::kFp32, OffloadDevice::kNone},
                      SeamCase{1, Precision::kBf16, OffloadDevice::kCpu}, SeamCase{2, Precision::kFp32, OffloadDevice::kCpu},
                      SeamCase{3, Precision::kBf16, OffloadDevice::kCpu}, SeamCase{2, Precision::kBf16, OffloadDevice::kNvme},
                      SeamCase{3, Precision::kBf16, OffloadDevice::kNvme},
                      SeamCase{1, Precision::kBf16, OffloadDevice::kNone, "CAdam"},
                      SeamCase{2, Precision::kBf16, OffloadDevice::kCpu, "Lion"},
                      SeamCase{1, Precision::kBf16, OffloadDevice::kNone, "OneBitAdam"},
                      SeamCase{2, Precision::kBf16, OffloadDevice::kNone, "AdamW", true}),
    [](const ::testing::TestParamInfo<SeamCase>& info) {
      std::string n = name_of(info.param);
      for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
      return n;
    });

// What offload moves, counted by the backend: at stage 2 with the optimizer on the host, each step
// sends this rank's owned part of every reduced gradient bucket to the host and the updated parameter
// elements of its shard back (the stage's allgather then spreads parameters between ranks on the
// device). Step 1 also carries the initial digest's reads, so step 2 is checked.
TEST(Transfers, OffloadStepMovesTheShardBothWays) {
  const comm::Group& world = test::world().group();
  test::TempDir dir;
  const SeamCase c{2, Precision::kBf16, OffloadDevice::kCpu};
  const zs::run::RunConfig cfg = seam_config(c, world.size(), dir.path(), "cpu");
  const RunResult r = train(world, cfg, 2);
  nn::GptModel model(tiny_gpt());
  nn::assign_names(model);
  const FlatLayout layout(model.all_params());
  const Partition part(layout.total(), world.size(), world.rank());
  uint64_t grads = 0, params = 0;
  for (const BucketPlan& b : plan_buckets(layout, static_cast<size_t>(cfg.zero.reduce_bucket_size))) {
    grads += 2 * part.owned(b.range).size;
  }
  for (const ParamSlot& s : layout.slots()) params += 2 * s.range().intersect(part.mine).size;
  EXPECT_EQ(r.reports[1].transfers.device_to_host_bytes, grads) << "bf16 gradient shard to the host";
  EXPECT_EQ(r.reports[1].transfers.host_to_device_bytes, params) << "bf16 parameter shard back";
  // Without offload nothing crosses.
  const RunResult none = train(world, seam_config({2, Precision::kBf16, OffloadDevice::kNone}, world.size(), dir.path(), "cpu"), 2);
  EXPECT_EQ(none.reports[1].transfers.total(), 0u);
}

}  // namespace
}  // namespace zs::engine
