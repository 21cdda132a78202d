// A small model with expert parameters for the engine's expert-parallel tests, without the moe/
// module: a dense Linear, two layers of 12 linear "experts" with a GELU between them, a dense head,
// mean squared error against a fixed teacher.
//
// Why it is an honest MoE for the engine. Token t (one per sample) goes to expert route(t) = its
// global sample index mod 12 (carried in the input's last column, so routing is the same for any
// world size). With expert_parallel_size E the ranks form expert-parallel (EP) groups of E
// consecutive ranks; EP rank j holds experts [j*12/E, (j+1)*12/E), named by their global index, so a
// rank's experts are initialised as the same-named experts of the E = 1 model. Dispatch is an
// allgather of the EP group's tokens (every rank sees all of them); each rank applies its experts to
// the tokens routed to them (a 0/1 mask); the combine is an allreduce (sum) of those outputs over the
// EP group, of which each rank keeps its own tokens' rows. Backward mirrors it: the output
// gradients are allgathered, each expert adds dW += sum over the EP group's tokens routed to it, and
// the input gradients are summed over the EP group. So, as with a real all-to-all, an expert's
// gradient on a rank already sums the contributions of every token its EP group sent it, while a
// dense parameter's gradient holds only this rank's tokens: the engine must average dense gradients
// over all W ranks and sum expert gradients over the expert-data-parallel group divided by W. At
// E = 1 every rank holds all 12 experts as ordinary dense parameters and routes its own tokens
// locally: the reference. Losses, gradient norms and parameters must agree for every E.
//
// Over the measuring backend (the estimator, ctx.computes() false) the layers allocate as in
// training and skip arithmetic and the EP collectives.
#pragma once

#include <cmath>
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "comm/group.h"
#include "core/rng.h"
#include "engine/engine.h"
#include "nn/nn.h"

namespace zs::engine::expert_test {

using memory::DType;
using memory::Tensor;

inline constexpr int64_t kDIn = 6, kD = 8, kDOut = 4;
inline constexpr int kExperts = 12;

// One expert: y_t = mask_t (W x_t + b), mask_t = 1 for the tokens routed to it. Its parameters carry
// kTagExpert and expert_parallel_size E (the engine's only knowledge of experts).
class Expert : public nn::Module {
 public:
  Expert(int index, int ep_size, const std::vector<int>* routes)
      : index_(index),
        routes_(routes),
        w_(declare_param("weight", {kD, kD}, nn::Init::normal(0.0f, 0.3f), {std::string(nn::kTagExpert)})),
        b_(declare_param("bias", {kD}, nn::Init::normal(0.0f, 0.1f),
                         {std::string(nn::kTagExpert), std::string(nn::kTagNoWeightDecay)})) {
    w_.set_expert_parallel_size(ep_size);
    b_.set_expert_parallel_size(ep_size);
  }
  std::string_view type_name() const override { return "Expert"; }

