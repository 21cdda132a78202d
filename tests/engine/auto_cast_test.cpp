// fp16.auto_cast: the engine casts the floating-point tensors of the batch given to forward (inputs and
// targets) to the compute dtype before the model sees them, as DeepSpeed casts a module's floating
// inputs to half; int32 token ids are never cast. A C++ regression model that takes float inputs sees
// fp16 tensors, and trains exactly as on inputs already rounded to fp16.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "comm/world.h"
#include "core/json.h"
#include "engine/config.h"
#include "engine/engine.h"
#include "memory/dtype.h"
#include "nn/layers.h"

namespace zs::engine {
namespace {

using memory::DType;
using memory::Tensor;

constexpr int64_t kWidth = 8;

// pred = fc(x), loss = mean((pred - y)^2); x and y in any float dtype (converted to fp32 here).
class Regressor final : public nn::Model {
 public:
  Regressor() : fc_(add_child<nn::Linear>("fc", kWidth, 1)) {}
  std::string_view type_name() const override { return "Regressor"; }
  std::vector<DType> seen;  // the dtype of each forward's inputs

 protected:
  float forward_loss(nn::Context& ctx, const nn::Batch& batch) override {
    seen.push_back(batch.inputs.dtype());
    EXPECT_EQ(batch.targets.dtype(), batch.inputs.dtype());
    Tensor x = to_f32(ctx, batch.inputs, nn::MemoryUse::kActivation);
    Tensor y = to_f32(ctx, batch.targets, nn::MemoryUse::kScratch);
    Tensor pred = ctx.forward(fc_, x);
    diff_ = ctx.allocate(pred.shape(), DType::kF32, nn::MemoryUse::kActivation);
    auto p = pred.f32(), t = y.f32(), d = diff_.f32();
    double sum = 0.0;
    for (size_t i = 0; i < d.size(); ++i) {
      d[i] = p[i] - t[i];
      sum += double(d[i]) * d[i];
    }
    return float(sum / double(d.size()));
  }
  void backward_loss(nn::Context& ctx, float grad_scale) override {
    Tensor dpred = ctx.allocate(diff_.shape(), DType::kF32, nn::MemoryUse::kGradient);
    auto d = diff_.f32(), g = dpred.f32();
    for (size_t i = 0; i < d.size(); ++i) g[i] = 2.0f * grad_scale * d[i] / float(d.size());
    diff_ = {};
    ctx.backward(fc_, dpred);
  }
  void clear_own_saved() override { diff_ = {}; }

 private:
  static Tensor to_f32(nn::Context& ctx, const Tensor& t, nn::MemoryUse use) {
    Tensor out = ctx.allocate(t.shape(), DType::kF32, use);
    memory::convert(t.raw(), t.dtype(), out.raw(), DType::kF32, static_cast<size_t>(t.numel()));
    return out;
  }
  nn::Linear& fc_;
  Tensor diff_;
};

// Values that fp16 does not hold exactly; `rounded`: the same values rounded to fp16 (as fp32).
class FloatData final : public BatchSource {
 public:
  explicit FloatData(bool rounded) : rounded_(rounded) {}
  void fill(nn::Batch& batch, int64_t step, int64_t first, int64_t count) override {
    batch.inputs = Tensor::empty({count, kWidth}, DType::kF32);
    batch.targets = Tensor::empty({count, 1}, DType::kF32);
    auto x = batch.inputs.f32(), y = batch.targets.f32();
    for (int64_t i = 0; i < count; ++i) {
      const double s = double(first + i) + 0.37 * double(step);
      for (int64_t j = 0; j < kWidth; ++j) x[i * kWidth + j] = value(std::sin(1.3 * s + 0.71 * double(j)) * 1.2345);
      y[i] = value(std::cos(0.9 * s) * 0.5123);
    }
  }

 private:
  float value(double v) const {
    const float f = static_cast<float>(v);
    return rounded_ ? memory::f16_to_f32(memory::f32_to_f16(f)) : f;
  }
  bool rounded_;
};

struct TrainRun {
  std::vector<float> losses;
  std::vector<DType> seen;
};

TrainRun train(const std::string& fp16_section, bool rounded_data) {
  comm::World world(comm::World::Launch::kLocal);
  const EngineConfig cfg = parse_config(
      parse_json_text(R"({"train_batch_size": 4, "optimizer": {"type": "Adam", "params": {"lr": 0.01}}, "fp16": )" +
                      fp16_section + R"(, "device": {"memory_mb": 16}})"),
      1);
  Regressor model;
  Engine engine(model, cfg, world.group());
  FloatData data(rounded_data);
  TrainRun r;
  for (int i = 0; i < 3; ++i) r.losses.push_back(engine.train_batch(data).loss);
  r.seen = model.seen;
  return r;
}

TEST(AutoCast, TheModelSeesFp16InputsAndTrainsAsOnFp16RoundedData) {
  const TrainRun cast = train(R"({"enabled": true, "auto_cast": true})", /*rounded_data=*/false);
  const TrainRun rounded = train(R"({"enabled": true})", /*rounded_data=*/true);
  const TrainRun plain = train(R"({"enabled": true})", /*rounded_data=*/false);
  for (DType d : cast.seen) EXPECT_EQ(d, DType::kF16);
  for (DType d : rounded.seen) EXPECT_EQ(d, DType::kF32);
  ASSERT_EQ(cast.losses.size(), 3u);
  for (size_t i = 0; i < cast.losses.size(); ++i) {
    EXPECT_EQ(cast.losses[i], rounded.losses[i]) << "step " << i;  // the cast is the rounding, nothing else
  }
  EXPECT_NE(cast.losses[0], plain.losses[0]);  // the data is not fp16-exact: the cast changes the loss
}

TEST(AutoCast, WithoutFp16ItIsANoteAndNothingIsCast) {
  const EngineConfig cfg =
      parse_config(parse_json_text(R"({"train_batch_size": 4, "fp16": {"enabled": false, "auto_cast": true}})"), 1);
  EXPECT_FALSE(cfg.auto_cast);
  bool noted = false;
  for (const std::string& n : cfg.notes) noted = noted || n.find("fp16.auto_cast: accepted; has no effect") == 0;
  EXPECT_TRUE(noted);
  const TrainRun r = train(R"({"enabled": false, "auto_cast": true})", false);
  for (DType d : r.seen) EXPECT_EQ(d, DType::kF32);
}

}  // namespace
}  // namespace zs::engine
