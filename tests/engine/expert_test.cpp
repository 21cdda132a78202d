// Expert parameters (Note [expert parameters] in engine/engine.h) at every ZeRO stage: the engine
// shards an expert layout over its expert-data-parallel group, reduces expert gradients there scaled
// by 1/W, counts every element once in the clipping norm, and plans and reports the bytes per rank
// that the estimator predicts. The model and why its expert gradients are those of a real MoE:
// tests/engine/expert_model.h.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include <unistd.h>

#include "core/errors.h"
#include "engine/flat_layout.h"
#include "estimate/estimate.h"
#include "estimate/measure.h"
#include "memory/shard.h"
#include "optim/adam.h"
#include "optim/lamb.h"
#include "tests/engine/expert_model.h"
#include "tests/support/mpi_test_env.h"

namespace zs::engine {
namespace {

using namespace expert_test;

constexpr int64_t kGlobalBatch = 24;  // divisible by 1-4 ranks x accumulation 1-2
constexpr int kSteps = 6;

EngineConfig make_config(int world, int stage, int64_t accumulation, Precision precision) {
  EngineConfig c;
  c.batch = resolve_batch(kGlobalBatch, 0, accumulation, world);
  c.precision = precision;
  c.zero.stage = stage;
  c.zero.reduce_bucket_size = 300;  // several buckets per layout
  c.zero.allgather_bucket_size = 500;
  c.zero.stage3_prefetch_bucket_size = 400;  // prefetch a few experts ahead
  c.zero.stage3_param_persistence_threshold = 0;
  // Adam is nearly invariant to the scale of each element's gradient; a large eps makes the updates
  // depend on it, so a gradient scaled by the wrong factor (ep_size: DeepSpeed's old bug) shows in the
  // parameters, not only in the reported norm.
  c.optimizer = OptimizerConfig("AdamW", optim::AdamConfig{.lr = 1e-2, .eps = 1e-2, .weight_decay = 0.1});
  // Below the gradient norm (about 1): clipping changes every update, so a norm that counted an expert
  // twice, or missed one, would change the parameters.
  c.gradient_clipping = 0.3;
  c.device.memory_mb = 64;
  c.seed = 11;
  c.loss_scaler.initial_scale_power = 8;
  return c;
}

// The two layers' expert_parallel_size at world size w: the whole world, and a smaller group
// where one exists, so two expert layouts (or one, at np 2 and 3) sit beside the dense one.
std::array<int, 2> expert_sizes(int w) { return {w, w % 2 == 0 ? 2 : w}; }

struct Groups {
  // Built collectively by every rank in the same order.
  Groups(const comm::Group& world, std::array<int, 2> e) {
    for (size_t i = 0; i < 2; ++i) ep[i] = std::make_unique<comm::Group>(world.split(world.rank() / e[i], world.rank(), "ep"));
  }
  std::array<const comm::Group*, 2> ptrs() const { return {ep[0].get(), ep[1].get()}; }
  std::array<std::unique_ptr<comm::Group>, 2> ep;
};

struct TrainRun {
  std::vector<double> losses, norms;
  std::vector<uint64_t> grad_bytes;  // StepReport::grad_comm_bytes_sent
  std::map<std::string, std::vector<float>> params;  // every parameter this rank holds
  ModelStateBytes states;
  std::string digest;
};

TrainRun train(const comm::Group& world, std::array<int, 2> e, const EngineConfig& cfg) {
  Groups groups(world, e);
  ExpertModel model(e, groups.ptrs());
  ExpertData data(cfg.batch.train_batch_size);
  TrainRun r;
  {
    Engine engine(model, cfg, world);
    for (int s = 0; s < kSteps; ++s) {
      const StepReport& rep = engine.train_batch(data);
      r.losses.push_back(rep.loss);
      r.norms.push_back(rep.grad_norm);
      r.grad_bytes.push_back(rep.grad_comm_bytes_sent);
    }
    // Names in canonical order: the same order on every rank of each group (dense over dp first,
    // then an EP rank's experts, which its edp peers share).
    for (nn::Parameter* p : model.all_params()) r.params[p->full_name()] = engine.fp32_param(p->full_name());
    r.states = engine.model_state_bytes();
    r.digest = engine.param_digest();
  }
  return r;
}

void expect_same(const TrainRun& got, const TrainRun& want, double tol, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < got.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], tol * std::max(1.0, std::abs(want.losses[i]))) << what << " loss " << i;
    EXPECT_NEAR(got.norms[i], want.norms[i], tol * std::max(1.0, std::abs(want.norms[i]))) << what << " norm " << i;
  }
  // Every parameter `got` holds, against the same-named one of `want` (which may hold more experts).
  for (const auto& [name, values] : got.params) {
    auto it = want.params.find(name);
    ASSERT_NE(it, want.params.end()) << what << ": " << name;
    ASSERT_EQ(values.size(), it->second.size()) << name;
    double worst = 0.0;
    for (size_t i = 0; i < values.size(); ++i) worst = std::max(worst, double(std::abs(values[i] - it->second[i])));
    EXPECT_LE(worst, tol) << what << ": " << name;
  }
}