 protected:
  Tensor forward(nn::Context& ctx, const Tensor& x) override {  // (n, d) -> (n, d)
    const int64_t n = x.size(0);
    Tensor y = ctx.allocate({n, kD}, DType::kF32, nn::MemoryUse::kActivation);
    if (ctx.training()) x_ = x;
    if (!ctx.computes()) return y;
    Tensor w = nn::weight_f32(ctx, w_), b = nn::weight_f32(ctx, b_);
    auto xs = x.f32(), ys = y.f32(), ws = w.f32(), bs = b.f32();
    for (int64_t t = 0; t < n; ++t) {
      const bool mine = (*routes_)[static_cast<size_t>(t)] == index_;
      for (int64_t o = 0; o < kD; ++o) {
        float acc = bs[static_cast<size_t>(o)];
        for (int64_t i = 0; i < kD; ++i) acc += ws[static_cast<size_t>(o * kD + i)] * xs[static_cast<size_t>(t * kD + i)];
        ys[static_cast<size_t>(t * kD + o)] = mine ? acc : 0.0f;
      }
    }
    return y;
  }
  Tensor backward(nn::Context& ctx, const Tensor& dy) override {
    const int64_t n = dy.size(0);
    Tensor dx = ctx.allocate({n, kD}, DType::kF32, nn::MemoryUse::kGradient);
    if (ctx.computes()) {
      Tensor w = nn::weight_f32(ctx, w_);
      nn::GradAccumulator gw(ctx, w_), gb(ctx, b_);
      auto xs = x_.f32(), dys = dy.f32(), dxs = dx.f32(), ws = w.f32();
      std::fill(dxs.begin(), dxs.end(), 0.0f);
      for (int64_t t = 0; t < n; ++t) {
        if ((*routes_)[static_cast<size_t>(t)] != index_) continue;
        for (int64_t o = 0; o < kD; ++o) {
          const float g = dys[static_cast<size_t>(t * kD + o)];
          gb.data()[o] += g;
          for (int64_t i = 0; i < kD; ++i) {
            gw.data()[o * kD + i] += g * xs[static_cast<size_t>(t * kD + i)];
            dxs[static_cast<size_t>(t * kD + i)] += g * ws[static_cast<size_t>(o * kD + i)];
          }
        }
      }
      gw.commit();
      gb.commit();
    }
    x_ = {};
    return dx;
  }
  void clear_own_saved() override { x_ = {}; }

 private:
  int index_;
  const std::vector<int>* routes_;
  nn::Parameter& w_;
  nn::Parameter& b_;
  Tensor x_;
};

// h + sum of the experts' outputs, the experts spread over the EP group `ep` (ep->size() == E).
class ExpertLayer : public nn::Module {
 public:
  ExpertLayer(int ep_size, const comm::Group* ep, const std::vector<int>* routes)
      : ep_size_(ep_size), ep_(ep), local_routes_(routes) {
    const int per_rank = kExperts / ep_size;
    const int ep_rank = ep_size > 1 && ep != nullptr ? ep->rank() : 0;
    for (int g = ep_rank * per_rank; g < (ep_rank + 1) * per_rank; ++g) {
      experts_.push_back(&add_child<Expert>("e" + std::to_string(g), g, ep_size, &routes_));
    }
  }
  std::string_view type_name() const override { return "ExpertLayer"; }

