// The usage comments atop the main public headers, line for line: engine/engine.h,
// estimate/measure.h, memory/backend.h, and nn/module.h's shared-weights module. Each test holds the same lines as its header's comment
// between "---- from <header>" markers, with only what the comment leaves to the reader defined
// around them (a config, a data source, a kernel). When a signature changes, this test fails to
// compile until the comment and these lines are fixed together.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "comm/world.h"
#include "engine/config.h"
#include "engine/engine.h"
#include "estimate/measure.h"
#include "memory/backend.h"
#include "nn/gpt.h"
#include "nn/model.h"
#include "nn/host_context.h"
#include "nn/param_access.h"
#include "optim/adam.h"
#include "run/run_config.h"

namespace zs {
namespace {

nn::GptConfig tiny_gpt() { return {.n_layer = 1, .d_model = 32, .n_head = 2, .seq_len = 8, .vocab_size = 64}; }

zs::run::RunConfig tiny_config(int world_size) {
  zs::run::RunConfig cfg;
  cfg.batch = engine::resolve_batch(16 * world_size, 0, 2, world_size);
  cfg.optimizer = engine::OptimizerConfig("AdamW", optim::AdamConfig{.lr = 1e-3});
  cfg.device.memory_mb = 16;
  cfg.train_steps = 2;
  cfg.model = tiny_gpt();
  return cfg;
}

TEST(UsageSnippets, EngineHeader) {
  const zs::run::RunConfig cfg = tiny_config(1);
  int64_t filled = 0;
  // The caller's data: token ids (B, T) and their next tokens.
  auto fill_micro_batch = [&](nn::Batch& batch, int64_t step, int64_t m) {
    const nn::GptConfig& g = *cfg.model;
    batch.inputs = memory::Tensor::empty({cfg.batch.micro_batch_per_rank, g.seq_len}, memory::DType::kI32);
    batch.targets = memory::Tensor::empty({cfg.batch.micro_batch_per_rank, g.seq_len}, memory::DType::kI32);
    int32_t* x = batch.inputs.data<int32_t>();
    int32_t* y = batch.targets.data<int32_t>();
    for (int64_t i = 0; i < batch.inputs.numel(); ++i) {
      x[i] = static_cast<int32_t>((i + step + m) % g.vocab_size);
      y[i] = static_cast<int32_t>((i + step + m + 1) % g.vocab_size);
    }
    ++filled;
  };

  // ---- from engine/engine.h
  auto world = comm::World::create({.timeout_s = cfg.comm.timeout_s});  // mpirun, or a world of one
  nn::GptModel model(*cfg.model);                       // cfg: a run::RunConfig (run/run.h); allocates nothing
  engine::Engine engine(model, cfg, world.group());     // places and initialises the model states
  nn::Batch batch;
  for (int64_t step = 0; step < cfg.train_steps; ++step) {
    for (int64_t m = 0; m < cfg.batch.gradient_accumulation_steps; ++m) {
      fill_micro_batch(batch, step, m);                 // yours: this rank's micro-batch m of `step`
      engine.forward(batch);
      engine.backward();
      engine.step();                                    // DeepSpeed style: steps at the boundary
    }
  }
  // ----

  EXPECT_EQ(filled, cfg.train_steps * cfg.batch.gradient_accumulation_steps);
  EXPECT_EQ(engine.global_step(), cfg.train_steps);
}

// The BatchSource the training would use (values do not matter to the estimate; shapes do).
class MySource final : public engine::BatchSource {
 public:
  void fill(nn::Batch& batch, int64_t, int64_t, int64_t count) override {
    const int64_t t = tiny_gpt().seq_len;
    batch.inputs = memory::Tensor::empty({count, t}, memory::DType::kI32);
    batch.targets = memory::Tensor::empty({count, t}, memory::DType::kI32);
  }
};

TEST(UsageSnippets, MeasureHeader) {
  const zs::run::RunConfig cfg = tiny_config(8);
  // ---- from estimate/measure.h
  nn::GptModel model(*cfg.model);                      // cfg: a run::RunConfig; or your own nn::Model
  MySource source;                                      // yours: the BatchSource training would use
  engine::Measurement m = engine::estimate(model, cfg, /*ranks=*/8, source);
  for (const auto& r : m.classes) std::printf("ranks %d-%d: device peak %llu\n", r.first_rank, r.last_rank,
                                              (unsigned long long)r.memory.device_peak_bytes);
  // ----

  EXPECT_EQ(m.ranks, 8);
  EXPECT_FALSE(m.classes.empty());
  EXPECT_GT(m.of_rank(7).memory.device_peak_bytes, 0u);
}

int kernel_calls = 0;
void my_cpu_kernel(float* p) {
  p[0] += 1.0f;
  ++kernel_calls;
}

TEST(UsageSnippets, BackendHeader) {
  using namespace memory;
  const size_t device_bytes = size_t{4} << 20;
  std::vector<std::byte> host(size_t{1} << 20, std::byte{0});
  const void* host_ptr = host.data();

  // ---- from memory/backend.h
  auto backend = make_backend("cpu", device_bytes);
  Segment seg = backend->allocate(1 << 20, Tier::kDevice);   // freed when `seg` goes out of scope
  backend->copy(seg.data(), Tier::kDevice, host_ptr, Tier::kHost, 1 << 20);   // counted: host -> device
  backend->fill_zero(seg.data(), Tier::kDevice, 1 << 20);
  run_kernel(*backend, [&] { my_cpu_kernel(static_cast<float*>(seg.data())); });  // skipped when measuring
  backend->synchronize();                                     // operations are complete after this
  // ----

  EXPECT_EQ(kernel_calls, 1);
  EXPECT_EQ(backend->transfers().host_to_device_bytes, uint64_t{1} << 20);
  EXPECT_EQ(static_cast<const float*>(seg.data())[0], 1.0f);
}

namespace shared {
using namespace nn;
using memory::Tensor;

// ---- from nn/module.h
class TwiceLinear : public Module {
 public:
  explicit TwiceLinear(int64_t d) : w_(declare_param("weight", {d, d}, Init::normal(0.0f, 0.3f))) {}
  std::string_view type_name() const override { return "TwiceLinear"; }
 protected:
  Tensor forward(Context& ctx, const Tensor& x) override {    // x (n, d) -> (n, d)
    Tensor h = apply(ctx, x), y = apply(ctx, h);              // first use, second use
    if (ctx.training()) { x_ = x; h_ = h; }
    return y;
  }
  Tensor backward(Context& ctx, const Tensor& dy) override {
    GradAccumulator g(ctx, w_);                                // both uses add into one gradient
    Tensor dx = back(ctx, back(ctx, dy, h_, g), x_, g);
    x_ = h_ = {};
    return dx;
  }
  void clear_own_saved() override { x_ = h_ = {}; }
 private:
  Tensor apply(Context& ctx, const Tensor& in);                                  // in W^T
  Tensor back(Context& ctx, const Tensor& dout, const Tensor& in, GradAccumulator& g);  // g += dout^T in; dout W
  Parameter& w_;
  Tensor x_, h_;
};
// ----

// What the comment leaves to the reader: the arithmetic, in plain loops.
Tensor TwiceLinear::apply(Context& ctx, const Tensor& in) {
  const int64_t n = in.size(0), d = in.size(1);
  Tensor w = weight_f32(ctx, w_);
  Tensor out = ctx.allocate({n, d}, memory::DType::kF32, MemoryUse::kActivation);
  if (!ctx.computes()) return out;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < d; ++i) {
      float acc = 0.0f;
      for (int64_t j = 0; j < d; ++j) acc += in.f32()[size_t(r * d + j)] * w.f32()[size_t(i * d + j)];
      out.f32()[size_t(r * d + i)] = acc;
    }
  }
  return out;
}

Tensor TwiceLinear::back(Context& ctx, const Tensor& dout, const Tensor& in, GradAccumulator& g) {
  const int64_t n = in.size(0), d = in.size(1);
  Tensor w = weight_f32(ctx, w_);
  Tensor din = ctx.allocate({n, d}, memory::DType::kF32, MemoryUse::kGradient);
  if (!ctx.computes()) return din;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < d; ++j) {
      float acc = 0.0f;
      for (int64_t i = 0; i < d; ++i) {
        acc += dout.f32()[size_t(r * d + i)] * w.f32()[size_t(i * d + j)];
        g.data()[i * d + j] += dout.f32()[size_t(r * d + i)] * in.f32()[size_t(r * d + j)];
      }
      din.f32()[size_t(r * d + j)] = acc;
    }
  }
  return din;
}