const TrainRun& stage0(std::array<int, 2> e, Precision precision) {
  static std::map<std::pair<std::array<int, 2>, Precision>, TrainRun> cache;
  auto key = std::make_pair(e, precision);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const comm::Group& world = test::world().group();
  return cache[key] = train(world, e, make_config(world.size(), 0, 1, precision));
}

TEST(Experts, EveryStageMatchesStage0AtTheSameExpertParallelSize) {
  const comm::Group& world = test::world().group();
  const auto e = expert_sizes(world.size());
  for (int stage = 0; stage <= 3; ++stage) {
    for (int64_t accumulation : {1, 2}) {
      const std::string what = fmt::format("np {} E {}/{} stage {} accumulation {}", world.size(), e[0], e[1], stage, accumulation);
      expect_same(train(world, e, make_config(world.size(), stage, accumulation, Precision::kFp32)),
                  stage0(e, Precision::kFp32), 1e-5, what);
    }
  }
}

TEST(Experts, Bf16AndCpuOffloadMatchStage0) {
  const comm::Group& world = test::world().group();
  const auto e = expert_sizes(world.size());
  for (int stage : {1, 2, 3}) {
    // bf16 gradients are rounded once per reduction, differently per stage: a few bf16 ulps.
    expect_same(train(world, e, make_config(world.size(), stage, 2, Precision::kBf16)), stage0(e, Precision::kBf16), 2e-2,
                fmt::format("bf16 stage {}", stage));
    EngineConfig cfg = make_config(world.size(), stage, 2, Precision::kFp32);
    cfg.zero.offload_optimizer.device = OffloadDevice::kCpu;
    if (stage == 3) cfg.zero.offload_param.device = OffloadDevice::kCpu;
    expect_same(train(world, e, cfg), stage0(e, Precision::kFp32), 1e-5, fmt::format("cpu offload stage {}", stage));
  }
}

TEST(Experts, Bf16CommunicationHalvesDenseAndExpertGradientBytes) {
  // communication_data_type bf16 on fp32 training: the dense set (over dp) and the expert sets (over
  // their expert-data-parallel groups) all average in bf16.
  const comm::Group& world = test::world().group();
  const auto e = expert_sizes(world.size());
  for (int stage = 0; stage <= 3; ++stage) {
    const std::string what = fmt::format("bf16 communication, stage {}", stage);
    const EngineConfig full_cfg = make_config(world.size(), stage, 2, Precision::kFp32);
    EngineConfig half_cfg = full_cfg;
    half_cfg.communication_data_type = memory::DType::kBF16;
    const TrainRun full = stage == 0 ? stage0(e, Precision::kFp32) : train(world, e, full_cfg);
    const TrainRun half = train(world, e, half_cfg);
    for (size_t i = 0; i < full.grad_bytes.size(); ++i) {
      EXPECT_EQ(2 * half.grad_bytes[i], full.grad_bytes[i]) << what << ", step " << i + 1;
      EXPECT_EQ(full.grad_bytes[i] > 0, world.size() > 1) << what;
    }
    // bf16 rounding of each averaged gradient: a few bf16 ulps, as Bf16AndCpuOffloadMatchStage0.
    expect_same(half, stage0(e, Precision::kFp32), 2e-2, what);
  }
}

TEST(Experts, Fp16AgreesOnOverflowAndMatchesStage0) {
  // The overflow check reads the agreed norm: every rank skips, or steps, together.
  const comm::Group& world = test::world().group();
  const auto e = expert_sizes(world.size());
  for (int stage : {2, 3}) {
    expect_same(train(world, e, make_config(world.size(), stage, 2, Precision::kFp16)), stage0(e, Precision::kFp16), 2e-2,
                fmt::format("fp16 stage {}", stage));
  }
}

