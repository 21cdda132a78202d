#include "tp/mappings.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "core/errors.h"
#include "nn/detail/ops.h"
#include "nn/detail/parallel.h"
#include "nn/param_access.h"

namespace zs::tp {

using memory::DType;
using memory::Shape;
using memory::Tensor;
using nn::MemoryUse;

void all_reduce(const TensorParallel& tp, const Tensor& x) {
  if (tp.size() > 1) tp.group->allreduce(x);
}

int64_t sequence_shard(const TensorParallel& tp, int64_t T) {
  const int p = tp.size();
  if (T % p != 0) {
    throw ConfigError(fmt::format("model.sequence_parallel: sequences of {} tokens do not split over "
                                  "model.tensor_parallel_size = {} ranks; use a sequence length divisible by {} "
                                  "or turn model.sequence_parallel off",
                                  T, p, p));
  }
  return T / p;
}

namespace {

struct SequenceDims {
  int64_t B = 0, T = 0, inner = 0;  // full sequence T; inner: elements per position
};

SequenceDims dims_of(const Tensor& x, const char* who) {
  ZS_MODEL_CHECK(x.raw() != nullptr && x.dtype() == DType::kF32 && x.is_contiguous() && x.dim() >= 2,
                 "tp::{}: expected a contiguous fp32 (B, T, ...) tensor, got {}", who, memory::shape_string(x.shape()));
  return {x.size(0), x.size(1), x.numel() / std::max<int64_t>(1, x.size(0) * x.size(1))};
}

// Copies P rank-major blocks (P, B, Ts, inner) <-> (B, P * Ts, inner): to_sequence true moves the
// blocks into sequence order.
void reorder(const float* from, float* to, int64_t P, int64_t B, int64_t Ts, int64_t inner, bool to_sequence) {
  const int64_t run = Ts * inner;  // one rank's positions of one sample
  nn::detail::parallel_for(P * B, 1, [=](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t p = i / B, b = i % B;
      const int64_t blocked = (p * B + b) * run, sequential = (b * P + p) * run;
      if (to_sequence) {
        std::copy_n(from + blocked, run, to + sequential);
      } else {
        std::copy_n(from + sequential, run, to + blocked);
      }
    }
  });
}

}  // namespace

Tensor gather_sequence(nn::Context& ctx, const TensorParallel& tp, const Tensor& shard, MemoryUse use) {
  if (tp.size() == 1) return shard;
  const SequenceDims d = dims_of(shard, "gather_sequence");
  const int64_t P = tp.size();
  Shape full_shape = shard.shape();
  full_shape[1] *= P;
  Tensor full = ctx.allocate(full_shape, DType::kF32, use);
  if (d.B == 1) {  // rank-major is sequence order
    tp.group->allgather(shard, full);
    return full;
  }
  Tensor blocks = ctx.allocate({P * shard.numel()}, DType::kF32, MemoryUse::kScratch);
  tp.group->allgather(shard, blocks);
  reorder(blocks.data<float>(), full.data<float>(), P, d.B, d.T, d.inner, /*to_sequence=*/true);
  return full;
}

Tensor reduce_scatter_sequence(nn::Context& ctx, const TensorParallel& tp, const Tensor& full, MemoryUse use) {
  if (tp.size() == 1) return full;
  const SequenceDims d = dims_of(full, "reduce_scatter_sequence");
  const int64_t P = tp.size(), Ts = sequence_shard(tp, d.T);
  Shape shard_shape = full.shape();
  shard_shape[1] = Ts;
  Tensor shard = ctx.allocate(shard_shape, DType::kF32, use);
  const std::vector<size_t> counts(static_cast<size_t>(P), static_cast<size_t>(shard.numel()));
  if (d.B == 1) {
    tp.group->reduce_scatter(full, shard, counts);
    return shard;
  }
  Tensor blocks = ctx.allocate({full.numel()}, DType::kF32, MemoryUse::kScratch);
  reorder(full.data<float>(), blocks.data<float>(), P, d.B, Ts, d.inner, /*to_sequence=*/false);
  tp.group->reduce_scatter(blocks, shard, counts);
  return shard;
}

Tensor scatter_sequence(nn::Context& ctx, const TensorParallel& tp, const Tensor& full, MemoryUse use) {
  if (tp.size() == 1) return full;
  const SequenceDims d = dims_of(full, "scatter_sequence");
  const int64_t P = tp.size(), Ts = sequence_shard(tp, d.T), r = tp.rank();
  Shape shard_shape = full.shape();
  shard_shape[1] = Ts;
  Tensor shard = ctx.allocate(shard_shape, DType::kF32, use);
  const float* from = full.data<float>();
  float* to = shard.data<float>();
  const int64_t run = Ts * d.inner;
  nn::detail::parallel_for(d.B, 1, [=](int64_t b0, int64_t b1, int) {
    for (int64_t b = b0; b < b1; ++b) std::copy_n(from + (b * P + r) * run, run, to + b * run);
  });
  return shard;
}

// ---- ReplicatedGradients (Note [replicated gradients of sequence shards]) ----

ReplicatedGradients::ReplicatedGradients(nn::Context& ctx, const TensorParallel& tp, std::vector<nn::Parameter*> params)
    : ctx_(ctx), tp_(tp), params_(std::move(params)) {
  if (!tp_.sharded_sequence()) return;
  int64_t total = 0;
  for (const nn::Parameter* p : params_) total += p->numel();
  buffer_ = ctx_.allocate({total}, DType::kF32, MemoryUse::kScratch);
  if (nn::detail::kernels_enabled()) buffer_.zero();
  int64_t at = 0;
  for (nn::Parameter* p : params_) {
    saved_.push_back(p->grad());
    p->set_grad(buffer_.range({static_cast<size_t>(at), static_cast<size_t>(p->numel())}).view(p->shape()));
    at += p->numel();
  }
  active_ = true;
}

void ReplicatedGradients::restore() {
  for (size_t i = 0; i < saved_.size(); ++i) params_[i]->set_grad(saved_[i]);
  active_ = false;
}

ReplicatedGradients::~ReplicatedGradients() {
  if (active_) restore();
}

void ReplicatedGradients::reduce() {
  if (!active_) return;
  restore();
  tp_.group->allreduce(buffer_);
  int64_t at = 0;
  for (nn::Parameter* p : params_) {
    nn::GradAccumulator g(ctx_, *p);
    nn::detail::add(g.data(), buffer_.data<float>() + at, g.data(), p->numel());
    g.commit();
    at += p->numel();
  }
}

}  // namespace zs::tp