// Loss sum(y * r) for a fixed r: dL/dy = r.
class Probe : public Model {
 public:
  explicit Probe(int64_t d) : net_(add_child<TwiceLinear>("net", d)) {}
  std::string_view type_name() const override { return "Probe"; }
 protected:
  float forward_loss(Context& ctx, const Batch& batch) override {
    Tensor y = ctx.forward(net_, batch.inputs);
    if (ctx.training()) rows_ = y.size(0);
    double sum = 0.0;
    for (size_t i = 0; i < y.f32().size(); ++i) sum += double(y.f32()[i]) * batch.targets.f32()[i];
    if (ctx.training()) r_ = batch.targets;
    return float(sum / double(y.size(0)));
  }
  void backward_loss(Context& ctx, float grad_scale) override {
    Tensor dy = ctx.allocate(r_.shape(), memory::DType::kF32, MemoryUse::kGradient);
    for (size_t i = 0; i < dy.f32().size(); ++i) dy.f32()[i] = grad_scale * r_.f32()[i] / float(rows_);
    r_ = {};
    ctx.backward(net_, dy);
  }
  void clear_own_saved() override { r_ = {}; }
 private:
  TwiceLinear& net_;
  Tensor r_;
  int64_t rows_ = 1;
};

Batch probe_batch(int64_t n, int64_t d, int seed) {
  Batch b;
  b.inputs = Tensor::empty({n, d}, memory::DType::kF32);
  b.targets = Tensor::empty({n, d}, memory::DType::kF32);
  for (int64_t i = 0; i < n * d; ++i) {
    b.inputs.f32()[size_t(i)] = float((i * 7 + seed) % 11) / 11.0f - 0.5f;
    b.targets.f32()[size_t(i)] = float((i * 5 + seed) % 13) / 13.0f - 0.5f;
  }
  return b;
}

