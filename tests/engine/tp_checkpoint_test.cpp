// Checkpoints of tensor-parallel parameters (Note [tensor-parallel checkpoints] in
// engine/engine_checkpoint_items.cpp): a slice is stored at its places in the full tensor, so a
// run resumes at any tp degree, data-parallel size and ZeRO stage, and the tools see whole tensors.
//   - SliceModel (np 2): parameters cut along rows, along columns, and with a stride (qkv), plus one
//     replicated; tp 2 is two ranks, each an engine over a data-parallel group of its own and the
//     world as its tensor-parallel group. Saved at tp 2 stage 3, loaded at tp 1 x dp 2 stage 1 (the
//     whole tensors bit for bit), continued with the losses of the run never interrupted, saved, and
//     loaded back at tp 2 ZeRO-0, whose save equals it; consolidate gives the whole tensors; compare finds the tp 2 and tp 1
//     runs' checkpoints equal (layout aside); CAdam's packed states go from tp 2 to tp 1 exactly.
//     Errors: another full shape, CAdam's blocks cut by a slice.
//   - tp::GptModel (np 4): saved at dp 2 x tp 2, ZeRO-3, loaded at dp 4 x tp 1 ZeRO-1 with cpu offload
//     and at dp 1 x tp 4 ZeRO-2 with NVMe offload: the saved full tensors bit for bit, then the losses of the run never
//     interrupted (1e-5 relative); the consolidated tensors are the saved ones and, within 1e-5, the
//     tp 1 run's.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "checkpoint/h5.h"
#include "comm/topology.h"
#include "checkpoint/tools.h"
#include "core/errors.h"
#include "engine/dataset_source.h"
#include "engine/engine.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/nn.h"
#include "optim/adam.h"
#include "optim/cadam.h"
#include "run/run_config.h"
#include "tests/support/mpi_test_env.h"
#include "tp/gpt.h"

namespace zs::engine {
namespace {

namespace fs = std::filesystem;
using memory::DType;
using memory::Tensor;

// One parameter of SliceModel: its full shape and how tensor parallelism cuts it.
struct SliceSpec {
  std::string name;
  memory::Shape full;
  int dim = 0;
  int stride = 1;
  bool replicated = false;  // whole on every tensor-parallel rank
};

// The parameters: column-parallel rows (one run), a fused qkv-like weight (3 runs), row-parallel
// columns (a run per row), and a replicated one. Rows of 64 keep CAdam's 32-element blocks whole.
std::vector<SliceSpec> slice_specs(int64_t cols = 64) {
  return {{"col_weight", {8, cols}, 0, 1, false},
          {"qkv_weight", {6, cols}, 0, 3, false},
          {"row_weight", {5, cols}, 1, 1, false},
          {"row_bias", {40}, 0, 1, true}};
}

// Target of full element f for sample value s: s * t(f).
float target(uint64_t f) { return std::sin(0.37f * static_cast<float>(f) + 0.5f); }

// The parameters and their per-element loss: for each sample s_b and full element f,
// (w_f - s_b t(f))^2. Each element's term depends only on its own value, its full index and the
// sample, so a slice computes exactly the tp = 1 model's gradient for its elements, and the loss
// summed over the tensor-parallel group (as vocab-parallel cross-entropy does) is the tp = 1 loss.
// Returns this rank's share of the sum (a replicated parameter counted on tensor-parallel rank 0).
class SliceLayer : public nn::Module {
 public:
  SliceLayer(const std::vector<SliceSpec>& specs, int tp, int tp_rank) {
    for (const SliceSpec& s : specs) {
      memory::Shape local = s.full;
      if (!s.replicated) local[static_cast<size_t>(s.dim)] /= tp;
      nn::Parameter& p = declare_param(s.name, local, nn::Init::normal(0.0f, 0.5f));
      if (!s.replicated && tp > 1) p.set_tensor_slice({.dim = s.dim, .parts = tp, .index = tp_rank, .stride = s.stride});
      params_.push_back(&p);
      counted_.push_back(!s.replicated || tp_rank == 0);
      std::vector<float> t(static_cast<size_t>(p.numel()));
      p.for_each_full_run(0, t.size(), [&](uint64_t local_at, uint64_t full, uint64_t n) {
        for (uint64_t i = 0; i < n; ++i) t[local_at + i] = target(full + i);
      });
      targets_.push_back(std::move(t));
    }
  }
  std::string_view type_name() const override { return "SliceLayer"; }

