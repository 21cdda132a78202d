// ZeRO stage 3 prefetches along the module order recorded in the first step. A model that changes its
// module order later gets a ModelError (the model's mistake, not the config's) naming the module
// expected and the one met - on every rank at the same point, before any collective for it, so
// nothing hangs.
#include <gtest/gtest.h>

#include "core/errors.h"
#include "engine/config.h"
#include "engine/engine.h"
#include "nn/layers.h"
#include "tests/support/mpi_test_env.h"

namespace zs::engine {
namespace {

constexpr int64_t kWidth = 16;

// Two same-shaped layers run a -> b, or b -> a once `swapped` is set; loss = mean(y^2) / 2.
class TwoLayers final : public nn::Model {
 public:
  TwoLayers() : a_(add_child<nn::Linear>("a", kWidth, kWidth)), b_(add_child<nn::Linear>("b", kWidth, kWidth)) {}
  std::string_view type_name() const override { return "TwoLayers"; }
  bool swapped = false;

 protected:
  float forward_loss(nn::Context& ctx, const nn::Batch& batch) override {
    nn::Linear& first = swapped ? b_ : a_;
    nn::Linear& second = swapped ? a_ : b_;
    y_ = ctx.forward(second, ctx.forward(first, batch.inputs));
    double sum = 0;
    for (float v : y_.f32()) sum += 0.5 * double(v) * v;
    return static_cast<float>(sum / static_cast<double>(y_.numel()));
  }
  void backward_loss(nn::Context& ctx, float grad_scale) override {
    memory::Tensor dy = ctx.allocate(y_.shape(), memory::DType::kF32, nn::MemoryUse::kGradient);
    auto src = y_.f32();
    auto dst = dy.f32();
    for (size_t i = 0; i < dst.size(); ++i) dst[i] = grad_scale * src[i] / static_cast<float>(src.size());
    nn::Linear& first = swapped ? b_ : a_;
    nn::Linear& second = swapped ? a_ : b_;
    ctx.backward(first, ctx.backward(second, dy));
    y_ = memory::Tensor();
  }
  void clear_own_saved() override { y_ = memory::Tensor(); }

 private:
  nn::Linear& a_;
  nn::Linear& b_;
  memory::Tensor y_;
};

class Ones final : public BatchSource {
 public:
  void fill(nn::Batch& batch, int64_t, int64_t, int64_t count) override {
    batch.inputs = memory::Tensor::empty({count, kWidth}, memory::DType::kF32);
    for (float& v : batch.inputs.f32()) v = 1.0f;
  }
};

TEST(Stage3Order, AChangedModuleOrderIsAnErrorNamingBothModules) {
  const comm::Group& world = test::world().group();
  EngineConfig cfg;
  cfg.batch = resolve_batch(0, 2, 1, world.size());
  cfg.zero.stage = 3;
  cfg.zero.stage3_param_persistence_threshold = 0;  // every module gathered and released
  cfg.device.memory_mb = 16;
  TwoLayers model;
  Engine engine(model, cfg, world);
  Ones data;
  engine.train_batch(data);  // records a -> b
  engine.train_batch(data);  // follows it
  model.swapped = true;
  try {
    engine.train_batch(data);
    FAIL() << "a changed module order was not detected";
  } catch (const ModelError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("expected module 'a'"), std::string::npos) << what;
    EXPECT_NE(what.find("met 'b'"), std::string::npos) << what;
    EXPECT_NE(what.find("forward"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace zs::engine