 protected:
  Tensor forward(nn::Context& ctx, const Tensor& h) override {  // (B, d) -> (B, d)
    const int64_t b = h.size(0), all = b * ep_size_;
    Tensor h_all = ctx.allocate({all, kD}, DType::kF32, nn::MemoryUse::kActivation);
    Tensor out_all = ctx.allocate({all, kD}, DType::kF32, nn::MemoryUse::kScratch);
    Tensor out = ctx.allocate({b, kD}, DType::kF32, nn::MemoryUse::kActivation);
    if (ctx.computes()) {
      // Dispatch: every rank of the EP group sees the group's tokens and their routes.
      std::vector<float> r(static_cast<size_t>(b)), r_all(static_cast<size_t>(all));
      for (int64_t t = 0; t < b; ++t) r[static_cast<size_t>(t)] = static_cast<float>((*local_routes_)[static_cast<size_t>(t)]);
      if (ep_size_ > 1) {
        ep_->allgather(h, h_all);
        ep_->allgather(Tensor::of(std::span<float>(r)), Tensor::of(std::span<float>(r_all)));
      } else {
        std::memcpy(h_all.raw(), h.raw(), h.nbytes());
        r_all = r;
      }
      routes_.assign(r_all.begin(), r_all.end());
      std::fill(out_all.f32().begin(), out_all.f32().end(), 0.0f);
    }
    for (Expert* e : experts_) {
      Tensor y = ctx.forward(*e, h_all);
      if (!ctx.computes()) continue;
      auto ys = y.f32(), os = out_all.f32();
      for (size_t i = 0; i < os.size(); ++i) os[i] += ys[i];
    }
    if (!ctx.computes()) return out;
    // Combine: each token's output from whichever rank holds its expert.
    if (ep_size_ > 1) ep_->allreduce(out_all);
    const int64_t first = (ep_size_ > 1 ? ep_->rank() : 0) * b * kD;
    auto hs = h.f32(), os = out_all.f32(), ys = out.f32();
    for (int64_t i = 0; i < b * kD; ++i) ys[static_cast<size_t>(i)] = hs[static_cast<size_t>(i)] + os[static_cast<size_t>(first + i)];
    return out;
  }
  Tensor backward(nn::Context& ctx, const Tensor& dy) override {
    const int64_t b = dy.size(0), all = b * ep_size_;
    Tensor dy_all = ctx.allocate({all, kD}, DType::kF32, nn::MemoryUse::kScratch);
    Tensor dh_all = ctx.allocate({all, kD}, DType::kF32, nn::MemoryUse::kScratch);
    Tensor dh = ctx.allocate({b, kD}, DType::kF32, nn::MemoryUse::kGradient);
    if (ctx.computes()) {
      if (ep_size_ > 1) {
        ep_->allgather(dy, dy_all);
      } else {
        std::memcpy(dy_all.raw(), dy.raw(), dy.nbytes());
      }
      std::fill(dh_all.f32().begin(), dh_all.f32().end(), 0.0f);
    }
    for (auto it = experts_.rbegin(); it != experts_.rend(); ++it) {
      Tensor dx = ctx.backward(**it, dy_all);
      if (!ctx.computes()) continue;
      auto xs = dx.f32(), ds = dh_all.f32();
      for (size_t i = 0; i < ds.size(); ++i) ds[i] += xs[i];
    }
    if (!ctx.computes()) return dh;
    if (ep_size_ > 1) ep_->allreduce(dh_all);
    const int64_t first = (ep_size_ > 1 ? ep_->rank() : 0) * b * kD;
    auto dys = dy.f32(), ds = dh_all.f32(), out = dh.f32();
    for (int64_t i = 0; i < b * kD; ++i) out[static_cast<size_t>(i)] = dys[static_cast<size_t>(i)] + ds[static_cast<size_t>(first + i)];
    return dh;
  }

 private:
  int ep_size_;
  const comm::Group* ep_;
  const std::vector<int>* local_routes_;  // this rank's tokens' experts (the model's)
  std::vector<int> routes_;               // the EP group's tokens' experts, in EP rank order
  std::vector<Expert*> experts_;
};

// inputs fp32 (B, kDIn + 1): features, then the global sample index; targets fp32 (B, kDOut).
class ExpertModel : public nn::Model {
 public:
  // ep[i]: the EP group of layer i (size ep_sizes[i]; unused when 1).
  ExpertModel(std::array<int, 2> ep_sizes, std::array<const comm::Group*, 2> ep)
      : embed_(add_child<nn::Linear>("embed", kDIn, kD, true, 0.4f)),
        moe0_(add_child<ExpertLayer>("moe0", ep_sizes[0], ep[0], &routes_)),
        act_(add_child<nn::Gelu>("act")),
        moe1_(add_child<ExpertLayer>("moe1", ep_sizes[1], ep[1], &routes_)),
        head_(add_child<nn::Linear>("head", kD, kDOut, true, 0.3f)) {}
  std::string_view type_name() const override { return "ExpertModel"; }

