#include "nn/layers.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "core/errors.h"
#include "nn/detail/gelu.h"
#include "nn/detail/gemm.h"
#include "nn/detail/linear.h"
#include "nn/detail/ops.h"
#include "nn/detail/parallel.h"
#include "nn/param_access.h"

namespace zs::nn {

using memory::DType;
using memory::Tensor;
using detail::Matrix;

// ---- Linear ----

std::string bf16_products_description() {
  const detail::Bf16GemmChoice& c = detail::bf16_gemm_choice();
  std::string s = fmt::format("{} ({}", detail::gemm_path_name(c.path), c.why);
  if (c.rate_over_fma > 0.0) s += fmt::format(": its flop rate {:.2f}x an fp32 FMA's", c.rate_over_fma);
  return s + ")";
}

namespace {
// The weight as its products read it: bf16 as stored where bf16 products run natively (Note [bf16
// products] in nn/detail/gemm.h: no fp32 copy), else fp32 (weight_f32: the data or a scratch copy).
Tensor weight_for(Context& ctx, const Parameter& p) {
  const Tensor& stored = weight_stored(ctx, p);
  if (detail::gemm_path_for(stored.dtype()) != detail::GemmPath::kSgemm) return stored;
  return weight_f32(ctx, p);
}
}  // namespace

Tensor detail::linear_forward(Context& ctx, const Tensor& x, int64_t n, const Parameter& weight, const Parameter* bias,
                              DType* weight_dtype) {
  const int64_t out = weight.shape()[0], in = weight.shape()[1];
  const Tensor w = weight_for(ctx, weight);
  if (weight_dtype != nullptr) *weight_dtype = weight.data().dtype();
  Tensor y = ctx.allocate(detail::with_last_dim(x.shape(), out), DType::kF32, MemoryUse::kActivation);
  // The bias is y's starting value (beta = 1): sgemm's path broadcasts it into y first, the bf16
  // kernel reads it in place of y (nn/detail/gemm.h).
  Tensor b = bias != nullptr ? weight_f32(ctx, *bias) : Tensor();
  detail::gemm(detail::gemm_path_for(w.dtype()), n, out, in, 1.0f, Matrix::f32(x.data<float>(), in),
               Matrix::of(w, /*trans=*/true), bias ? 1.0f : 0.0f, y.data<float>(), out,
               bias != nullptr ? b.data<float>() : nullptr);
  return y;
}

Tensor detail::linear_backward(Context& ctx, const Tensor& dy, int64_t n, const Tensor& x, Parameter& weight,
                               Parameter* bias) {
  const int64_t out = weight.shape()[0], in = weight.shape()[1];
  const float* dyp = dy.data<float>();
  const Tensor w = weight_for(ctx, weight);
  const detail::GemmPath path = detail::gemm_path_for(w.dtype());
  Tensor dx = ctx.allocate(x.shape(), DType::kF32, MemoryUse::kGradient);
  detail::gemm(path, n, in, out, 1.0f, Matrix::f32(dyp, out), Matrix::of(w), 0.0f, dx.data<float>(), in);
  {
    GradAccumulator gw(ctx, weight);
    detail::gemm(path, out, in, n, 1.0f, Matrix::f32(dyp, out, /*trans=*/true), Matrix::f32(x.data<float>(), in), 1.0f,
                 gw.data(), in);
    gw.commit();
  }
  if (bias != nullptr) {
    GradAccumulator gb(ctx, *bias);
    detail::sum_rows_into(dyp, n, out, 1, gb.data());
    gb.commit();
  }
  return dx;
}

Tensor detail::linear_backward_input(Context& ctx, const Tensor& dy, int64_t n, const Tensor& x, const Parameter& weight) {
  const int64_t out = weight.shape()[0], in = weight.shape()[1];
  const Tensor w = weight_for(ctx, weight);
  Tensor dx = ctx.allocate(x.shape(), DType::kF32, MemoryUse::kGradient);
  detail::gemm(detail::gemm_path_for(w.dtype()), n, in, out, 1.0f, Matrix::f32(dy.data<float>(), out), Matrix::of(w),
               0.0f, dx.data<float>(), in);
  return dx;
}

void detail::linear_backward_weight(Context& ctx, const Tensor& dy, int64_t n, const Tensor& x, Parameter& weight,
                                    Parameter* bias) {
  const int64_t out = weight.shape()[0], in = weight.shape()[1];
  const float* dyp = dy.data<float>();
  // The products' path linear_backward takes, read from the stored dtype: weight_for keeps a weight
  // whose path is not sgemm and converts only sgemm's to fp32, whose path is sgemm again, so the path
  // needs no conversion (weight_for here converted a bf16 weight on an AVX2 host just for its dtype).
  const detail::GemmPath path = detail::gemm_path_for(weight_stored(ctx, weight).dtype());
  {
    GradAccumulator gw(ctx, weight);
    detail::gemm(path, out, in, n, 1.0f, Matrix::f32(dyp, out, /*trans=*/true), Matrix::f32(x.data<float>(), in), 1.0f,
                 gw.data(), in);
    gw.commit();
  }
  if (bias != nullptr) {
    GradAccumulator gb(ctx, *bias);
    detail::sum_rows_into(dyp, n, out, 1, gb.data());
    gb.commit();
  }
}

Tensor detail::linear_backward_deferrable(Context& ctx, const Module& owner, const Tensor& dy, bool dy_reused, int64_t n,
                                         const Tensor& x, Parameter& weight, Parameter* bias) {
  std::vector<DeferredGrad>* later = ctx.weight_grad_sink();  // Note [deferred weight gradients]
  if (later == nullptr) return detail::linear_backward(ctx, dy, n, x, weight, bias);
  Tensor dx = detail::linear_backward_input(ctx, dy, n, x, weight);
  Tensor dy_kept = dy;
  if (dy_reused) {
    dy_kept = ctx.allocate(dy.shape(), DType::kF32, MemoryUse::kGradient);
    dy_kept.copy_from(dy);
  }
  later->push_back({&owner, [&weight, bias, n, x, d = std::move(dy_kept)](Context& c) {
                      detail::linear_backward_weight(c, d, n, x, weight, bias);
                    }});
  return dx;
}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, float init_std)
    : in_(in_features),
      out_(out_features),
      weight_(declare_param("weight", {out_features, in_features}, Init::normal(0.0f, init_std))) {
  if (bias) bias_ = &declare_param("bias", {out_features}, Init::zeros(), {std::string(kTagNoWeightDecay)});
}

