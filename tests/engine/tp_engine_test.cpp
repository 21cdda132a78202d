// Tensor parallelism in the engine (Note [tensor-parallel parameters] in engine/engine.h), at np 4:
// dp 4 x tp 1 (the reference, a plain data-parallel run of nn::GptModel), dp 2 x tp 2 and dp 1 x tp 4
// (tp::GptModel) train the same model on the same global batch and give the same losses (fp32: 1e-5
// relative over 20 steps; bf16: 1e-2, its products round differently when a matmul's reduction is
// split over ranks) at every ZeRO stage, with gradient accumulation, clipping below the gradient norm
// (a norm that counted a replicated parameter tp times, or a TP shard once, changes every update),
// sequence parallelism on and off, tied and untied heads, cpu and NVMe offload and Lamb (whose trust
// ratio needs whole-tensor norms); the initial param_digest is the same bits for every tp, fp32_param
// gives the full tp = 1 tensors, stage-3 gathers hold this rank's TP shards only, replicas differing
// in one bit are a ModelError, and a model built for another tp degree is refused.
//
// A user's own model from the tp/ layers (TpLm below) goes through the same checks: a vocab-parallel
// embedding, a layer norm, a column-parallel + GELU + row-parallel MLP with a residual, and a
// column-parallel head into the vocab-parallel cross-entropy. With tp = 1 the tp/ layers compute what
// nn's do.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/topology.h"
#include "core/errors.h"
#include "engine/config.h"
#include "engine/dataset_source.h"
#include "engine/engine.h"
#include "nn/data.h"
#include "nn/detail/ops.h"
#include "nn/layers.h"
#include "optim/adam.h"
#include "optim/lamb.h"
#include "optim/onebit_adam.h"
#include "tests/support/mpi_test_env.h"
#include "tests/support/temp_dir.h"
#include "nn/gpt.h"
#include "tp/gpt.h"
#include "tp/tp.h"

namespace zs::engine {
namespace {

using memory::DType;
using memory::Tensor;

constexpr int64_t kVocab = 256, kDim = 32, kSeq = 16;
constexpr int64_t kGlobalBatch = 8;
constexpr int kSteps = 20;

// A layer norm on sequence shards: its gradient is summed over tp in its backward (Note [replicated
// gradients of sequence shards] in tp/mappings.h); without sequence parallelism, nn::LayerNorm.
class ShardNorm : public nn::LayerNorm {
 public:
  ShardNorm(int64_t dim, tp::TensorParallel tp) : nn::LayerNorm(dim), tp_(tp) {}

 protected:
  Tensor backward(nn::Context& ctx, const Tensor& dy) override {
    tp::ReplicatedGradients rg(ctx, tp_, {&weight(), &bias()});
    Tensor dx = nn::LayerNorm::backward(ctx, dy);
    rg.reduce();
    return dx;
  }

 private:
  tp::TensorParallel tp_;
};

class TpLm : public nn::Model {
 public:
  explicit TpLm(tp::TensorParallel tp)
      : tp_(tp),
        wte_(add_child<tp::VocabParallelEmbedding>("wte", kVocab, kDim, tp)),
        ln_(add_child<ShardNorm>("ln", kDim, tp)),
        fc_(add_child<tp::ColumnParallelLinear>("fc", kDim, 4 * kDim, tp)),
        gelu_(add_child<nn::Gelu>("gelu")),
        proj_(add_child<tp::RowParallelLinear>("proj", 4 * kDim, kDim, tp)),
        head_(add_child<tp::ColumnParallelLinear>("head", kDim, kVocab, tp, /*bias=*/false)),
        loss_(tp) {
    nn::assign_names(*this);
  }
  std::string_view type_name() const override { return "TpLm"; }