// ZeRO++'s host groups exist for the dense set only: with experts the keys are one ConfigError naming them.
TEST(Experts, ZeroppIsRefusedByName) {
  const comm::Group& world = test::world().group();
  if (world.size() == 1) GTEST_SKIP() << "no expert parallelism on one rank";
  const auto e = expert_sizes(world.size());
  Groups groups(world, e);
  ExpertModel model(e, groups.ptrs());
  EngineConfig cfg = make_config(world.size(), 3, 1, Precision::kFp32);
  cfg.zero.zero_quantized_weights = true;
  try {
    Engine engine(model, cfg, world);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& err) {
    EXPECT_NE(std::string(err.what()).find("ZeRO++ (zero_hpz_partition_size, zero_quantized_weights, "
                                           "zero_quantized_gradients) with expert parameters"),
              std::string::npos) << err.what();
  }
}

TEST(Experts, CompressedOptimizersAreRefusedByName) {
  const comm::Group& world = test::world().group();
  if (world.size() == 1) GTEST_SKIP() << "no expert parallelism on one rank";
  const auto e = expert_sizes(world.size());
  Groups groups(world, e);
  ExpertModel model(e, groups.ptrs());
  EngineConfig cfg = make_config(world.size(), 1, 1, Precision::kFp32);
  cfg.optimizer = OptimizerConfig("OneBitAdam");
  try {
    Engine engine(model, cfg, world);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& err) {
    EXPECT_NE(std::string(err.what()).find("OneBitAdam with expert parameters"), std::string::npos) << err.what();
  }
}

TEST(Experts, NvmeOffloadMatchesStage0) {
  const comm::Group& world = test::world().group();
  const auto e = expert_sizes(world.size());
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / fmt::format("zs_expert_nvme_{}", ::getpid());
  std::filesystem::create_directories(dir);
  for (int stage : {2, 3}) {
    EngineConfig cfg = make_config(world.size(), stage, 1, Precision::kFp32);
    cfg.zero.offload_optimizer.device = OffloadDevice::kNvme;
    cfg.zero.offload_optimizer.nvme_path = dir.string();
    if (stage == 3) {
      cfg.zero.offload_param.device = OffloadDevice::kNvme;
      cfg.zero.offload_param.nvme_path = dir.string();
    }
    expect_same(train(world, e, cfg), stage0(e, Precision::kFp32), 1e-5, fmt::format("nvme stage {}", stage));
  }
  std::filesystem::remove_all(dir);
}

TEST(Experts, LambMatchesStage0) {
  // Lamb's per-tensor sums are allreduced over each layout's own group (Note [two-pass step]).
  const comm::Group& world = test::world().group();
  const auto e = expert_sizes(world.size());
  auto lamb = [&](int stage) {
    EngineConfig cfg = make_config(world.size(), stage, 1, Precision::kFp32);
    cfg.optimizer = OptimizerConfig("Lamb", optim::LambConfig{.lr = 1e-2, .weight_decay = 0.1});
    return train(world, e, cfg);
  };
  const TrainRun want = lamb(0);
  for (int stage : {1, 3}) expect_same(lamb(stage), want, 1e-5, fmt::format("Lamb stage {}", stage));
}

// The scaling rule itself: experts spread over E ranks train exactly as the same experts held whole
// by every rank (E = 1, all dense), and as one process on the whole global batch. The gradient norm
// is the clipping norm, compared step by step.
TEST(Experts, ExpertParallelTrainsLikeOneProcess) {
  const comm::Group& world = test::world().group();
  comm::Group self = world.split(world.rank(), 0, "self");
  const TrainRun one = train(self, {1, 1}, make_config(1, 0, 1, Precision::kFp32));
  const TrainRun dense = stage0({1, 1}, Precision::kFp32);
  expect_same(dense, one, 1e-5, "E 1 on the world vs one process");
  const auto e = expert_sizes(world.size());
  for (int stage : {0, 2, 3}) {
    expect_same(train(world, e, make_config(world.size(), stage, 1, Precision::kFp32)), one, 1e-5,
                fmt::format("E {}/{} stage {} vs one process", e[0], e[1], stage));
  }
}