Tensor Linear::forward(Context& ctx, const Tensor& x) {
  const int64_t n = detail::rows_of(x, in_, "Linear");
  Tensor y = detail::linear_forward(ctx, x, n, weight_, bias_, &weight_dtype_);
  if (ctx.training()) input_ = x;
  return y;
}

Tensor Linear::backward(Context& ctx, const Tensor& dy) {
  const int64_t n = detail::rows_of(dy, out_, "Linear backward");
  ZS_MODEL_CHECK(input_.numel() == n * in_, "Linear backward: saved input {} does not match dy {}",
            memory::shape_string(input_.shape()), memory::shape_string(dy.shape()));
  Tensor dx = detail::linear_backward_deferrable(ctx, *this, dy, !ctx.weight_grad_sink_grads_intact(), n, input_,
                                                  weight_, bias_);
  input_ = {};
  return dx;
}

// ---- Embedding ----

Embedding::Embedding(int64_t num_embeddings, int64_t dim, float init_std)
    : num_(num_embeddings), dim_(dim), weight_(declare_param("weight", {num_embeddings, dim}, Init::normal(0.0f, init_std))) {}

Tensor Embedding::forward(Context& ctx, const Tensor& ids) {
  ZS_MODEL_CHECK(ids.raw() != nullptr && ids.dtype() == DType::kI32 && ids.is_contiguous(),
            "Embedding: expected contiguous int32 ids, got a {} tensor {}", memory::dtype_name(ids.dtype()),
            memory::shape_string(ids.shape()));
  Tensor w = weight_f32(ctx, weight_);
  memory::Shape shape = ids.shape();
  shape.push_back(dim_);
  Tensor y = ctx.allocate(shape, DType::kF32, MemoryUse::kActivation);
  detail::embedding_lookup(ids.data<int32_t>(), ids.numel(), w.data<float>(), num_, dim_, nullptr, 1, y.data<float>());
  if (ctx.training()) ids_ = ids;
  return y;
}

Tensor Embedding::backward(Context& ctx, const Tensor& dy) {
  const int64_t n = detail::rows_of(dy, dim_, "Embedding backward");
  ZS_MODEL_CHECK(n == ids_.numel(), "Embedding backward: dy {} for {} ids", memory::shape_string(dy.shape()), ids_.numel());
  GradAccumulator gw(ctx, weight_);
  detail::embedding_accumulate(ids_.data<int32_t>(), n, dy.data<float>(), dim_, gw.data());
  gw.commit();
  ids_ = {};
  return {};
}

// ---- LayerNorm ----

