// The model and data of examples/standalone_mlp.cpp: a user's own nn::Model and BatchSource, kept in
// a header so the tests can hold the memory estimator to this model too (tests/estimate).
//
// The model is a two-layer MLP (Linear -> GELU -> Linear) trained by mean squared error to imitate a
// fixed "teacher" function y_j = sin(2 <w_j, x>) on synthetic inputs x uniform in [-1, 1]^d_in. The
// data is generated from a counter-based RNG, so every sample is a pure function of its global index
// and the global batch is the same for any number of ranks (the engine's BatchSource contract).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "engine/engine.h"
#include "nn/nn.h"

namespace zs::examples {

using zs::memory::DType;
using zs::memory::Tensor;

// The program's own settings: the `mlp` section of the config file.
struct MlpConfig {
  int64_t d_in = 16;     // input features
  int64_t hidden = 64;   // hidden units
  int64_t d_out = 4;     // regression targets
};

// ---- Step 1: the model ---------------------------------------------------------------------------

// A module with children. Children are declared in the constructor (this fixes the parameter names:
// fc1.weight, fc1.bias, fc2.weight, fc2.bias under the parent's name) and are only ever run through
// the Context, which lets the engine hook every module boundary.
class Mlp : public zs::nn::Module {
 public:
  Mlp(int64_t d_in, int64_t hidden, int64_t d_out)
      : fc1_(add_child<zs::nn::Linear>("fc1", d_in, hidden, /*bias=*/true, 1.0f / std::sqrt(float(d_in)))),
        act_(add_child<zs::nn::Gelu>("act")),
        fc2_(add_child<zs::nn::Linear>("fc2", hidden, d_out, /*bias=*/true, 1.0f / std::sqrt(float(hidden)))) {}
  std::string_view type_name() const override { return "Mlp"; }

 protected:
  // (B, d_in) -> (B, d_out). Each child saves what its own backward needs.
  Tensor forward(zs::nn::Context& ctx, const Tensor& x) override {
    return ctx.forward(fc2_, ctx.forward(act_, ctx.forward(fc1_, x)));
  }
  // dL/dy (B, d_out) -> dL/dx (B, d_in); parameter gradients accumulate as a side effect.
  Tensor backward(zs::nn::Context& ctx, const Tensor& dy) override {
    return ctx.backward(fc1_, ctx.backward(act_, ctx.backward(fc2_, dy)));
  }

 private:
  zs::nn::Linear& fc1_;
  zs::nn::Gelu& act_;
  zs::nn::Linear& fc2_;
};

// The root: a Model computes the mean loss of a micro-batch and backpropagates it. Here the loss is
// written by hand (mean squared error over all B x d_out outputs) to show the contract: forward_loss
// saves what backward_loss needs, backward_loss hands dL/d(output) to the network through the Context.
class Regressor : public zs::nn::Model {
 public:
  explicit Regressor(const MlpConfig& c) : net_(add_child<Mlp>("net", c.d_in, c.hidden, c.d_out)) {}
  std::string_view type_name() const override { return "Regressor"; }

 protected:
  // batch.inputs: fp32 (B, d_in); batch.targets: fp32 (B, d_out).
  float forward_loss(zs::nn::Context& ctx, const zs::nn::Batch& batch) override {
    Tensor pred = ctx.forward(net_, batch.inputs);  // fp32 (B, d_out), whatever the parameter dtype
    Tensor diff = ctx.allocate(pred.shape(), DType::kF32, zs::nn::MemoryUse::kActivation);
    if (ctx.training()) diff_ = diff;  // evaluation mode saves nothing
    if (!ctx.computes()) return 0.0f;  // the memory estimator: same allocations, no arithmetic
    auto p = pred.f32(), y = batch.targets.f32(), d = diff.f32();
    double sum = 0.0;
    for (size_t i = 0; i < d.size(); ++i) {
      d[i] = p[i] - y[i];
      sum += double(d[i]) * d[i];
    }
    return float(sum / double(d.size()));
  }
  // d(mean (p - y)^2)/dp = 2 (p - y) / n, times grad_scale (fp16 loss scale / accumulation steps).
  void backward_loss(zs::nn::Context& ctx, float grad_scale) override {
    Tensor dpred = ctx.allocate(diff_.shape(), DType::kF32, zs::nn::MemoryUse::kGradient);
    if (ctx.computes()) {
      auto d = diff_.f32(), g = dpred.f32();
      const float k = 2.0f * grad_scale / float(d.size());
      for (size_t i = 0; i < d.size(); ++i) g[i] = k * d[i];
    }
    diff_ = {};                 // saved state is dropped once backward has used it
    ctx.backward(net_, dpred);  // returns dL/d(inputs), which nothing needs here
  }
  void clear_own_saved() override { diff_ = {}; }

 private:
  Mlp& net_;
  Tensor diff_;  // (B, d_out) prediction - target, saved by forward_loss
};

// ---- Step 2: the data ----------------------------------------------------------------------------

// Sample g of step s is the pure function sample(s * train_batch_size + g): any rank can make any
// sample, so a rank fills exactly the global samples the engine assigns to it.
class TeacherData final : public zs::engine::BatchSource {
 public:
  TeacherData(const MlpConfig& c, uint64_t seed, int64_t train_batch_size)
      : cfg_(c), inputs_(seed, "mlp.inputs"), train_batch_size_(train_batch_size), teacher_(size_t(c.d_out * c.d_in)) {
    zs::CounterRng teacher(seed, "mlp.teacher");
    for (size_t i = 0; i < teacher_.size(); ++i) teacher_[i] = teacher.normal(i) / std::sqrt(float(c.d_in));
  }

  void fill(zs::nn::Batch& batch, int64_t step, int64_t first_sample, int64_t count) override {
    if (!batch.inputs.defined() || batch.inputs.size(0) != count) {  // reuse the tensors between calls
      batch.inputs = Tensor::empty({count, cfg_.d_in}, DType::kF32);
      batch.targets = Tensor::empty({count, cfg_.d_out}, DType::kF32);
    }
    auto x = batch.inputs.f32(), y = batch.targets.f32();
    for (int64_t b = 0; b < count; ++b) {
      const uint64_t g = uint64_t(step * train_batch_size_ + first_sample + b);  // global sample index
      float* xb = &x[size_t(b * cfg_.d_in)];
      inputs_.fill_uniform({xb, size_t(cfg_.d_in)}, g * uint64_t(cfg_.d_in), -1.0f, 1.0f);
      for (int64_t j = 0; j < cfg_.d_out; ++j) {
        float dot = 0.0f;
        for (int64_t k = 0; k < cfg_.d_in; ++k) dot += teacher_[size_t(j * cfg_.d_in + k)] * xb[k];
        y[size_t(b * cfg_.d_out + j)] = std::sin(2.0f * dot);
      }
    }
  }

 private:
  MlpConfig cfg_;
  zs::CounterRng inputs_;
  int64_t train_batch_size_;
  std::vector<float> teacher_;  // (d_out, d_in)
};

}  // namespace zs::examples