class ProbeSource final : public engine::BatchSource {
 public:
  void fill(Batch& batch, int64_t step, int64_t first, int64_t count) override {
    batch = probe_batch(count, 3, int(step * 31 + first));
  }
};

}  // namespace shared

// Both uses of the weight reach its gradient: backward against central differences.
TEST(UsageSnippets, SharedWeightGradientIsBothUses) {
  shared::Probe model(3);
  nn::materialize(model, 5);
  const nn::Batch batch = shared::probe_batch(4, 3, 1);
  nn::HostContext ctx;
  ctx.forward_loss(model, batch);
  ctx.backward_loss(model, 1.0f);
  nn::Parameter& w = *model.find_param("net.weight");
  nn::HostContext eval(/*training=*/false);
  for (size_t k = 0; k < 9; ++k) {
    const float saved = w.data().f32()[k];
    const float h = 1e-2f;
    w.data().f32()[k] = saved + h;
    const double up = eval.forward_loss(model, batch);
    w.data().f32()[k] = saved - h;
    const double down = eval.forward_loss(model, batch);
    w.data().f32()[k] = saved;
    EXPECT_NEAR(w.grad().f32()[k], (up - down) / (2 * h), 2e-3) << "element " << k;
  }
}

// Under the Engine the shared weight trains the same at ZeRO stage 0 and 3 (gathered once per use
// of its module, for both uses).
TEST(UsageSnippets, SharedWeightTrainsAtEveryStage) {
  auto world = comm::World::create({});
  std::vector<double> losses[2];
  for (int s = 0; s < 2; ++s) {
    zs::run::RunConfig cfg;
    cfg.batch = engine::resolve_batch(8, 0, 2, 1);
    cfg.zero.stage = s == 0 ? 0 : 3;
    cfg.zero.stage3_param_persistence_threshold = 0;
    cfg.optimizer = engine::OptimizerConfig("AdamW", optim::AdamConfig{.lr = 1e-2});
    cfg.device.memory_mb = 16;
    shared::Probe model(3);
    engine::Engine engine(model, cfg, world.group());
    shared::ProbeSource source;
    for (int i = 0; i < 3; ++i) losses[s].push_back(engine.train_batch(source).loss);
    losses[s].push_back(engine.eval_batch(source, 100));
  }
  ASSERT_EQ(losses[0].size(), losses[1].size());
  for (size_t i = 0; i < losses[0].size(); ++i) EXPECT_NEAR(losses[0][i], losses[1][i], 1e-5) << i;
  EXPECT_NE(losses[0][0], losses[0][2]);
}

}  // namespace
}  // namespace zs