 protected:
  float forward_loss(nn::Context& ctx, const nn::Batch& batch) override {
    Tensor x = ctx.forward(wte_, batch.inputs);  // (B, T/tp, C) with sequence parallelism
    Tensor h = ctx.forward(proj_, ctx.forward(gelu_, ctx.forward(fc_, ctx.forward(ln_, x))));
    Tensor y = ctx.allocate(x.shape(), DType::kF32, nn::MemoryUse::kActivation);
    nn::detail::add(x.data<float>(), h.data<float>(), y.data<float>(), x.numel());
    Tensor logits = ctx.forward(head_, y);  // gathers the sequence shards: (B, T, V/tp)
    return loss_.forward(ctx, logits, batch.targets);
  }
  void backward_loss(nn::Context& ctx, float grad_scale) override {
    Tensor dy = ctx.backward(head_, loss_.backward(ctx, grad_scale));
    Tensor dx = ctx.backward(ln_, ctx.backward(fc_, ctx.backward(gelu_, ctx.backward(proj_, dy))));
    nn::detail::add(dy.data<float>(), dx.data<float>(), dx.data<float>(), dy.numel());
    ctx.backward(wte_, dx);
    loss_.clear();
  }
  void clear_own_saved() override { loss_.clear(); }

 private:
  tp::TensorParallel tp_;
  tp::VocabParallelEmbedding& wte_;
  ShardNorm& ln_;
  tp::ColumnParallelLinear& fc_;
  nn::Gelu& gelu_;
  tp::RowParallelLinear& proj_;
  tp::ColumnParallelLinear& head_;
  tp::VocabParallelCrossEntropy loss_;
};

struct Case {
  bool gpt = true;  // tp::GptModel against nn::GptModel; false: TpLm (tp 1: TpLm without a group)
  bool tied = true;
  int stage = 0;
  Precision precision = Precision::kFp32;
  int64_t accumulation = 2;
  bool sequence_parallel = false;
  OffloadDevice offload = OffloadDevice::kNone;
  bool lamb = false;
  int scale_power = 8;  // fp16: the first loss scale 2^scale_power
};

EngineConfig make_config(const Case& k, int dp) {
  EngineConfig c;
  c.batch = resolve_batch(kGlobalBatch, 0, k.accumulation, dp);
  c.precision = k.precision;
  c.zero.stage = k.stage;
  c.zero.reduce_bucket_size = 3000;  // several buckets, reduced while backward runs
  c.zero.allgather_bucket_size = 5000;
  c.zero.stage3_prefetch_bucket_size = 4000;
  c.zero.stage3_param_persistence_threshold = 0;  // every module gathered and released
  c.zero.offload_optimizer.device = k.offload;
  if (k.offload != OffloadDevice::kNone && k.stage == 3) c.zero.offload_param.device = k.offload;
  if (k.offload == OffloadDevice::kNvme) {
    // Each process's own directory: the swap files of the tp ranks of one dp rank must not meet.
    static const test::TempDir dir;
    c.zero.offload_optimizer.nvme_path = c.zero.offload_param.nvme_path = dir.path();
  }
  c.optimizer = k.lamb ? OptimizerConfig("Lamb", optim::LambConfig{.lr = 1e-2, .weight_decay = 0.01})
                       : OptimizerConfig("AdamW", optim::AdamConfig{.lr = 1e-2, .weight_decay = 0.1});
  // Below the gradient norm (0.04 to 0.1 here): every update is clipped, so the norm must count every
  // element once (a replicated parameter counted tp times changes the losses by 1e-4 within 3 steps).
  c.gradient_clipping = 0.02;
  c.device.memory_mb = 64;
  c.seed = 5;
  c.loss_scaler.initial_scale_power = k.scale_power;
  c.loss_scaler.hysteresis = 1;  // every overflow halves the scale
  return c;
}

// The topologies, built once by every rank in the same order (each is six group splits).
struct Topologies {
  comm::Topology tp2{test::world().group(), {.tensor_parallel_size = 2}};
  comm::Topology tp4{test::world().group(), {.tensor_parallel_size = 4}};
  const comm::Topology& of(int tp) const { return tp == 2 ? tp2 : tp4; }
};
Topologies& topologies() {
  static Topologies t;
  return t;
}

struct RunResult {
  std::vector<double> losses;
  std::vector<double> norms;
  std::string initial_digest;
  std::vector<float> fc, proj, ln;  // a column shard, a row shard, a replicated norm
  int64_t params = 0;
  uint64_t tp_bytes = 0;
  uint64_t gathered_peak = 0;  // stage 3: the gathered parameters' peak
  int skipped = 0;             // fp16 steps skipped on overflow
};

nn::GptConfig gpt_config(const Case& k) {
  return {.n_layer = 2, .d_model = kDim, .n_head = 4, .seq_len = kSeq, .vocab_size = kVocab, .tied_embeddings = k.tied};
}

std::unique_ptr<nn::Model> make_model(const Case& k, const tp::TensorParallel& tp) {
  if (!k.gpt) return std::make_unique<TpLm>(tp);
  if (tp.group == nullptr) return std::make_unique<nn::GptModel>(gpt_config(k));
  return std::make_unique<tp::GptModel>(
      gpt_config(k), tp::TensorParallelConfig{.tensor_parallel_size = tp.size(), .sequence_parallel = tp.sequence_parallel},
      tp.group);
}

// dp x tp over the 4 ranks; tp 1 is the plain data-parallel engine over the world.
RunResult train(const Case& k, int tp_size) {
  const comm::Group& world = test::world().group();
  const comm::Group* dp = &world;
  tp::TensorParallel tp;
  if (tp_size > 1) {
    const comm::Topology& t = topologies().of(tp_size);
    dp = &t.data_parallel();
    tp = {.group = &t.tensor_parallel(), .sequence_parallel = k.sequence_parallel};
  }
  std::unique_ptr<nn::Model> owned = make_model(k, tp);
  nn::Model& model = *owned;
  const EngineConfig cfg = make_config(k, dp->size());
  std::unique_ptr<Engine> engine = tp.group != nullptr ? std::make_unique<Engine>(model, cfg, *dp, *tp.group)
                                                       : std::make_unique<Engine>(model, cfg, *dp);
  DatasetSource source(nn::Dataset::builtin(kSeq), 3);
  RunResult r;
  r.params = engine->param_count();
  r.initial_digest = engine->param_digest();
  for (int i = 0; i < kSteps; ++i) {
    const StepReport& report = engine->train_batch(source);
    r.losses.push_back(report.loss);
    r.norms.push_back(report.grad_norm);
    r.tp_bytes += report.tp_comm_bytes_sent;
    r.skipped += report.skipped ? 1 : 0;
  }
  // The fused qkv is split with stride 3 (each rank's q, k and v rows), the MLP's proj by columns.
  r.fc = engine->fp32_param(k.gpt ? "blocks.1.attn.qkv.weight" : "fc.weight");
  r.proj = engine->fp32_param(k.gpt ? "blocks.0.mlp.proj.weight" : "proj.weight");
  r.ln = engine->fp32_param(k.gpt ? "ln_f.weight" : "ln.weight");
  r.gathered_peak = engine->memory_report().gathered_param_peak_bytes;
  return r;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  return worst;
}

void expect_same_training(const RunResult& got, const RunResult& ref, double rtol, const std::string& what) {
  EXPECT_EQ(got.params, ref.params) << what;
  EXPECT_EQ(got.skipped, ref.skipped) << what << ": fp16 overflow is agreed by every rank of dp x tp";
  EXPECT_EQ(got.initial_digest, ref.initial_digest) << what << ": the initial model differs from tp 1's";
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  double worst = 0;
  for (size_t i = 0; i < ref.losses.size(); ++i) worst = std::max(worst, std::abs(got.losses[i] / ref.losses[i] - 1));
  if (test::world().rank() == 0) std::printf("%s: losses within %.2e relative of tp 1's over %d steps\n", what.c_str(), worst, kSteps);
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], ref.losses[i], rtol * std::abs(ref.losses[i])) << what << ", step " << i + 1;
    if (!std::isfinite(ref.norms[i])) {  // an fp16 overflow: skipped by every rank alike
      EXPECT_FALSE(std::isfinite(got.norms[i])) << what << ", step " << i + 1 << " overflowed at tp 1 only";
      continue;
    }
    EXPECT_NEAR(got.norms[i], ref.norms[i], 10 * rtol * std::abs(ref.norms[i])) << what << ", grad norm of step " << i + 1;
  }
  ASSERT_EQ(got.fc.size(), ref.fc.size()) << what << ": fp32_param must give the full tp = 1 tensor";
  ASSERT_EQ(got.proj.size(), ref.proj.size());
  ASSERT_EQ(got.ln.size(), ref.ln.size());
  // fp32: the trajectories' rounding differences stay far below Adam's steps (lr = 1e-2). bf16: an
  // element whose gradient is near zero may get steps of opposite sign (Adam's steps are about lr
  // whatever the gradient's size), so elements drift up to a few lr apart over the run.
  const double atol = rtol >= 1e-3 ? 0.1 : 1e-4;
  EXPECT_LE(max_abs_diff(got.fc, ref.fc), atol) << what << ": a column-parallel weight";
  EXPECT_LE(max_abs_diff(got.proj, ref.proj), atol) << what << ": a row-parallel weight";
  EXPECT_LE(max_abs_diff(got.ln, ref.ln), atol) << what << ": a replicated norm";
}