// Model states per rank: the dense layout's states over the world, each expert layout's over its
// expert-data-parallel group of W/E ranks (rank r is its rank r/E), exactly. fp32 AdamW: params 4,
// grads 4, Adam 8 bytes per element, whole or this rank's shard as the stage says.
TEST(Experts, ModelStateBytesFollowTheFormulaAndTheEstimator) {
  const comm::Group& world = test::world().group();
  const int w = world.size(), r = world.rank();
  const auto e = expert_sizes(w);
  Groups groups(world, e);
  ExpertModel model(e, groups.ptrs());
  nn::assign_names(model);
  std::vector<ParamGroup> layouts = group_by_expert_parallel_size(model.all_params());
  ASSERT_EQ(layouts.size(), w == 1 ? 1u : (e[0] == e[1] ? 2u : 3u));
  for (int stage = 0; stage <= 3; ++stage) {
    uint64_t params = 0, grads = 0, optimizer = 0;
    for (const ParamGroup& g : layouts) {
      const uint64_t total = FlatLayout(g.params).total();
      const int n = w / g.expert_parallel_size, rank = r / g.expert_parallel_size;
      const uint64_t shard = memory::shard_of(total, n, rank, FlatLayout::kAlignElements).size;
      params += 4 * (stage == 3 ? shard : total);
      grads += 4 * (stage >= 2 ? shard : total);
      optimizer += 8 * (stage >= 1 ? shard : total);
    }
    const EngineConfig cfg = make_config(w, stage, 1, Precision::kFp32);
    ExpertData data(cfg.batch.train_batch_size);
    ModelStateBytes got;
    {
      Engine engine(model, cfg, world);
      engine.train_batch(data);
      got = engine.model_state_bytes();
    }
    EXPECT_EQ(got.params, params) << "stage " << stage;
    EXPECT_EQ(got.grads, grads) << "stage " << stage;
    EXPECT_EQ(got.optimizer, optimizer) << "stage " << stage;

    // The estimator: its placement plans, and the engine's own code over the measuring backend.
    const EstimateInput in = estimate_input_for_model(model, data, cfg, w, "expert test model");
    const TieredStateBytes t = tiered_state_bytes(in, stage, r);
    EXPECT_EQ(t.device, (StateBytes{params, grads, optimizer})) << "estimate, stage " << stage;
  }
}

TEST(Experts, TheMeasuringEngineCountsExpertsPerRank) {
  // estimate() runs the engine as every rank of the world over a measuring backend; with this
  // process's model (its experts), rank r's figures are this rank's when r is in the same classes.
  const comm::Group& world = test::world().group();
  const int w = world.size();
  const auto e = expert_sizes(w);
  Groups groups(world, e);
  ExpertModel model(e, groups.ptrs());
  for (int stage : {1, 3}) {
    const EngineConfig cfg = make_config(w, stage, 1, Precision::kFp32);
    ExpertData data(cfg.batch.train_batch_size);
    const Measurement m = estimate(model, cfg, w, data);
    ModelStateBytes real;
    {
      Engine engine(model, cfg, world);
      engine.train_batch(data);
      real = engine.model_state_bytes();
    }
    const ModelStateBytes& predicted = m.of_rank(world.rank()).memory.model_states;
    EXPECT_EQ(predicted.params, real.params) << "stage " << stage;
    EXPECT_EQ(predicted.grads, real.grads) << "stage " << stage;
    EXPECT_EQ(predicted.optimizer, real.optimizer) << "stage " << stage;
  }
}

TEST(Experts, AnExpertParallelSizeThatDoesNotDivideTheWorldIsRefusedByName) {
  const comm::Group& world = test::world().group();
  const int w = world.size();
  const int bad = w + 1;  // divides no world size of these runs
  ExpertModel model({1, bad}, {nullptr, nullptr});
  try {
    Engine engine(model, make_config(w, 1, 1, Precision::kFp32), world);
    FAIL() << "expected a ModelError";
  } catch (const ModelError& err) {
    EXPECT_NE(std::string(err.what()).find(fmt::format("expert_parallel_size {}", bad)), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find(fmt::format("world size {}", w)), std::string::npos) << err.what();
  }
}

TEST(Experts, AFlatLayoutHoldsOneExpertParallelSize) {
  ExpertModel model({1, 2}, {nullptr, nullptr});
  nn::assign_names(model);
  EXPECT_THROW(FlatLayout(model.all_params()), ModelError);
  auto groups = group_by_expert_parallel_size(model.all_params());
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].expert_parallel_size, 1);
  EXPECT_EQ(groups[1].expert_parallel_size, 2);
  EXPECT_EQ(groups[1].params.size(), 2u * kExperts / 2);  // 6 experts x (weight, bias)
  EXPECT_EQ(FlatLayout(groups[1].params).expert_parallel_size(), 2);
}

}  // namespace
}  // namespace zs::engine