 protected:
  Tensor forward(nn::Context& ctx, const Tensor& x) override {  // (B, 1) samples -> (1) the loss share
    Tensor y = ctx.allocate({1}, DType::kF32, nn::MemoryUse::kActivation);
    if (ctx.training()) x_ = x;
    if (!ctx.computes()) return y;
    double sum = 0.0;
    for (size_t k = 0; k < params_.size(); ++k) {
      if (!counted_[k]) continue;
      Tensor w = nn::weight_f32(ctx, *params_[k]);
      auto ws = w.f32();
      for (float s : x.f32()) {
        for (size_t i = 0; i < ws.size(); ++i) {
          const float d = ws[i] - s * targets_[k][i];
          sum += static_cast<double>(d) * d;
        }
      }
    }
    y.f32()[0] = static_cast<float>(sum);
    return y;
  }
  Tensor backward(nn::Context& ctx, const Tensor& dy) override {
    Tensor dx = ctx.allocate(x_.shape(), DType::kF32, nn::MemoryUse::kGradient);
    if (ctx.computes()) {
      const float g = dy.f32()[0];
      for (size_t k = 0; k < params_.size(); ++k) {
        Tensor w = nn::weight_f32(ctx, *params_[k]);
        nn::GradAccumulator acc(ctx, *params_[k]);
        auto ws = w.f32();
        for (float s : x_.f32()) {
          for (size_t i = 0; i < ws.size(); ++i) acc.data()[i] += 2.0f * g * (ws[i] - s * targets_[k][i]);
        }
        acc.commit();
      }
      std::fill(dx.f32().begin(), dx.f32().end(), 0.0f);
    }
    x_ = {};
    return dx;
  }
  void clear_own_saved() override { x_ = {}; }

 private:
  std::vector<nn::Parameter*> params_;
  std::vector<bool> counted_;
  std::vector<std::vector<float>> targets_;
  Tensor x_;
};

class SliceModel : public nn::Model {
 public:
  SliceModel(const std::vector<SliceSpec>& specs, const comm::Group* tp)
      : tp_(tp != nullptr && tp->size() > 1 ? tp : nullptr),
        layer_(add_child<SliceLayer>("slices", specs, tp_ ? tp_->size() : 1, tp_ ? tp_->rank() : 0)) {
    for (const SliceSpec& s : specs) full_elements_ += memory::shape_numel(s.full);
  }
  std::string_view type_name() const override { return "SliceModel"; }

 protected:
  float forward_loss(nn::Context& ctx, const nn::Batch& batch) override {
    rows_ = batch.inputs.size(0);
    Tensor share = ctx.forward(layer_, batch.inputs);
    if (!ctx.computes()) return 0.0f;
    float loss = share.f32()[0] / static_cast<float>(rows_ * full_elements_);
    if (tp_) {
      Tensor t(&loss, DType::kF32, {1});
      tp_->allreduce(t);
    }
    return loss;
  }
  void backward_loss(nn::Context& ctx, float grad_scale) override {
    Tensor dy = ctx.allocate({1}, DType::kF32, nn::MemoryUse::kGradient);
    if (ctx.computes()) dy.f32()[0] = grad_scale / static_cast<float>(rows_ * full_elements_);
    ctx.backward(layer_, dy);
  }

