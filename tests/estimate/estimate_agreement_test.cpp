// The estimator against the engine: every rank builds a real Engine, trains two steps and compares the
// model-state bytes it allocated with estimate_memory's figure for that rank (exactly), the measured
// gradient staging and gathered-parameter peaks with the estimator's upper bounds, and the device
// arena's peak and activation peak with the estimator's measurement (the engine's own code over the
// measuring backend, estimate/measure.h). Run at 1, 2 and 3 ranks;
// d_model 30 makes the flat layout split unevenly. A ZeRO stage this build's config parser refuses is
// skipped, so the test covers each stage as soon as the engine offers it.
// Offload (ZeRO-Offload / ZeRO-Infinity): for cpu and nvme at stages 1-3 (swap files in a fresh
// directory per rank), the model states on each tier (Engine::MemoryReport::device/host/nvme_states),
// the swap files' size (nvme_bytes) and the host peak (host_peak_bytes: host states + the NVMe step's
// buffers, exactly; + the stage-3 NVMe staging, within its bound) equal the estimate.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/json.h"
#include "engine/config.h"
#include "engine/dataset_source.h"
#include "engine/engine.h"
#include "estimate/estimate.h"
#include "examples/mlp_model.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "optim/onebit_adam.h"
#include "tests/support/mpi_test_env.h"
#include "tests/support/temp_dir.h"
#include "run/run_config.h"

