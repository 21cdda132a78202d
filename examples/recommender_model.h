// A user's own model with parameters on the root module and integer batch columns: a matrix-
// factorisation recommender (README.md, "Parameters on the root module and integer inputs"; its code
// block is checked against this file by tests/docs/readme_snippets_test.cpp).
//
// rating(u, i) = <user_factors[u], item_factors[i]> + item_bias[i], trained by mean squared error on
// synthetic ratings of a hidden low-rank model. A batch row is one (user, item) pair: batch.inputs is
// int32 (B, 2), batch.targets fp32 (B). Parameters are read through nn::weight_f32 (the parameter's
// values in fp32, whatever its storage dtype) and gradients written through nn::GradAccumulator: a
// module never touches Parameter::data()/grad() storage itself, so it runs the same at every ZeRO
// stage, in bf16 and fp16, and under the guarded backend.
#pragma once

#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "engine/engine.h"
#include "nn/nn.h"
#include "nn/param_access.h"

namespace zs::examples {

struct RecommenderConfig {
  int64_t users = 16;
  int64_t items = 12;
  int64_t rank = 4;  // factors per user and per item
};

class Recommender : public zs::nn::Model {
 public:
  explicit Recommender(const RecommenderConfig& c)
      : users_(declare_param("user_factors", {c.users, c.rank}, zs::nn::Init::normal(0.0f, 0.1f))),
        items_(declare_param("item_factors", {c.items, c.rank}, zs::nn::Init::normal(0.0f, 0.1f))),
        bias_(declare_param("item_bias", {c.items}, zs::nn::Init::zeros(), {std::string(zs::nn::kTagNoWeightDecay)})) {}
  std::string_view type_name() const override { return "Recommender"; }

 protected:
  // batch.inputs: int32 (B, 2), columns user id and item id; batch.targets: fp32 (B) ratings.
  float forward_loss(zs::nn::Context& ctx, const zs::nn::Batch& batch) override {
    const int64_t rows = batch.inputs.size(0);
    zs::memory::Tensor diff = ctx.allocate({rows}, zs::memory::DType::kF32, zs::nn::MemoryUse::kActivation);
    zs::memory::Tensor ids = ctx.allocate({rows, 2}, zs::memory::DType::kI32, zs::nn::MemoryUse::kActivation);
    if (ctx.training()) diff_ = diff, ids_ = ids;  // saved for backward_loss; evaluation saves nothing
    if (!ctx.computes()) return 0.0f;              // the memory estimator: allocations only
    zs::memory::Tensor u = zs::nn::weight_f32(ctx, users_);  // fp32 (users, rank)
    zs::memory::Tensor v = zs::nn::weight_f32(ctx, items_);  // fp32 (items, rank)
    zs::memory::Tensor b = zs::nn::weight_f32(ctx, bias_);   // fp32 (items)
    const int32_t* in = batch.inputs.data<int32_t>();
    std::copy(in, in + 2 * rows, ids.data<int32_t>());
    double sum = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      const float p = dot(u, in[2 * r], v, in[2 * r + 1]) + b.f32()[size_t(in[2 * r + 1])];
      diff.f32()[size_t(r)] = p - batch.targets.f32()[size_t(r)];
      sum += double(diff.f32()[size_t(r)]) * diff.f32()[size_t(r)];
    }
    return float(sum / double(rows));
  }

  // d(mean (p - y)^2)/dp = 2 (p - y) / B, times grad_scale; each row adds to the rows of its user and
  // item only.
  void backward_loss(zs::nn::Context& ctx, float grad_scale) override {
    if (ctx.computes()) {
      zs::memory::Tensor u = zs::nn::weight_f32(ctx, users_);
      zs::memory::Tensor v = zs::nn::weight_f32(ctx, items_);
      zs::nn::GradAccumulator gu(ctx, users_), gv(ctx, items_), gb(ctx, bias_);  // += into the grads
      const int64_t rows = diff_.size(0), k = users_.shape()[1];
      const int32_t* id = ids_.data<int32_t>();
      for (int64_t r = 0; r < rows; ++r) {
        const float g = 2.0f * grad_scale * diff_.f32()[size_t(r)] / float(rows);
        const int64_t user = id[2 * r], item = id[2 * r + 1];
        for (int64_t j = 0; j < k; ++j) {
          gu.data()[user * k + j] += g * v.f32()[size_t(item * k + j)];
          gv.data()[item * k + j] += g * u.f32()[size_t(user * k + j)];
        }
        gb.data()[item] += g;
      }
      gu.commit(), gv.commit(), gb.commit();
    }
    diff_ = {}, ids_ = {};  // saved state is dropped once backward has used it
  }
  void clear_own_saved() override { diff_ = {}, ids_ = {}; }

 private:
  static float dot(const zs::memory::Tensor& u, int64_t user, const zs::memory::Tensor& v, int64_t item) {
    const int64_t k = u.size(1);
    float s = 0.0f;
    for (int64_t j = 0; j < k; ++j) s += u.f32()[size_t(user * k + j)] * v.f32()[size_t(item * k + j)];
    return s;
  }

  zs::nn::Parameter& users_;
  zs::nn::Parameter& items_;
  zs::nn::Parameter& bias_;
  zs::memory::Tensor diff_;  // (B) prediction - rating
  zs::memory::Tensor ids_;   // (B, 2) the batch's user and item ids
};

// Ratings of a hidden rank-2 model plus nothing else, so the loss can fall to near zero. Sample g of
// step s is a pure function of its global index (the engine's BatchSource contract: any rank fills any
// sample, so the global batch is the same for any world size).
class RatingData final : public zs::engine::BatchSource {
 public:
  RatingData(const RecommenderConfig& c, uint64_t seed, int64_t train_batch_size)
      : cfg_(c), pick_(seed, "recommender.pairs"), hidden_(seed, "recommender.hidden"), batch_(train_batch_size) {}

  void fill(zs::nn::Batch& batch, int64_t step, int64_t first_sample, int64_t count) override {
    batch.inputs = zs::memory::Tensor::empty({count, 2}, zs::memory::DType::kI32);
    batch.targets = zs::memory::Tensor::empty({count}, zs::memory::DType::kF32);
    int32_t* ids = batch.inputs.data<int32_t>();
    for (int64_t r = 0; r < count; ++r) {
      const uint64_t g = uint64_t(step * batch_ + first_sample + r);
      const auto user = int32_t(pick_.uniform(2 * g) * float(cfg_.users));
      const auto item = int32_t(pick_.uniform(2 * g + 1) * float(cfg_.items));
      ids[2 * r] = user, ids[2 * r + 1] = item;
      float rating = 0.0f;
      for (uint64_t j = 0; j < 2; ++j) rating += hidden_.normal(2 * uint64_t(user) + j) * hidden_.normal(1'000'000 + 2 * uint64_t(item) + j);
      batch.targets.f32()[size_t(r)] = rating;
    }
  }

 private:
  RecommenderConfig cfg_;
  zs::CounterRng pick_, hidden_;
  int64_t batch_;
};

}  // namespace zs::examples
