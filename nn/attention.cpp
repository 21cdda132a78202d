#include "nn/attention.h"

#include <algorithm>
#include <cmath>

#include "core/errors.h"
#include "nn/detail/attention.h"
#include "nn/detail/gemm.h"
#include "nn/detail/ops.h"
#include "nn/detail/parallel.h"
#include "nn/flops.h"

namespace zs::nn {

using memory::DType;
using memory::Tensor;
using detail::Matrix;

CausalSelfAttention::CausalSelfAttention(int64_t d_model, int64_t n_head, float init_std, float proj_std)
    : d_(d_model),
      n_head_(n_head),
      qkv_(add_child<Linear>("qkv", d_model, 3 * d_model, true, init_std)),
      proj_(add_child<Linear>("proj", d_model, d_model, true, proj_std)) {
  ZS_MODEL_CHECK(n_head > 0 && d_model % n_head == 0, "d_model {} not divisible by n_head {}", d_model, n_head);
}

namespace {

// Note [causal panels]: row i of a head's scores needs only columns j <= i. Rows are taken in panels
// of kPanel; panel [r0, r1) computes, normalises and uses only columns [0, r1), so the matmuls do
// (T/kPanel + 1) / (2 T/kPanel) of the full T x T work (5/8 at T = 256) and the softmax touches
// only the causal half. The panel's own diagonal block is masked by the softmax (zeros j > i).
// Entries of P right of a row's panel are never written nor read.
constexpr int64_t kPanel = 64;

// Causal softmax of the panel of score rows [r0, r1) at `panel` (row stride T, already scaled): row i
// over j <= i, zeros for i < j < r1.
void causal_softmax_panel(float* panel, int64_t T, int64_t r0, int64_t r1) {
  for (int64_t i = r0; i < r1; ++i) {
    float* row = panel + (i - r0) * T;
    const int64_t n = i + 1;
    const float mx = detail::max_of(row, n);
    for (int64_t j = 0; j < n; ++j) row[j] = detail::fast_exp(row[j] - mx);
    const float inv = 1.0f / detail::sum_of(row, n);
    for (int64_t j = 0; j < n; ++j) row[j] *= inv;
    for (int64_t j = n; j < r1; ++j) row[j] = 0.0f;
  }
}

}  // namespace

Tensor detail::causal_attention_forward(Context& ctx, const Tensor& qkv, int64_t n_head, detail::GemmPath path,
                                       bool keep_probs, Tensor* probs_out, const detail::SingleThreadedBlas& blas) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C3 = qkv.size(2), C = C3 / 3, H = n_head, hs = C / n_head;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  Tensor y = ctx.allocate({B, T, C}, DType::kF32, MemoryUse::kActivation);
  const int chunks = detail::parallel_chunks(blas.threads(), B * H, 1);
  const bool keep = keep_probs;  // P saved for backward
  Tensor probs = keep ? ctx.allocate({B, H, T, T}, DType::kF32, MemoryUse::kActivation)
                      : ctx.allocate({chunks, T, T}, DType::kF32, MemoryUse::kScratch);
  const float* qp = qkv.data<float>();
  float* pp = probs.data<float>();
  float* yp = y.data<float>();
  detail::parallel_for_threads(blas.threads(), B * H, 1, [=](int64_t bh0, int64_t bh1, int chunk) {
    for (int64_t bh = bh0; bh < bh1; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const float* q = qp + b * T * C3 + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* p = pp + (keep ? bh : chunk) * T * T;
      float* yh = yp + b * T * C + h * hs;
      for (int64_t r0 = 0; r0 < T; r0 += kPanel) {
        const int64_t r1 = std::min(T, r0 + kPanel), rows = r1 - r0;
        detail::gemm(path, rows, r1, hs, scale, Matrix::f32(q + r0 * C3, C3), Matrix::f32(k, C3, true), 0.0f, p + r0 * T,
                     T);
        causal_softmax_panel(p + r0 * T, T, r0, r1);
        detail::gemm(path, rows, hs, r1, 1.0f, Matrix::f32(p + r0 * T, T), Matrix::f32(v, C3), 0.0f, yh + r0 * C, C);
      }
    }
  });
  *probs_out = probs;
  return y;
}