 private:
  const comm::Group* tp_;
  SliceLayer& layer_;
  int64_t full_elements_ = 0;
  int64_t rows_ = 1;
};

// Sample g of step s: the value cos(0.1 g) (a function of the global sample index only).
class SliceData final : public BatchSource {
 public:
  explicit SliceData(int64_t train_batch_size) : train_batch_size_(train_batch_size) {}
  void fill(nn::Batch& batch, int64_t step, int64_t first_sample, int64_t count) override {
    batch.inputs = Tensor::empty({count, 1}, DType::kF32);
    batch.targets = Tensor::empty({count, 1}, DType::kF32);
    for (int64_t b = 0; b < count; ++b) {
      const auto g = static_cast<float>(step * train_batch_size_ + first_sample + b);
      batch.inputs.f32()[static_cast<size_t>(b)] = std::cos(0.1f * g);
      batch.targets.f32()[static_cast<size_t>(b)] = 0.0f;
    }
  }

 private:
  int64_t train_batch_size_;
};

constexpr int64_t kBatch = 4;

zs::run::RunConfig slice_config(int dp, int stage, const std::string& opt = "AdamW") {
  zs::run::RunConfig c;
  c.batch = resolve_batch(kBatch, 0, 1, dp);
  c.zero.stage = stage;
  c.zero.reduce_bucket_size = 200;
  c.zero.allgather_bucket_size = 300;
  c.zero.stage3_param_persistence_threshold = 0;
  c.optimizer = opt == "CAdam" ? OptimizerConfig("CAdam", optim::CAdamConfig{.lr = 1e-2})
                               : OptimizerConfig("AdamW", optim::AdamConfig{.lr = 1e-2, .weight_decay = 0.1});
  c.device.memory_mb = 16;
  c.seed = 42;
  return c;
}

// A directory every rank sees (the build tree).
fs::path shared_dir(const comm::Group& world, const std::string& name) {
  fs::path dir = fs::current_path() / ("zs-tp-ckpt-test-" + name);
  if (world.rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  world.barrier();
  return dir;
}

// Every parameter's full fp32 values (Engine::fp32_param: the whole tensor at any tp degree).
std::map<std::string, std::vector<float>> full_params(Engine& e, nn::Model& m) {
  std::map<std::string, std::vector<float>> out;
  for (nn::Parameter* p : m.all_params()) out[p->full_name()] = e.fp32_param(p->full_name());
  return out;
}

// One phase of a run: an engine at `tp` (the world as tensor-parallel group, each rank its own
// data-parallel group) or at tp 1 over the world; loads `load`, trains to step `to`, saves to `save`.
struct Phase {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> loaded, final;
};

// How the 2 ranks run SliceModel: tp 2 (each rank its own data-parallel group), tp 1 x dp 2, or
// tp 1 on each rank alone (two copies of one run).
enum class Ranks { kTp2, kDp2, kAlone };

Phase run_phase(const comm::Group& world, Ranks ranks, int stage, int to, const fs::path& load, const fs::path& save,
                bool async = false, const std::string& opt = "AdamW") {
  comm::Group own = world.split(world.rank(), 0, "tp_ckpt_dp");
  const bool tp2 = ranks == Ranks::kTp2;
  const comm::Group& dp = ranks == Ranks::kDp2 ? world : own;
  SliceModel model(slice_specs(), tp2 ? &world : nullptr);
  zs::run::RunConfig cfg = slice_config(dp.size(), stage, opt);
  cfg.checkpoint.async = async;
  std::unique_ptr<Engine> engine =
      tp2 ? std::make_unique<Engine>(model, cfg, dp, world) : std::make_unique<Engine>(model, cfg, dp);
  SliceData data(kBatch);
  Phase r;
  if (!load.empty()) {
    engine->load_checkpoint(load.string());
    r.loaded = full_params(*engine, model);
  }
  while (engine->global_step() < to) r.losses.push_back(engine->train_batch(data).loss);
  if (!save.empty()) {
    engine->save_checkpoint(save.string());
    engine->wait_checkpoint();  // checkpoint.async: committed before the engine goes
  }
  r.final = full_params(*engine, model);
  return r;
}

TEST(TensorParallelCheckpoint, SliceSavedAtTp2ResumesAtTp1AndBack) {
  const comm::Group& world = test::world().group();
  if (world.size() != 2) GTEST_SKIP() << "tp 2 on 2 ranks";
  const fs::path dir = shared_dir(world, "slices");
  // Uninterrupted at tp 2, ZeRO-3 (over a data-parallel group of one): 6 steps.
  const Phase straight = run_phase(world, Ranks::kTp2, 3, 6, {}, dir / "straight");
  // Saved at step 3 at tp 2 (asynchronously); loaded at tp 1 x dp 2, ZeRO-1: the full tensors bit for
  // bit, and the same losses (rounding: the batch is split over 2 ranks).
  const Phase first = run_phase(world, Ranks::kTp2, 3, 3, {}, dir / "tp2", true);
  const Phase at_tp1 = run_phase(world, Ranks::kDp2, 1, 6, dir / "tp2", dir / "tp1");
  EXPECT_EQ(at_tp1.loaded, first.final);
  ASSERT_EQ(at_tp1.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(at_tp1.losses[i], straight.losses[3 + i], 1e-5 * std::abs(straight.losses[3 + i])) << "step " << 4 + i;
  }
  for (const auto& [name, values] : straight.final) {
    const std::vector<float>& got = at_tp1.final.at(name);
    ASSERT_EQ(got.size(), values.size()) << name;
    for (size_t i = 0; i < values.size(); ++i) ASSERT_NEAR(got[i], values[i], 1e-5) << name << "[" << i << "]";
  }
  // Saved at tp 1 (2 ranks, ZeRO-1), loaded back at tp 2 (ZeRO-0): the slices of the saved tensors;
  // saved again there, every state equals the tp 1 save's.
  const Phase back = run_phase(world, Ranks::kTp2, 0, 6, dir / "tp1", dir / "back");
  EXPECT_EQ(back.loaded, at_tp1.final);
  if (world.rank() == 0) {
    const checkpoint::CompareResult same = checkpoint::compare(dir / "tp1", dir / "back", 0.0, 0.0);
    EXPECT_TRUE(same.equal) << same.report;
    // The tp 2 and tp 1 runs' checkpoints at step 6 hold the same states (within rounding); the
    // layout (world size, tp, stage) is reported, not compared.
    const checkpoint::CompareResult cmp = checkpoint::compare(dir / "straight", dir / "tp1", 1e-4, 1e-6);
    EXPECT_TRUE(cmp.equal) << cmp.report;
    EXPECT_NE(cmp.report.find("layout: scalar tensor_parallel_size: 2 in A, 1 in B"), std::string::npos) << cmp.report;
    // inspect shows the full tensors and the writer's tp degree.
    const std::string text = checkpoint::inspect(dir / "tp2", std::nullopt);
    for (const char* want : {"world size 2 (tp 2)", "tensor slices.row_weight (5, 64) fp32",
                             "tensor slices.qkv_weight (6, 64) fp32", "scalar tensor_parallel_size = 2"}) {
      EXPECT_NE(text.find(want), std::string::npos) << "missing '" << want << "' in\n" << text;
    }
    // consolidate writes whole tensors: those of the tp 2 save.
    const fs::path out = dir / "full.h5";
    checkpoint::consolidate(dir / "tp2", out);
    checkpoint::h5::Handle file = checkpoint::h5::file_open(out);
    for (const auto& [name, values] : first.final) {
      checkpoint::h5::Handle ds = checkpoint::h5::dataset_open(file.get(), name.c_str(), out);
      std::vector<float> got(values.size());
      ASSERT_GE(H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, got.data()), 0);
      EXPECT_EQ(got, values) << name;
    }
  }
  world.barrier();
  if (world.rank() == 0) fs::remove_all(dir);
}

// CAdam's packed states (int8 momentum, a scale per 32 elements) are stored as the full tensor's: a
// tp 2 save continued at tp 1 (each rank alone, so every element sees the same gradients) steps
// exactly as the tp 2 run never interrupted.
TEST(TensorParallelCheckpoint, CAdamBlocksFollowTheFullTensor) {
  const comm::Group& world = test::world().group();
  if (world.size() != 2) GTEST_SKIP() << "tp 2 on 2 ranks";
  const fs::path dir = shared_dir(world, "cadam");
  const Phase straight = run_phase(world, Ranks::kTp2, 1, 4, {}, {}, false, "CAdam");
  const Phase first = run_phase(world, Ranks::kTp2, 1, 2, {}, dir / "tp2", false, "CAdam");
  const Phase resumed = run_phase(world, Ranks::kAlone, 2, 4, dir / "tp2", {}, false, "CAdam");
  EXPECT_EQ(resumed.loaded, first.final);
  EXPECT_EQ(resumed.losses.size(), 2u);
  EXPECT_EQ(resumed.final, straight.final);  // bit for bit: the momentum and its scales came back whole
  world.barrier();
  if (world.rank() == 0) fs::remove_all(dir);
}

// Every rank throws a CheckpointError containing `text`.
template <typename F>
void expect_everywhere(const comm::Group& g, F&& fn, const std::string& text) {
  std::string message = "<no error>";
  try {
    fn();
  } catch (const CheckpointError& e) {
    message = e.what();
  } catch (const std::exception& e) {
    message = std::string("<other error> ") + e.what();
  }
  EXPECT_NE(message.find(text), std::string::npos) << "rank " << g.rank() << ": " << message;
}

TEST(TensorParallelCheckpoint, RefusesAnotherShapeAndCutBlocks) {
  const comm::Group& world = test::world().group();
  if (world.size() != 2) GTEST_SKIP() << "tp 2 on 2 ranks";
  const fs::path dir = shared_dir(world, "errors");
  run_phase(world, Ranks::kTp2, 1, 1, {}, dir / "tp2");
  comm::Group own = world.split(world.rank(), 0, "tp_ckpt_dp");
  {
    // Another model: full rows of 96, not 64.
    SliceModel model(slice_specs(96), &world);
    Engine engine(model, slice_config(1, 1), own, world);
    expect_everywhere(world, [&] { engine.load_checkpoint((dir / "tp2").string()); },
                      "parameter 'slices.col_weight' has shape [8, 64] there but [8, 96] in this model (this rank's "
                      "slice [4, 96]");
  }
  {
    // CAdam keeps a scale per 32 elements: a slice of 48-element rows is runs of 24.
    SliceModel model({{"col_weight", {8, 64}, 0}, {"row_weight", {5, 48}, 1}}, &world);
    Engine engine(model, slice_config(1, 1, "CAdam"), own, world);
    SliceData data(kBatch);
    engine.train_batch(data);
    expect_everywhere(world, [&] { engine.save_checkpoint((dir / "cadam").string()); },
                      "parameter 'slices.row_weight' (shape [5, 24], slice 0 of 2 along dim 1, stride 1, of the full "
                      "shape [5, 48]): the optimizer states 'exp_avg_q', 'exp_avg_scale' of CAdam are kept per block "
                      "of 32 elements");
  }
  world.barrier();
  if (world.rank() == 0) fs::remove_all(dir);
}

// The tiny GPT every degree 1, 2 and 4 divides (heads, MLP width, vocabulary).
nn::GptConfig tp_gpt() { return {.n_layer = 2, .d_model = 32, .n_head = 4, .seq_len = 8, .vocab_size = 256}; }

zs::run::RunConfig gpt_config(int dp, int stage, OffloadDevice offload, const fs::path& nvme,
                              const nn::GptConfig& gpt = tp_gpt()) {
  zs::run::RunConfig c;
  c.batch = resolve_batch(8, 0, 1, dp);
  c.zero.stage = stage;
  c.zero.reduce_bucket_size = 3000;
  c.zero.allgather_bucket_size = 5000;
  c.zero.stage3_param_persistence_threshold = 100;
  c.zero.offload_optimizer.device = offload;
  c.zero.offload_optimizer.nvme_path = nvme.string();
  c.optimizer = OptimizerConfig("AdamW", optim::AdamConfig{.lr = 3e-3, .weight_decay = 0.1});
  c.gradient_clipping = 1.0;
  c.device.memory_mb = 32;
  c.seed = 42;
  c.model = gpt;
  return c;
}

// A run of the GPT at tp (dp = world / tp), `stage` and `offload` (NVMe: swap files in `swap`): loads
// `load`, trains to step `to`, saving to `save` at step `save_at`; the full fp32 tensors after the
// load, at the save and at the end.
struct GptRun {
  std::vector<double> losses;  // of steps [from, to)
  std::map<std::string, std::vector<float>> loaded, saved, final;
};

// gpt, divisible_by: the model and model.make_vocab_size_divisible_by (a padded vocabulary at tp > 1).
GptRun run_gpt(const comm::Group& world, int tp, int stage, OffloadDevice offload, const fs::path& swap, int to,
               const fs::path& load, const fs::path& save = {}, int save_at = -1, const nn::GptConfig& gpt = tp_gpt(),
               int divisible_by = 1) {
  comm::Topology topo(world, {.tensor_parallel_size = tp});
  const zs::run::RunConfig cfg = gpt_config(topo.data_parallel_size(), stage, offload, swap, gpt);
  std::unique_ptr<nn::Model> model;
  std::unique_ptr<Engine> engine;
  if (tp == 1) {
    model = std::make_unique<nn::GptModel>(*cfg.model);
    engine = std::make_unique<Engine>(*model, cfg, world);
  } else {
    model = std::make_unique<tp::GptModel>(
        *cfg.model, tp::TensorParallelConfig{.tensor_parallel_size = tp, .make_vocab_size_divisible_by = divisible_by},
        &topo.tensor_parallel());
    engine = std::make_unique<Engine>(*model, cfg, topo.data_parallel(), topo.tensor_parallel());
  }
  DatasetSource source(nn::Dataset::builtin(cfg.model->seq_len), 7);
  GptRun r;
  if (!load.empty()) {
    engine->load_checkpoint(load.string());
    r.loaded = full_params(*engine, *model);
  }
  while (engine->global_step() < to) {
    r.losses.push_back(engine->train_batch(source).loss);
    if (engine->global_step() == save_at) {
      engine->save_checkpoint(save.string());
      r.saved = full_params(*engine, *model);
    }
  }
  r.final = full_params(*engine, *model);
  return r;
}

void expect_close(const std::map<std::string, std::vector<float>>& got,
                  const std::map<std::string, std::vector<float>>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, values] : want) {
    const std::vector<float>& g = got.at(name);
    ASSERT_EQ(g.size(), values.size()) << what << ": " << name;
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_NEAR(g[i], values[i], 1e-5) << what << ": " << name << "[" << i << "]";
    }
  }
}