 protected:
  float forward_loss(nn::Context& ctx, const nn::Batch& batch) override {
    const int64_t b = batch.inputs.size(0);
    Tensor x = ctx.allocate({b, kDIn}, DType::kF32, nn::MemoryUse::kActivation);
    if (ctx.computes()) {
      auto in = batch.inputs.f32(), xs = x.f32();
      routes_.resize(static_cast<size_t>(b));
      for (int64_t t = 0; t < b; ++t) {
        for (int64_t i = 0; i < kDIn; ++i) xs[static_cast<size_t>(t * kDIn + i)] = in[static_cast<size_t>(t * (kDIn + 1) + i)];
        routes_[static_cast<size_t>(t)] = static_cast<int>(in[static_cast<size_t>(t * (kDIn + 1) + kDIn)]) % kExperts;
      }
    }
    Tensor pred = ctx.forward(head_, ctx.forward(moe1_, ctx.forward(act_, ctx.forward(moe0_, ctx.forward(embed_, x)))));
    Tensor diff = ctx.allocate(pred.shape(), DType::kF32, nn::MemoryUse::kActivation);
    if (ctx.training()) diff_ = diff;
    if (!ctx.computes()) return 0.0f;
    auto p = pred.f32(), y = batch.targets.f32(), d = diff.f32();
    double sum = 0.0;
    for (size_t i = 0; i < d.size(); ++i) {
      d[i] = p[i] - y[i];
      sum += double(d[i]) * d[i];
    }
    return float(sum / double(d.size()));
  }
  void backward_loss(nn::Context& ctx, float grad_scale) override {
    Tensor dpred = ctx.allocate(diff_.shape(), DType::kF32, nn::MemoryUse::kGradient);
    if (ctx.computes()) {
      auto d = diff_.f32(), g = dpred.f32();
      const float k = 2.0f * grad_scale / float(d.size());
      for (size_t i = 0; i < d.size(); ++i) g[i] = k * d[i];
    }
    diff_ = {};
    ctx.backward(embed_, ctx.backward(moe0_, ctx.backward(act_, ctx.backward(moe1_, ctx.backward(head_, dpred)))));
  }
  void clear_own_saved() override { diff_ = {}; }

 private:
  std::vector<int> routes_;  // this micro-batch's tokens' experts
  nn::Linear& embed_;
  ExpertLayer& moe0_;
  nn::Gelu& act_;
  ExpertLayer& moe1_;
  nn::Linear& head_;
  Tensor diff_;
};

// Sample g of step s: features uniform in [-1, 1], targets sin(2 <teacher_j, x>), the index g.
class ExpertData final : public BatchSource {
 public:
  explicit ExpertData(int64_t train_batch_size) : rng_(7, "expert_test.inputs"), train_batch_size_(train_batch_size) {
    CounterRng teacher(7, "expert_test.teacher");
    for (size_t i = 0; i < teacher_.size(); ++i) teacher_[i] = teacher.normal(i) / std::sqrt(float(kDIn));
  }
  void fill(nn::Batch& batch, int64_t step, int64_t first_sample, int64_t count) override {
    batch.inputs = Tensor::empty({count, kDIn + 1}, DType::kF32);
    batch.targets = Tensor::empty({count, kDOut}, DType::kF32);
    auto x = batch.inputs.f32(), y = batch.targets.f32();
    for (int64_t b = 0; b < count; ++b) {
      const uint64_t g = uint64_t(step * train_batch_size_ + first_sample + b);
      float* xb = &x[size_t(b * (kDIn + 1))];
      rng_.fill_uniform({xb, size_t(kDIn)}, g * uint64_t(kDIn), -1.0f, 1.0f);
      xb[kDIn] = static_cast<float>(g % 1000);  // exact in fp32; mod 12 is the route
      for (int64_t j = 0; j < kDOut; ++j) {
        float dot = 0.0f;
        for (int64_t k = 0; k < kDIn; ++k) dot += teacher_[size_t(j * kDIn + k)] * xb[k];
        y[size_t(b * kDOut + j)] = std::sin(2.0f * dot);
      }
    }
  }

 private:
  CounterRng rng_;
  int64_t train_batch_size_;
  std::array<float, kDOut * kDIn> teacher_{};
};

}  // namespace zs::engine::expert_test
