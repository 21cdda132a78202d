#include "tp/linear.h"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/errors.h"
#include "nn/detail/linear.h"
#include "nn/detail/ops.h"
#include "nn/detail/parallel.h"
#include "nn/param_access.h"

namespace zs::tp {

using memory::DType;
using memory::Tensor;
using nn::MemoryUse;

namespace {

// features / (parts * stride) * stride: this rank's share, or ModelError naming the layer.
int64_t split(int64_t features, int parts, int stride, const char* layer, const char* what) {
  ZS_MODEL_CHECK(parts >= 1 && stride >= 1 && features % (int64_t{parts} * stride) == 0,
                 "{}: {} {} is not divisible by the tensor-parallel size {}{}", layer, what, features, parts,
                 stride > 1 ? fmt::format(" times the stride {}", stride) : std::string());
  return features / parts;
}

}  // namespace

// ---- ColumnParallelLinear ----

ColumnParallelLinear::ColumnParallelLinear(int64_t in_features, int64_t out_features, TensorParallel tp, bool bias,
                                           float init_std, int stride, int64_t padded_out)
    : in_(in_features),
      out_(std::max(out_features, padded_out)),
      tp_(tp),
      weight_(declare_param("weight",
                            {split(out_, tp.size(), stride, "ColumnParallelLinear", "out_features"), in_features},
                            nn::Init::normal(0.0f, init_std))) {
  const nn::TensorSlice slice{.dim = 0,
                              .parts = tp.size(),
                              .index = tp.rank(),
                              .stride = stride,
                              .full_extent = padded_out > out_features ? out_features : 0};
  weight_.set_tensor_slice(slice);
  if (bias) {
    bias_ = &declare_param("bias", {out_ / tp.size()}, nn::Init::zeros(), {std::string(nn::kTagNoWeightDecay)});
    bias_->set_tensor_slice(slice);
  }
}

Tensor ColumnParallelLinear::forward(nn::Context& ctx, const Tensor& x) {
  const Tensor full = tp_.sharded_sequence() ? gather_sequence(ctx, tp_, x, MemoryUse::kScratch) : x;
  const int64_t n = nn::detail::rows_of(full, in_, "ColumnParallelLinear");
  Tensor y = nn::detail::linear_forward(ctx, full, n, weight_, bias_, &weight_dtype_);
  if (ctx.training()) input_ = x;
  return y;
}

Tensor ColumnParallelLinear::backward(nn::Context& ctx, const Tensor& dy) {
  const int64_t n = nn::detail::rows_of(dy, local_out_features(), "ColumnParallelLinear backward");
  const Tensor full = tp_.sharded_sequence() ? gather_sequence(ctx, tp_, input_, MemoryUse::kScratch) : input_;
  ZS_MODEL_CHECK(full.numel() == n * in_, "ColumnParallelLinear backward: saved input {} does not match dy {}",
                 memory::shape_string(full.shape()), memory::shape_string(dy.shape()));
  Tensor dx;
  if (std::vector<nn::DeferredGrad>* later = ctx.weight_grad_sink()) {  // Note [deferred weight gradients]
    dx = nn::detail::linear_backward_input(ctx, dy, n, full, weight_);
    Tensor d = ctx.allocate(dy.shape(), DType::kF32, MemoryUse::kGradient);  // the caller may reuse dy
    d.copy_from(dy);
    // The input as saved (a sequence shard with sequence parallelism: gathered again when W runs, the
    // same collective on every rank of the group, whose W passes run in one order).
    later->push_back({this, [this, n, x = std::move(input_), d = std::move(d)](nn::Context& c) {
                        const Tensor xf = tp_.sharded_sequence() ? gather_sequence(c, tp_, x, MemoryUse::kScratch) : x;
                        nn::detail::linear_backward_weight(c, d, n, xf, weight_, bias_);
                      }});
  } else {
    dx = nn::detail::linear_backward(ctx, dy, n, full, weight_, bias_);
  }
  input_ = {};
  // dx is this rank's part of the sum over the group (each rank's columns of y contribute).
  if (tp_.sharded_sequence()) return reduce_scatter_sequence(ctx, tp_, dx, MemoryUse::kGradient);
  all_reduce(tp_, dx);
  return dx;
}

// ---- RowParallelLinear ----

RowParallelLinear::RowParallelLinear(int64_t in_features, int64_t out_features, TensorParallel tp, bool bias,
                                     float init_std)
    : in_(in_features),
      out_(out_features),
      tp_(tp),
      weight_(declare_param("weight",
                            {out_features, split(in_features, tp.size(), 1, "RowParallelLinear", "in_features")},
                            nn::Init::normal(0.0f, init_std))) {
  weight_.set_tensor_slice({.dim = 1, .parts = tp.size(), .index = tp.rank()});
  // Whole on every rank: added once, after the sum over the group.
  if (bias) bias_ = &declare_param("bias", {out_features}, nn::Init::zeros(), {std::string(nn::kTagNoWeightDecay)});
}

Tensor RowParallelLinear::forward(nn::Context& ctx, const Tensor& x) {
  const int64_t n = nn::detail::rows_of(x, local_in_features(), "RowParallelLinear");
  Tensor y = nn::detail::linear_forward(ctx, x, n, weight_, nullptr, &weight_dtype_);
  if (tp_.sharded_sequence()) {
    y = reduce_scatter_sequence(ctx, tp_, y, MemoryUse::kActivation);
  } else {
    all_reduce(tp_, y);
  }
  if (bias_ != nullptr) {
    const Tensor b = nn::weight_f32(ctx, *bias_);
    const float* bp = b.data<float>();
    float* yp = y.data<float>();
    const int64_t out = out_;
    nn::detail::parallel_for(y.numel() / out, 64, [=](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r) {
        float* yr = yp + r * out;
        for (int64_t j = 0; j < out; ++j) yr[j] += bp[j];
      }
    });
  }
  if (ctx.training()) input_ = x;
  return y;
}