std::string describe(const Case& k) {
  return fmt::format("{}, stage {}, {}, accumulation {}{}{}{}", k.gpt ? (k.tied ? "GPT" : "GPT untied") : "TpLm", k.stage, precision_name(k.precision), k.accumulation,
                     k.sequence_parallel ? ", sequence parallel" : "",
                     k.offload == OffloadDevice::kCpu ? ", offload cpu" : k.offload == OffloadDevice::kNvme ? ", offload nvme" : "",
                     k.lamb ? ", Lamb" : "");
}

// Returns tp 1's run (the reference).
RunResult expect_tp_trains_as_tp1(const Case& k, double rtol) {
  const RunResult ref = train(k, 1);
  EXPECT_EQ(ref.tp_bytes, 0u);
  for (int tp : {2, 4}) {
    const RunResult got = train(k, tp);
    expect_same_training(got, ref, rtol, fmt::format("dp {} x tp {}, {}", 4 / tp, tp, describe(k)));
    EXPECT_GT(got.tp_bytes, 0u) << "the TP layers' all-reduces are counted in tp_comm_bytes_sent";
    // Stage 3 gathers a module's parameters over dp: this rank's TP shards only, so less than tp 1's.
    if (k.stage == 3) EXPECT_LT(got.gathered_peak, ref.gathered_peak) << describe(k);
  }
  // The loss fell: the runs trained, not merely agreed.
  EXPECT_LT(ref.losses.back(), ref.losses.front());
  return ref;
}