// Note [row-interleaved sums]: a row's mean, variance and backward sums add its elements one after
// another, a chain of dependent adds that ran at one add per add latency (LayerNorm 1.9% of the large
// GPT's fp32 CPU, 2.8% of bf16's). The loops now carry kSumRows rows' chains side by side: each row's
// sum still adds its elements in the same order, so every result is the same bit for bit, and the
// independent chains overlap (or share a vector, one row per lane).
constexpr int kSumRows = 8;

namespace {

// Rows [r, r + R) of LayerNorm's forward: y, mean and rstd.
template <int R>
void layer_norm_rows(const float* xp, float* yp, const float* wp, const float* bp, float* mp, float* rp, int64_t r,
                     int64_t dim, float inv_d, float eps) {
  const float* x0 = xp + r * dim;
  float sum[R] = {}, m[R], var[R] = {};
  for (int64_t j = 0; j < dim; ++j) {
    for (int k = 0; k < R; ++k) sum[k] += x0[k * dim + j];
  }
  for (int k = 0; k < R; ++k) m[k] = sum[k] * inv_d;
  // Two-pass variance: no cancellation for rows with a large mean.
  for (int64_t j = 0; j < dim; ++j) {
    for (int k = 0; k < R; ++k) {
      const float c = x0[k * dim + j] - m[k];
      var[k] += c * c;
    }
  }
  for (int k = 0; k < R; ++k) {
    const float* xr = x0 + k * dim;
    float* yr = yp + (r + k) * dim;
    const float mk = m[k];
    const float rs = 1.0f / std::sqrt(var[k] * inv_d + eps);
    for (int64_t j = 0; j < dim; ++j) yr[j] = (xr[j] - mk) * rs * wp[j] + bp[j];
    mp[r + k] = mk;
    rp[r + k] = rs;
  }
}

// Rows [r, r + R) of LayerNorm's dx: dxhat = dy * w; dx = rstd * (dxhat - mean(dxhat) - xhat *
// mean(dxhat * xhat)).
template <int R>
void layer_norm_grad_rows(const float* xp, const float* dyp, const float* wp, const float* mp, const float* rp,
                          float* dxp, int64_t r, int64_t dim, float inv_d) {
  const float* x0 = xp + r * dim;
  const float* d0 = dyp + r * dim;
  float m[R], rs[R], sum_g[R] = {}, sum_gx[R] = {};
  for (int k = 0; k < R; ++k) {
    m[k] = mp[r + k];
    rs[k] = rp[r + k];
  }
  for (int64_t j = 0; j < dim; ++j) {
    for (int k = 0; k < R; ++k) {
      const float xhat = (x0[k * dim + j] - m[k]) * rs[k];
      const float g = d0[k * dim + j] * wp[j];
      sum_g[k] += g;
      sum_gx[k] += g * xhat;
    }
  }
  for (int k = 0; k < R; ++k) {
    const float* xr = x0 + k * dim;
    const float* dr = d0 + k * dim;
    float* dxr = dxp + (r + k) * dim;
    const float mk = m[k], rsk = rs[k];
    const float mg = sum_g[k] * inv_d;
    const float mgx = sum_gx[k] * inv_d;
    for (int64_t j = 0; j < dim; ++j) {
      const float xhat = (xr[j] - mk) * rsk;
      dxr[j] = rsk * (dr[j] * wp[j] - mg - xhat * mgx);
    }
  }
}

}  // namespace

LayerNorm::LayerNorm(int64_t dim, float eps)
    : dim_(dim),
      eps_(eps),
      weight_(declare_param("weight", {dim}, Init::ones(), {std::string(kTagNoWeightDecay)})),
      bias_(declare_param("bias", {dim}, Init::zeros(), {std::string(kTagNoWeightDecay)})) {}

Tensor LayerNorm::forward(Context& ctx, const Tensor& x) {
  const int64_t n = detail::rows_of(x, dim_, "LayerNorm");
  Tensor w = weight_f32(ctx, weight_);
  Tensor b = weight_f32(ctx, bias_);
  const bool train = ctx.training();
  Tensor y = ctx.allocate(x.shape(), DType::kF32, MemoryUse::kActivation);
  Tensor mean = ctx.allocate({n}, DType::kF32, train ? MemoryUse::kActivation : MemoryUse::kScratch);
  Tensor rstd = ctx.allocate({n}, DType::kF32, train ? MemoryUse::kActivation : MemoryUse::kScratch);
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  const float* bp = b.data<float>();
  float* yp = y.data<float>();
  const float inv_d = 1.0f / static_cast<float>(dim_);
  const int64_t dim = dim_;
  const float eps = eps_;
  float* mp = mean.data<float>();
  float* rp = rstd.data<float>();
  detail::parallel_for(n, 16, [=](int64_t r0, int64_t r1, int) {
    // Note [row-interleaved sums]: the sums of kSumRows rows at once, each in its own order.
    int64_t r = r0;
    for (; r + kSumRows <= r1; r += kSumRows) layer_norm_rows<kSumRows>(xp, yp, wp, bp, mp, rp, r, dim, inv_d, eps);
    for (; r < r1; ++r) layer_norm_rows<1>(xp, yp, wp, bp, mp, rp, r, dim, inv_d, eps);
  });
  if (train) {
    input_ = x;
    mean_ = mean;
    rstd_ = rstd;
  }
  return y;
}