Tensor RowParallelLinear::backward(nn::Context& ctx, const Tensor& dy) {
  const int64_t rows = nn::detail::rows_of(dy, out_, "RowParallelLinear backward");
  const Tensor full = tp_.sharded_sequence() ? gather_sequence(ctx, tp_, dy, MemoryUse::kScratch) : dy;
  const int64_t n = full.numel() / out_;
  ZS_MODEL_CHECK(input_.numel() == n * local_in_features(),
                 "RowParallelLinear backward: saved input {} does not match dy {}",
                 memory::shape_string(input_.shape()), memory::shape_string(dy.shape()));
  Tensor dx;
  if (std::vector<nn::DeferredGrad>* later = ctx.weight_grad_sink()) {  // Note [deferred weight gradients]
    dx = nn::detail::linear_backward_input(ctx, full, n, input_, weight_);
    Tensor d = ctx.allocate(full.shape(), DType::kF32, MemoryUse::kGradient);  // whole rows, kept until W
    d.copy_from(full);
    later->push_back({this, [this, n, x = std::move(input_), d = std::move(d)](nn::Context& c) {
                        nn::detail::linear_backward_weight(c, d, n, x, weight_, nullptr);
                      }});
  } else {
    dx = nn::detail::linear_backward(ctx, full, n, input_, weight_, nullptr);
  }
  input_ = {};
  // The bias's gradient (summed over the group's shards) stays in the backward.
  if (bias_ != nullptr) {
    ReplicatedGradients replicated(ctx, tp_, {bias_});  // dy is a sequence shard with sequence parallelism
    {
      nn::GradAccumulator gb(ctx, *bias_);
      nn::detail::sum_rows_into(dy.data<float>(), rows, out_, 1, gb.data());
      gb.commit();
    }
    replicated.reduce();
  }
  return dx;
}

}  // namespace zs::tp