TEST(TensorParallelCheckpoint, GptSavedAtDp2Tp2ResumesAtDp4Tp1AndDp1Tp4) {
  const comm::Group& world = test::world().group();
  if (world.size() != 4) GTEST_SKIP() << "dp x tp over 4 ranks";
  const fs::path dir = shared_dir(world, "gpt");
  // Uninterrupted at dp 2 x tp 2, ZeRO-3, 6 steps; saved at step 3.
  const GptRun straight = run_gpt(world, 2, 3, OffloadDevice::kNone, {}, 6, {}, dir / "dp2tp2", 3);
  const GptRun tp1 = run_gpt(world, 1, 1, OffloadDevice::kNone, {}, 3, {});  // the tp = 1 model's first 3 steps
  struct Resume {
    int tp, stage;
    OffloadDevice offload;
  };
  if (world.rank() == 0) fs::create_directories(dir / "swap");
  world.barrier();
  for (const Resume& c : {Resume{1, 1, OffloadDevice::kCpu}, Resume{4, 2, OffloadDevice::kNvme}}) {
    const std::string what = fmt::format("dp {} x tp {}, ZeRO-{}", 4 / c.tp, c.tp, c.stage);
    const GptRun resumed = run_gpt(world, c.tp, c.stage, c.offload, dir / "swap", 6, dir / "dp2tp2");
    EXPECT_EQ(resumed.loaded, straight.saved) << what;  // bit for bit
    ASSERT_EQ(resumed.losses.size(), 3u) << what;
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_NEAR(resumed.losses[i], straight.losses[3 + i], 1e-5 * std::abs(straight.losses[3 + i]))
          << what << ", step " << 4 + i;
    }
  }
  if (world.rank() == 0) {
    const fs::path out = dir / "full.h5";
    checkpoint::consolidate(dir / "dp2tp2", out);
    checkpoint::h5::Handle file = checkpoint::h5::file_open(out);
    std::map<std::string, std::vector<float>> whole;
    for (const auto& [name, values] : straight.saved) {
      checkpoint::h5::Handle ds = checkpoint::h5::dataset_open(file.get(), name.c_str(), out);
      std::vector<float>& got = whole[name];
      got.resize(values.size());
      ASSERT_GE(H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, got.data()), 0) << name;
    }
    EXPECT_EQ(whole, straight.saved);
    expect_close(whole, tp1.final, "consolidated against the tp 1 run");
  }
  world.barrier();
  if (world.rank() == 0) fs::remove_all(dir);
}