// dp x tp over 4 ranks: other world sizes skip.
class EveryStage : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (test::world().size() != 4) GTEST_SKIP() << "dp x tp over 4 ranks";
  }
};
class TpEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    if (test::world().size() != 4) GTEST_SKIP() << "dp x tp over 4 ranks";
  }
};

TEST_P(EveryStage, GptTrainsAsTp1) { expect_tp_trains_as_tp1({.stage = GetParam()}, 1e-5); }
TEST_P(EveryStage, GptSequenceParallelTrainsAsTp1) {
  expect_tp_trains_as_tp1({.stage = GetParam(), .sequence_parallel = true}, 1e-5);
}
TEST_P(EveryStage, OwnModelTrainsAsTp1) {
  expect_tp_trains_as_tp1({.gpt = false, .stage = GetParam(), .sequence_parallel = GetParam() % 2 == 1}, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Stages, EveryStage, ::testing::Values(0, 1, 2, 3));

TEST_F(TpEngine, Bf16TrainsAsTp1) {
  // bf16 products round once per output; split over tp ranks a product's partial sums round
  // separately, so the losses agree to bf16's precision, not fp32's.
  expect_tp_trains_as_tp1({.tied = false, .stage = 2, .precision = Precision::kBf16, .sequence_parallel = true}, 1e-2);
}

TEST_F(TpEngine, Fp16OverflowsAreSkippedTogether) {
  // A first scale of 2^40 overflows fp16 gradients: the first steps are skipped, each halving the
  // scale, until it fits. An overflow seen by one rank's shard only (a TP shard's gradients differ
  // per tp rank) must skip the step on every rank, so tp 2 and 4 skip exactly the steps tp 1 skips.
  const Case k{.stage = 1, .precision = Precision::kFp16, .sequence_parallel = true, .scale_power = 40};
  EXPECT_GT(expect_tp_trains_as_tp1(k, 1e-2).skipped, 0) << "no step overflowed: the test proves nothing";
}

TEST_F(TpEngine, OffloadTrainsAsTp1) {
  expect_tp_trains_as_tp1({.stage = 2, .offload = OffloadDevice::kCpu}, 1e-5);
  expect_tp_trains_as_tp1({.stage = 3, .accumulation = 1, .offload = OffloadDevice::kCpu}, 1e-5);
  // NVMe: the optimizer states and the stage-3 parameter shards of this rank's slices in swap files.
  expect_tp_trains_as_tp1({.stage = 3, .accumulation = 1, .offload = OffloadDevice::kNvme}, 1e-5);
}

TEST_F(TpEngine, LambTrustRatioOverWholeTensors) {
  expect_tp_trains_as_tp1({.gpt = false, .stage = 0, .lamb = true}, 1e-5);
  expect_tp_trains_as_tp1({.stage = 1, .accumulation = 1, .lamb = true}, 1e-5);
}

TEST_F(TpEngine, ReplicasThatDifferAreAModelError) {
  const comm::Topology& t = topologies().of(2);
  TpLm model({.group = &t.tensor_parallel()});
  const EngineConfig cfg = make_config({.stage = 0}, t.data_parallel_size());
  Engine engine(model, cfg, t.data_parallel(), t.tensor_parallel());
  EXPECT_EQ(engine.tensor_parallel_size(), 2);
  const std::string digest = engine.param_digest();  // replicas agree after initialisation
  // One bit of ln.weight on tp rank 1 (stage 0, fp32: the parameter is the master weight).
  nn::Parameter* ln = nullptr;
  model.visit_params([&](nn::Parameter& p) {
    if (p.full_name() == "ln.weight") ln = &p;
  });
  ASSERT_NE(ln, nullptr);
  if (t.tensor_rank() == 1) {
    uint32_t bits;
    std::memcpy(&bits, ln->data().data<float>(), sizeof(bits));
    bits ^= 1u;
    std::memcpy(ln->data().data<float>(), &bits, sizeof(bits));
  }
  try {
    engine.param_digest();
    ADD_FAILURE() << "differing replicas were not detected";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'ln.weight' is replicated over the tensor-parallel group"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(TpEngine, ModelOfAnotherDegreeIsRefused) {
  // Built for tp 4, given tp 2: refused before any collective, naming a parameter and both sizes.
  TpLm model({.group = &topologies().of(4).tensor_parallel()});
  const comm::Topology& t = topologies().of(2);
  const EngineConfig cfg = make_config({}, t.data_parallel_size());
  try {
    Engine engine(model, cfg, t.data_parallel(), t.tensor_parallel());
    ADD_FAILURE() << "a model of tp 4 was accepted by an engine of tp 2";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("of 4, but the engine runs with a tensor-parallel group of 2 rank(s)"),
              std::string::npos)
        << e.what();
  }
  // A compressed optimizer cannot keep replicas equal: a ConfigError naming the keys.
  TpLm two({.group = &t.tensor_parallel()});
  EngineConfig onebit = cfg;
  onebit.optimizer = OptimizerConfig("OneBitAdam", optim::OneBitAdamConfig{});
  try {
    Engine engine(two, onebit, t.data_parallel(), t.tensor_parallel());
    ADD_FAILURE() << "OneBitAdam was accepted at tp 2";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.type: OneBitAdam with model.tensor_parallel_size 2"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace zs::engine