Tensor LayerNorm::backward(Context& ctx, const Tensor& dy) {
  const int64_t n = detail::rows_of(dy, dim_, "LayerNorm backward");
  ZS_MODEL_CHECK(input_.numel() == dy.numel(), "LayerNorm backward: dy {} for input {}", memory::shape_string(dy.shape()),
            memory::shape_string(input_.shape()));
  Tensor w = weight_f32(ctx, weight_);
  Tensor dx = ctx.allocate(input_.shape(), DType::kF32, MemoryUse::kGradient);
  GradAccumulator gw(ctx, weight_);
  GradAccumulator gb(ctx, bias_);
  const float* xp = input_.data<float>();
  const float* dyp = dy.data<float>();
  const float* wp = w.data<float>();
  float* dxp = dx.data<float>();
  float* gwp = gw.data();
  float* gbp = gb.data();
  const float inv_d = 1.0f / static_cast<float>(dim_);
  const int64_t dim = dim_;
  const float* mp = mean_.data<float>();
  const float* rp = rstd_.data<float>();
  // dx by rows; the parameter gradients by columns, each summed over the rows in order
  // (Note [compute threads] in nn/detail/parallel.h).
  detail::parallel_for(n, 16, [=](int64_t r0, int64_t r1, int) {
    // The row sums of kSumRows rows at once (Note [row-interleaved sums]).
    int64_t r = r0;
    for (; r + kSumRows <= r1; r += kSumRows) layer_norm_grad_rows<kSumRows>(xp, dyp, wp, mp, rp, dxp, r, dim, inv_d);
    for (; r < r1; ++r) layer_norm_grad_rows<1>(xp, dyp, wp, mp, rp, dxp, r, dim, inv_d);
  });
  detail::parallel_for(dim, 64, [=](int64_t c0, int64_t c1, int) {
    for (int64_t r = 0; r < n; ++r) {
      const float m = mp[r];
      const float rs = rp[r];
      const float* xr = xp + r * dim;
      const float* dr = dyp + r * dim;
      for (int64_t j = c0; j < c1; ++j) {
        gwp[j] += dr[j] * ((xr[j] - m) * rs);
        gbp[j] += dr[j];
      }
    }
  });
  gw.commit();
  gb.commit();
  clear_own_saved();
  return dx;
}

// ---- Gelu ----

// The loops and Note [fast tanh] are in nn/detail/gelu.h (Note [gelu kernels]).

Tensor Gelu::forward(Context& ctx, const Tensor& x) {
  ZS_MODEL_CHECK(x.raw() != nullptr && x.dtype() == DType::kF32 && x.is_contiguous(), "Gelu: expected a contiguous fp32 tensor");
  Tensor y = ctx.allocate(x.shape(), DType::kF32, MemoryUse::kActivation);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  detail::parallel_for(x.numel(), int64_t{1} << 14,
                       [=](int64_t begin, int64_t end, int) { detail::gelu_forward(xp, begin, end, yp); });
  if (ctx.training()) input_ = x;
  return y;
}

Tensor Gelu::backward(Context& ctx, const Tensor& dy) {
  ZS_MODEL_CHECK(dy.numel() == input_.numel() && dy.dtype() == DType::kF32, "Gelu backward: dy {} for input {}",
            memory::shape_string(dy.shape()), memory::shape_string(input_.shape()));
  Tensor dx = ctx.allocate(input_.shape(), DType::kF32, MemoryUse::kGradient);
  const float* xp = input_.data<float>();
  const float* dyp = dy.data<float>();
  float* dxp = dx.data<float>();
  detail::parallel_for(dx.numel(), int64_t{1} << 14,
                       [=](int64_t begin, int64_t end, int) { detail::gelu_backward(xp, dyp, begin, end, dxp); });
  input_ = {};
  return dx;
}

}  // namespace zs::nn