// A vocabulary of 257 (odd: no tp divides it) padded as Megatron's --make-vocab-size-divisible-by:
// at tp 2 with 64 to 384 rows (rank 1 holds 65 real rows and 127 of padding), at tp 4 with 1 to 260.
// The padding never enters the softmax and is not stored: dp 2 x tp 2 trains as dp 4 x tp 1 (the
// unpadded nn::GptModel), its checkpoint holds (257, C) tensors, and it resumes at dp 4 x tp 1 and at
// dp 1 x tp 4 with the uninterrupted run's losses.
TEST(TensorParallelCheckpoint, PaddedVocabularyTrainsAsTp1AndResumesAtAnyTp) {
  const comm::Group& world = test::world().group();
  if (world.size() != 4) GTEST_SKIP() << "dp x tp over 4 ranks";
  const fs::path dir = shared_dir(world, "padded");
  nn::GptConfig odd = tp_gpt();
  odd.vocab_size = 257;
  for (bool tied : {true, false}) {
    odd.tied_embeddings = tied;
    const std::string head = tied ? "tied" : "untied";
    const GptRun straight = run_gpt(world, 2, 3, OffloadDevice::kNone, {}, 6, {}, dir / head, 3, odd, 64);
    const GptRun tp1 = run_gpt(world, 1, 3, OffloadDevice::kNone, {}, 6, {}, {}, -1, odd);
    ASSERT_EQ(straight.losses.size(), tp1.losses.size());
    for (size_t i = 0; i < tp1.losses.size(); ++i) {
      EXPECT_NEAR(straight.losses[i], tp1.losses[i], 1e-5 * std::abs(tp1.losses[i])) << head << ", step " << i + 1;
    }
    expect_close(straight.final, tp1.final, head + ": padded tp 2 against tp 1");
    EXPECT_EQ(straight.saved.at(tied ? "wte" : "lm_head.weight").size(), 257u * 32) << "the unpadded tensor";
    for (int tp : {1, 4}) {
      const GptRun resumed = run_gpt(world, tp, 1, OffloadDevice::kNone, {}, 6, dir / head, {}, -1, odd);
      EXPECT_EQ(resumed.loaded, straight.saved) << head << ", tp " << tp;  // bit for bit
      ASSERT_EQ(resumed.losses.size(), 3u);
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_NEAR(resumed.losses[i], straight.losses[3 + i], 1e-5 * std::abs(straight.losses[3 + i]))
            << head << ", resumed at tp " << tp << ", step " << 4 + i;
      }
    }
  }
  world.barrier();
  if (world.rank() == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace zs::engine