std::string_view attention_kernel_name(AttentionKernel k) { return k == AttentionKernel::kFused ? "fused" : "plain"; }

Tensor CausalSelfAttention::forward(Context& ctx, const Tensor& x) {
  ZS_MODEL_CHECK(x.dim() == 3 && x.size(2) == d_, "CausalSelfAttention: expected (B, T, {}), got {}", d_,
            memory::shape_string(x.shape()));
  const bool train = ctx.training();
  Tensor qkv = ctx.forward(qkv_, x);
  compute_dtype_ = qkv_.weight_dtype();
  ZS_MODEL_CHECK(sparsity_ == nullptr || kernel_ == AttentionKernel::kFused,
                 "CausalSelfAttention: a block-sparse layout needs the fused kernel (the plain one has no sparse path); "
                 "remove model.attention \"plain\" or the sparse_attention section");
  if (kernel_ == AttentionKernel::kFused) {
    const int64_t hs = d_ / n_head_;
    FusedAttentionSaved saved = fused_attention_forward(ctx, {qkv, 0, n_head_}, {qkv, d_, n_head_},
                                                        {qkv, 2 * d_, n_head_}, hs, compute_dtype_,
                                                        {sparsity_.get(), 0});
    Tensor y = saved.out;
    if (train) {
      qkv_out_ = qkv;
      fused_ = std::move(saved);
    }
    return ctx.forward(proj_, y);
  }
  const bool keep = train && !recompute_scores_;  // P saved for backward
  // Heads run in parallel, each product single-threaded: a head's T x T x hs products are too
  // small for OpenBLAS to split well (Note [compute threads], nn/detail/parallel.h).
  detail::SingleThreadedBlas blas;
  Tensor probs;  // P, or the kernels' scratch: freed after proj's forward
  Tensor y =
      detail::causal_attention_forward(ctx, qkv, n_head_, detail::gemm_path_for(compute_dtype_), keep, &probs, blas);
  if (train) qkv_out_ = qkv;
  if (keep) probs_ = probs;
  return ctx.forward(proj_, y);
}