namespace zs::engine {
namespace {

nn::GptConfig tiny_gpt() { return {.n_layer = 2, .d_model = 30, .n_head = 3, .seq_len = 16, .vocab_size = 256}; }

bool stage_available(int stage) {
  try {
    zs::run::parse_run_config(parse_json_text(fmt::format(R"({{"train_batch_size": 1, "zero_optimization": {{"stage": {}}}}})", stage)), 1);
    return true;
  } catch (const ConfigError&) {
    return false;
  }
}

zs::run::RunConfig make_config(int world, Precision precision, int stage) {
  zs::run::RunConfig c;
  c.zero.stage = stage;
  c.zero.reduce_bucket_size = 3000;         // many buckets
  c.zero.stage3_prefetch_bucket_size = 4000;  // a prefetch window of a few modules
  c.zero.stage3_param_persistence_threshold = 100;  // only the LayerNorms stay gathered
  c.batch = resolve_batch(0, 2, 1, world);
  c.precision = precision;
  c.device.memory_mb = 64;
  c.model = tiny_gpt();
  return c;
}

// The device arena's peak against the estimator's measurement (Note [measured estimate] in
// estimate/measure.cpp). On one rank every collective is a no-op in both runs, so the measurement is
// the run's peak, byte for byte and category by category. With more ranks the measurement keeps
// launched gradient buckets in flight until kMaxInFlight newer ones push them out; a real reduction
// that test() finds done earlier frees its staging sooner, so the prediction may exceed the run's
// peak by a bucket or two (a few % of this tiny model), never fall short of it. The activations do not
// depend on communication: their peak is exact at every world size.
void expect_device_peak(const Engine::MemoryReport& got, const DevicePeak& want, int ranks, const std::string& what) {
  ASSERT_TRUE(want.applies) << what << ": " << want.formula;
  EXPECT_EQ(got.activation_peak_bytes, want.activation_peak) << what;
  if (ranks > 1) {
    const auto measured = static_cast<double>(got.device_peak_bytes);
    const auto predicted = static_cast<double>(want.bytes);
    EXPECT_GE(predicted, measured) << what << ": predicted " << want.formula;
    EXPECT_LE(predicted, 1.05 * measured) << what << ": predicted " << want.formula;
    return;
  }
  EXPECT_EQ(got.device_peak_bytes, want.bytes) << what;
  EXPECT_EQ(got.device_reserved_peak_bytes, want.reserved_bytes) << what;
  for (memory::Category c : memory::kAllCategories) {
    EXPECT_EQ(got.device_peak_by_category[static_cast<size_t>(c)], want.by_category[static_cast<size_t>(c)])
        << what << ": " << memory::category_name(c) << " at the peak";
  }
}

class EstimateAgreement : public ::testing::TestWithParam<std::tuple<int, Precision>> {};

TEST_P(EstimateAgreement, ModelStatesEqualTheEngineAllocation) {
  const auto [stage, precision] = GetParam();
  if (!stage_available(stage)) GTEST_SKIP() << "ZeRO stage " << stage << " is not available in this build";
  const comm::Group& world = test::world().group();
  zs::run::RunConfig cfg = make_config(world.size(), precision, stage);
  nn::GptModel model(*cfg.model);
  Engine engine(model, cfg, world);
  DatasetSource source(nn::Dataset::builtin(tiny_gpt().seq_len), 7);
  engine.train_batch(source);
  engine.train_batch(source);  // the second step prefetches along the order the first recorded
  Engine::MemoryReport got = engine.memory_report();

  MemoryEstimate est = estimate_memory(estimate_input_for_config(cfg, world.size()), {stage});
  const StateBytes want = est.stages[0].group_of(world.rank()).device;
  const std::string what = fmt::format("stage {} {} rank {} of {}", stage, precision_name(precision), world.rank(), world.size());
  EXPECT_EQ(got.model_states.params, want.params) << what;
  EXPECT_EQ(got.model_states.grads, want.grads) << what;
  EXPECT_EQ(got.model_states.optimizer, want.optimizer) << what;
  EXPECT_EQ(want, model_state_bytes(estimate_input_for_config(cfg, world.size()), stage, world.rank())) << what;
  // The transient bounds hold: gradient staging (stage 2+) and gathered parameters (stage 3), and the
  // estimator's gathered bound is no looser than the engine's own documented one.
  const StageEstimate& st = est.stages[0];
  EXPECT_LE(got.grad_staging_peak_bytes, st.grad_buckets.bytes) << what;
  EXPECT_LE(got.gathered_param_peak_bytes, st.gathered_params.bytes + st.persistent_params.bytes) << what;
  if (stage == 3) {
    EXPECT_LE(st.gathered_params.bytes + st.persistent_params.bytes, got.gathered_param_bound_bytes) << what;
  }
  expect_device_peak(got, est.stages[0].group_of(world.rank()).device_peak, world.size(), what);
}
INSTANTIATE_TEST_SUITE_P(Stages, EstimateAgreement,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(Precision::kFp32, Precision::kBf16)),
                         [](const auto& info) {
                           return fmt::format("stage{}_{}", std::get<0>(info.param), precision_name(std::get<1>(info.param)));
                         });

// The one-bit optimizers (whole momentum, the variance, 0/1 Adam's accumulator at stage 0, and comm's
// error feedback, sized by compression_scale): the estimate equals the engine's allocation with
// 256-element scale blocks and with per-tensor scales, whose padding (a multiple of N x DeepSpeed's
// divider per tensor: 72 at np 3) differs from the blocks' at every world size.
struct CompressedCase {
  std::string name;
  OptimizerConfig optimizer;
};

void PrintTo(const CompressedCase& c, std::ostream* os) { *os << c.name; }

class EstimateCompressedAgreement : public ::testing::TestWithParam<std::tuple<int, CompressedCase>> {};

TEST_P(EstimateCompressedAgreement, ModelStatesEqualTheEngineAllocation) {
  const auto& [stage, c] = GetParam();
  if (!stage_available(stage)) GTEST_SKIP() << "ZeRO stage " << stage << " is not available in this build";
  const comm::Group& world = test::world().group();
  zs::run::RunConfig cfg = make_config(world.size(), Precision::kBf16, stage);
  cfg.optimizer = c.optimizer;
  nn::GptModel model(*cfg.model);
  Engine engine(model, cfg, world);
  DatasetSource source(nn::Dataset::builtin(tiny_gpt().seq_len), 7);
  engine.train_batch(source);
  engine.train_batch(source);  // compressed (freeze_step 1)
  const Engine::MemoryReport got = engine.memory_report();
  const EstimateInput in = estimate_input_for_config(cfg, world.size());
  const ShardGroup& want = estimate_memory(in, {stage}).stages[0].group_of(world.rank());
  const std::string what = fmt::format("{} stage {} rank {} of {}", c.name, stage, world.rank(), world.size());
  EXPECT_EQ(got.model_states.params, want.device.params) << what;
  EXPECT_EQ(got.model_states.grads, want.device.grads) << what;
  EXPECT_EQ(got.model_states.optimizer, want.device.optimizer) << what;
  EXPECT_EQ(got.device_states.optimizer, want.device.optimizer) << what;
  EXPECT_EQ(want.device, model_state_bytes(in, stage, world.rank())) << what;
}
INSTANTIATE_TEST_SUITE_P(
    OneBit, EstimateCompressedAgreement,
    ::testing::Combine(
        ::testing::Values(0, 1, 2, 3),
        ::testing::Values(
            CompressedCase{"onebit_block", OptimizerConfig("OneBitAdam", optim::OneBitAdamConfig{.freeze_step = 1})},
            CompressedCase{"onebit_tensor", OptimizerConfig("OneBitAdam", optim::OneBitAdamConfig{
                                                                              .freeze_step = 1,
                                                                              .compression_scale = optim::CompressionScale::kTensor})},
            CompressedCase{"zero_one_tensor",
                           OptimizerConfig("ZeroOneAdam", optim::ZeroOneAdamConfig{
                                                              .var_freeze_step = 1,
                                                              .compression_scale = optim::CompressionScale::kTensor})})),
    [](const auto& info) { return fmt::format("stage{}_{}", std::get<0>(info.param), std::get<1>(info.param).name); });

// Activation checkpointing (engine/recompute_config.h): the estimator runs the engine's own code, so
// it predicts the device peak with recomputed blocks, kept inputs on the host or in the contiguous
// buffer exactly as without: byte for byte on one rank, the activation peak at every world size.
struct CheckpointCase {
  std::string name;
  RecomputeConfig::Blocks blocks;
  bool cpu = false;
  bool contiguous = false;
};

class EstimateCheckpointAgreement : public ::testing::TestWithParam<std::tuple<int, CheckpointCase>> {};

TEST_P(EstimateCheckpointAgreement, DevicePeakEqualsTheRun) {
  const auto& [stage, c] = GetParam();
  const comm::Group& world = test::world().group();
  zs::run::RunConfig cfg = make_config(world.size(), Precision::kFp32, stage);
  cfg.recompute.blocks = c.blocks;
  cfg.recompute.cpu_checkpointing = c.cpu;
  cfg.recompute.contiguous_memory_optimization = c.contiguous;
  nn::GptModel model(*cfg.model);
  Engine engine(model, cfg, world);
  DatasetSource source(nn::Dataset::builtin(tiny_gpt().seq_len), 7);
  engine.train_batch(source);
  engine.train_batch(source);
  MemoryEstimate est = estimate_memory(estimate_input_for_config(cfg, world.size()), {stage});
  expect_device_peak(engine.memory_report(), est.stages[0].group_of(world.rank()).device_peak, world.size(),
                     fmt::format("stage {} {} rank {} of {}", stage, c.name, world.rank(), world.size()));
}
INSTANTIATE_TEST_SUITE_P(
    Checkpointing, EstimateCheckpointAgreement,
    ::testing::Combine(::testing::Values(0, 1, 2, 3),
                       ::testing::Values(CheckpointCase{"all", RecomputeConfig::Blocks::kEvery},
                                         CheckpointCase{"all_cpu", RecomputeConfig::Blocks::kEvery, true},
                                         CheckpointCase{"first_contiguous", RecomputeConfig::Blocks::kFirst,
                                                        false, true},
                                         CheckpointCase{"selective", RecomputeConfig::Blocks::kSelective})),
    [](const auto& info) { return fmt::format("stage{}_{}", std::get<0>(info.param), std::get<1>(info.param).name); });

// Every block of an n-layer GPT checkpointed: the activation peak is the kept inputs plus one block's
// activations, so one more layer adds exactly one kept input (micro-batch, seq_len, d_model) fp32, in
// the run and in the prediction alike.
TEST(EstimateCheckpointAgreement, EveryBlockCheckpointedPeakGrowsByOneInputPerLayer) {
  const comm::Group& world = test::world().group();
  std::vector<uint64_t> measured, predicted;
  for (int64_t n_layer : {2, 3, 4}) {
    zs::run::RunConfig cfg = make_config(world.size(), Precision::kFp32, 0);
    cfg.model->n_layer = n_layer;
    cfg.model->seq_len = 64;  // attention's (T, T) probabilities make a block's activations dominate the head's
    cfg.recompute.blocks = RecomputeConfig::Blocks::kEvery;
    nn::GptModel model(*cfg.model);
    Engine engine(model, cfg, world);
    DatasetSource source(nn::Dataset::builtin(64), 7);
    engine.train_batch(source);
    engine.train_batch(source);
    measured.push_back(engine.memory_report().activation_peak_bytes);
    predicted.push_back(
        estimate_memory(estimate_input_for_config(cfg, world.size()), {0}).stages[0].group_of(world.rank()).device_peak.activation_peak);
  }
  const uint64_t input = 2 * 64 * tiny_gpt().d_model * 4;  // micro-batch 2 (64-byte blocks: 15360 is a multiple)
  EXPECT_EQ(measured, predicted);
  EXPECT_EQ(measured[1] - measured[0], input);
  EXPECT_EQ(measured[2] - measured[1], input);
}

// d_model 60: Ψ about 104,000, so the NVMe step has several sub-groups (of 32768 elements) at 1-3
// ranks, the last one shorter at 3.
nn::GptConfig offload_gpt() { return {.n_layer = 2, .d_model = 60, .n_head = 3, .seq_len = 16, .vocab_size = 256}; }

struct OffloadCase {
  std::string name;
  int stage;
  Precision precision;
  OffloadDevice optimizer;
  OffloadDevice param;
  bool keep_fp32_grads = false;  // memory.release_fp32_grad false
  int64_t buffer_count = 4;      // offload_optimizer.buffer_count
  int64_t max_in_cpu = 1'000'000'000;  // offload_param.max_in_cpu (caps the NVMe prefetch window)
  int64_t prefetch = 4000;             // stage3_prefetch_bucket_size
};

void PrintTo(const OffloadCase& c, std::ostream* os) { *os << c.name; }

class EstimateOffloadAgreement : public ::testing::TestWithParam<OffloadCase> {};

TEST_P(EstimateOffloadAgreement, TiersEqualTheEngineAllocation) {
  const OffloadCase& c = GetParam();
  if (!stage_available(c.stage)) GTEST_SKIP() << "ZeRO stage " << c.stage << " is not available in this build";
  const comm::Group& world = test::world().group();
  test::TempDir dir;  // this rank's swap files; outlives the engine, whose swap files live in it
  zs::run::RunConfig cfg = make_config(world.size(), c.precision, c.stage);
  cfg.model = offload_gpt();
  cfg.memory.release_fp32_grad = !c.keep_fp32_grads;
  cfg.zero.offload_optimizer = {.device = c.optimizer, .nvme_path = dir.path(), .buffer_count = c.buffer_count};
  cfg.zero.offload_param = {.device = c.param, .nvme_path = dir.path(), .max_in_cpu = c.max_in_cpu};
  cfg.zero.stage3_prefetch_bucket_size = c.prefetch;
  nn::GptModel model(*cfg.model);
  Engine engine(model, cfg, world);
  DatasetSource source(nn::Dataset::builtin(offload_gpt().seq_len), 7);
  engine.train_batch(source);
  engine.train_batch(source);
  Engine::MemoryReport got = engine.memory_report();

  const EstimateInput in = estimate_input_for_config(cfg, world.size());
  const MemoryEstimate est = estimate_memory(in, {c.stage});
  const ShardGroup& want = est.stages[0].group_of(world.rank());
  const std::string what = fmt::format("{} rank {} of {}", c.name, world.rank(), world.size());
  auto expect_tier = [&](const ModelStateBytes& g, const StateBytes& w, const char* tier) {
    EXPECT_EQ(g.params, w.params) << what << ": " << tier << " params";
    EXPECT_EQ(g.grads, w.grads) << what << ": " << tier << " grads";
    EXPECT_EQ(g.optimizer, w.optimizer) << what << ": " << tier << " optimizer";
  };
  expect_tier(got.device_states, want.device, "device");
  expect_tier(got.host_states, want.host, "host");
  expect_tier(got.nvme_states, want.nvme, "nvme");
  EXPECT_EQ(got.nvme_bytes, want.nvme.total()) << what;
  const bool nvme = c.optimizer == OffloadDevice::kNvme || c.param == OffloadDevice::kNvme;
  EXPECT_EQ(want.offload_buffers.applies, nvme) << what;
  EXPECT_GT(want.host.total() + want.nvme.total(), 0u) << what;  // something did move
  // The host tier holds only offload buffers: the host model states and the NVMe step's swapper all
  // the time; the stage-3 NVMe gathers add their staging buffers for a moment.
  const StageEstimate& st = est.stages[0];
  if (st.nvme_param_staging.applies) {
    EXPECT_GE(got.host_peak_bytes, want.host_total()) << what;
    EXPECT_LE(got.host_peak_bytes, want.host_total() + st.nvme_param_staging.bytes) << what;
  } else {
    EXPECT_EQ(got.host_peak_bytes, want.host_total()) << what;
  }
  // The device arena holds the device states and the transient buffers; the in-memory bounds hold.
  EXPECT_LE(got.grad_staging_peak_bytes, st.grad_buckets.bytes) << what;
  EXPECT_LE(got.gathered_param_peak_bytes, st.gathered_params.bytes + st.persistent_params.bytes) << what;
  expect_device_peak(got, want.device_peak, world.size(), what);
}

std::vector<OffloadCase> offload_cases() {
  std::vector<OffloadCase> cases;
  for (OffloadDevice d : {OffloadDevice::kCpu, OffloadDevice::kNvme}) {
    for (Precision p : {Precision::kFp32, Precision::kBf16}) {
      for (int stage = 1; stage <= 3; ++stage) {
        // --offload X: both kinds where the stage allows them.
        cases.push_back({fmt::format("stage{}_{}_{}", stage, precision_name(p), offload_device_name(d)), stage, p, d,
                         stage == 3 ? d : OffloadDevice::kNone});
      }
    }
  }
  // Config-only combinations, the persistent fp32 gradients and a smaller buffer count.
  cases.push_back({"stage1_bf16_cpu_fp32grads", 1, Precision::kBf16, OffloadDevice::kCpu, OffloadDevice::kNone, true});
  cases.push_back({"stage2_bf16_nvme_fp32grads_3buffers", 2, Precision::kBf16, OffloadDevice::kNvme, OffloadDevice::kNone, true, 3});
  cases.push_back({"stage3_fp32_params_nvme_only", 3, Precision::kFp32, OffloadDevice::kNone, OffloadDevice::kNvme});
  cases.push_back({"stage3_bf16_params_cpu_only", 3, Precision::kBf16, OffloadDevice::kNone, OffloadDevice::kCpu});
  cases.push_back({"stage3_bf16_optimizer_cpu_params_nvme", 3, Precision::kBf16, OffloadDevice::kCpu, OffloadDevice::kNvme});
  cases.push_back({"stage3_bf16_optimizer_nvme_params_cpu", 3, Precision::kBf16, OffloadDevice::kNvme, OffloadDevice::kCpu});
  // A prefetch bucket holding the whole model, capped by max_in_cpu to about one module: the engine and
  // the measurement must shrink the window alike (the device peak differs by whole modules otherwise).
  cases.push_back({"stage3_bf16_nvme_max_in_cpu", 3, Precision::kBf16, OffloadDevice::kNvme, OffloadDevice::kNvme, false, 4,
                   15000, 200000});
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Offload, EstimateOffloadAgreement, ::testing::ValuesIn(offload_cases()),
                         [](const auto& info) { return info.param.name; });

// A user's own model (examples/standalone_mlp's MLP, a loss written by hand): the estimator knows it
// only through nn::Model and the BatchSource, and its figures equal a real run's all the same.
class EstimateUserModel : public ::testing::TestWithParam<std::tuple<int, Precision, OffloadDevice>> {};

TEST_P(EstimateUserModel, MatchesARealRunOfTheModel) {
  const auto [stage, precision, offload] = GetParam();
  if (stage == 0 && offload != OffloadDevice::kNone) GTEST_SKIP() << "offload needs stage 1-3 (the config refuses it)";
  const comm::Group& world = test::world().group();
  test::TempDir dir;
  const examples::MlpConfig mlp{.d_in = 24, .hidden = 200, .d_out = 5};  // Ψ splits unevenly over 2 and 3
  zs::run::RunConfig cfg;
  cfg.zero.stage = stage;
  cfg.zero.reduce_bucket_size = 2000;
  cfg.zero.stage3_prefetch_bucket_size = 3000;
  cfg.zero.stage3_param_persistence_threshold = 100;
  cfg.zero.offload_optimizer = {.device = offload, .nvme_path = dir.path()};
  cfg.zero.offload_param = {.device = stage == 3 ? offload : OffloadDevice::kNone, .nvme_path = dir.path()};
  cfg.batch = resolve_batch(0, 8, 2, world.size());
  cfg.precision = precision;
  cfg.device.memory_mb = 16;
  examples::Regressor model(mlp);
  examples::TeacherData data(mlp, 3, cfg.batch.train_batch_size);
  Engine engine(model, cfg, world);
  engine.train_batch(data);
  engine.train_batch(data);
  const Engine::MemoryReport got = engine.memory_report();

  examples::Regressor twin(mlp);  // the estimator's own instance: a user's model is not shared with a run
  const EstimateInput in = estimate_input_for_model(twin, data, cfg, world.size(), "MLP");
  const ShardGroup& want = estimate_memory(in, {stage}).stages[0].group_of(world.rank());
  const std::string what = fmt::format("MLP stage {} {} offload {} rank {} of {}", stage, precision_name(precision),
                                       offload_device_name(offload), world.rank(), world.size());
  EXPECT_EQ(got.device_states.params, want.device.params) << what;
  EXPECT_EQ(got.device_states.grads, want.device.grads) << what;
  EXPECT_EQ(got.device_states.optimizer, want.device.optimizer) << what;
  EXPECT_EQ(got.host_states.optimizer, want.host.optimizer) << what;
  expect_device_peak(got, want.device_peak, world.size(), what);
}
INSTANTIATE_TEST_SUITE_P(
    Stages, EstimateUserModel,
    ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(Precision::kFp32, Precision::kBf16),
                       ::testing::Values(OffloadDevice::kNone, OffloadDevice::kCpu)),
    [](const auto& info) {
      return fmt::format("stage{}_{}_{}", std::get<0>(info.param), precision_name(std::get<1>(info.param)),
                         offload_device_name(std::get<2>(info.param)));
    });

}  // namespace
}  // namespace zs::engine