Tensor detail::causal_attention_backward(Context& ctx, const Tensor& qkv, const Tensor& probs, const Tensor& dy,
                                        int64_t n_head, detail::GemmPath path, AttentionScratch* scratch,
                                        const detail::SingleThreadedBlas& blas) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C3 = qkv.size(2), C = C3 / 3, H = n_head, hs = C / n_head;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  Tensor dqkv = ctx.allocate({B, T, C3}, DType::kF32, MemoryUse::kGradient);
  const int chunks = detail::parallel_chunks(blas.threads(), B * H, 1);
  Tensor dp_buf = ctx.allocate({chunks, kPanel, T}, DType::kF32, MemoryUse::kScratch);
  // Selective recompute: one panel of P per chunk, recomputed as the forward computed it.
  const bool recompute = probs.raw() == nullptr;
  Tensor p_buf = recompute ? ctx.allocate({chunks, kPanel, T}, DType::kF32, MemoryUse::kScratch) : Tensor();
  const float* qp = qkv.data<float>();
  const float* pp = recompute ? nullptr : probs.data<float>();
  float* pbp = recompute ? p_buf.data<float>() : nullptr;
  const float* dyp = dy.data<float>();
  float* dqkvp = dqkv.data<float>();
  float* dpp = dp_buf.data<float>();
  detail::parallel_for_threads(blas.threads(), B * H, 1, [=](int64_t bh0, int64_t bh1, int chunk) {
    float* dp = dpp + chunk * kPanel * T;  // one panel of dP / dS, row stride T
    float* p_panel = recompute ? pbp + chunk * kPanel * T : nullptr;
    for (int64_t bh = bh0; bh < bh1; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const float* q = qp + b * T * C3 + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkvp + b * T * C3 + h * hs;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* p = recompute ? nullptr : pp + bh * T * T;
      const float* dyh = dyp + b * T * C + h * hs;
      // dK and dV accumulate over the panels (Note [causal panels]).
      for (int64_t t = 0; t < T; ++t) {
        std::fill_n(dk + t * C3, hs, 0.0f);
        std::fill_n(dv + t * C3, hs, 0.0f);
      }
      for (int64_t r0 = 0; r0 < T; r0 += kPanel) {
        const int64_t r1 = std::min(T, r0 + kPanel), rows = r1 - r0;
        const float* pr = recompute ? p_panel : p + r0 * T;
        if (recompute) {
          detail::gemm(path, rows, r1, hs, scale, Matrix::f32(q + r0 * C3, C3), Matrix::f32(k, C3, true), 0.0f, p_panel,
                       T);
          causal_softmax_panel(p_panel, T, r0, r1);
          add_flops_recomputed(2 * static_cast<uint64_t>(rows * r1 * hs));  // nn/flops.h
        }
        const float* dyr = dyh + r0 * C;
        detail::gemm(path, rows, r1, hs, 1.0f, Matrix::f32(dyr, C), Matrix::f32(v, C3, true), 0.0f, dp, T);  // dP = dY V^T
        detail::gemm(path, r1, hs, rows, 1.0f, Matrix::f32(pr, T, true), Matrix::f32(dyr, C), 1.0f, dv, C3);  // dV += P^T dY
        // Softmax backward in place: dS = P * (dP - rowsum(P * dP)); zero where P is masked.
        for (int64_t i = 0; i < rows; ++i) {
          const float* prow = pr + i * T;
          float* drow = dp + i * T;
          const int64_t n = r0 + i + 1;
          float dot = 0.0f;
          for (int64_t j = 0; j < n; ++j) dot += prow[j] * drow[j];
          for (int64_t j = 0; j < n; ++j) drow[j] = prow[j] * (drow[j] - dot);
          for (int64_t j = n; j < r1; ++j) drow[j] = 0.0f;
        }
        detail::gemm(path, rows, hs, r1, scale, Matrix::f32(dp, T), Matrix::f32(k, C3), 0.0f, dq + r0 * C3,
                     C3);  // dQ = scale dS K
        detail::gemm(path, r1, hs, rows, scale, Matrix::f32(dp, T, true), Matrix::f32(q + r0 * C3, C3), 1.0f, dk,
                     C3);  // dK += scale dS^T Q
      }
    }
  });
  scratch->a = dp_buf;
  scratch->b = p_buf;
  return dqkv;
}

Tensor CausalSelfAttention::backward(Context& ctx, const Tensor& dout) {
  ZS_ASSERT(qkv_out_.raw() != nullptr, "CausalSelfAttention backward without saved state");
  Tensor dy = ctx.backward(proj_, dout);  // (B, T, C)
  if (kernel_ == AttentionKernel::kFused) {
    const Tensor& qkv = qkv_out_;
    Tensor dqkv = ctx.allocate(qkv.shape(), DType::kF32, MemoryUse::kGradient);
    fused_attention_backward(ctx, {qkv, 0, n_head_}, {qkv, d_, n_head_}, {qkv, 2 * d_, n_head_}, fused_, dy,
                             d_ / n_head_, compute_dtype_, {dqkv, 0, n_head_}, {dqkv, d_, n_head_},
                             {dqkv, 2 * d_, n_head_}, {sparsity_.get(), 0});
    clear_own_saved();
    dy = {};
    return ctx.backward(qkv_, dqkv);
  }
  detail::SingleThreadedBlas blas;
  detail::AttentionScratch scratch;  // freed after qkv's backward
  Tensor dqkv = detail::causal_attention_backward(ctx, qkv_out_, probs_, dy, n_head_,
                                                  detail::gemm_path_for(compute_dtype_), &scratch, blas);
  clear_own_saved();
  return ctx.backward(qkv_, dqkv);
}

}  // namespace zs::nn
