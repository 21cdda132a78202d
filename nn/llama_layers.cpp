// nn::RmsNorm, nn::SwiGluMlp, nn::GqaAttention and nn::LlamaBlock (nn/llama.h), and the grouped-query
// attention function they go through (nn/detail/gqa_attention.h).
#include <algorithm>

#include "core/errors.h"
#include "nn/detail/attention.h"
#include "nn/detail/fused_ops.h"
#include "nn/detail/gqa_attention.h"
#include "nn/detail/ops.h"
#include "nn/detail/parallel.h"
#include "nn/llama.h"
#include "nn/param_access.h"

namespace zs::nn {

using memory::DType;
using memory::Tensor;

// ---- RmsNorm ----

RmsNorm::RmsNorm(int64_t dim, float eps)
    : dim_(dim), eps_(eps), weight_(declare_param("weight", {dim}, Init::ones(), {std::string(kTagNoWeightDecay)})) {}

Tensor RmsNorm::forward(Context& ctx, const Tensor& x) {
  const int64_t n = detail::rows_of(x, dim_, "RmsNorm");
  Tensor w = weight_f32(ctx, weight_);
  const bool train = ctx.training();
  Tensor y = ctx.allocate(x.shape(), DType::kF32, MemoryUse::kActivation);
  Tensor rstd = ctx.allocate({n}, DType::kF32, train ? MemoryUse::kActivation : MemoryUse::kScratch);
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  float* yp = y.data<float>();
  float* rp = rstd.data<float>();
  const int64_t d = dim_;
  const float eps = eps_;
  detail::parallel_for(n, 16, [=](int64_t r0, int64_t r1, int) { detail::rms_norm_forward(xp, wp, r0, r1, d, eps, yp, rp); });
  if (train) {
    input_ = x;
    rstd_ = rstd;
  }
  return y;
}

Tensor RmsNorm::backward(Context& ctx, const Tensor& dy) {
  const int64_t n = detail::rows_of(dy, dim_, "RmsNorm backward");
  ZS_MODEL_CHECK(input_.numel() == dy.numel(), "RmsNorm backward: dy {} for input {}", memory::shape_string(dy.shape()),
                 memory::shape_string(input_.shape()));
  Tensor w = weight_f32(ctx, weight_);
  Tensor dx = ctx.allocate(input_.shape(), DType::kF32, MemoryUse::kGradient);
  GradAccumulator gw(ctx, weight_);
  const float* xp = input_.data<float>();
  const float* dyp = dy.data<float>();
  const float* wp = w.data<float>();
  const float* rp = rstd_.data<float>();
  float* dxp = dx.data<float>();
  float* gwp = gw.data();
  const int64_t d = dim_;
  // dx by rows; the weight gradient by columns, each summed over the rows in order (Note [compute
  // threads] in nn/detail/parallel.h).
  detail::parallel_for(n, 16, [=](int64_t r0, int64_t r1, int) { detail::rms_norm_backward(dyp, xp, wp, rp, r0, r1, d, dxp); });
  detail::parallel_for(d, 64, [=](int64_t c0, int64_t c1, int) { detail::rms_norm_weight_grad(dyp, xp, rp, n, d, c0, c1, gwp); });
  gw.commit();
  clear_own_saved();
  return dx;
}

// ---- SwiGluMlp ----

SwiGluMlp::SwiGluMlp(int64_t d_model, int64_t hidden, float init_std)
    : gate_(add_child<Linear>("gate", d_model, hidden, false, init_std)),
      up_(add_child<Linear>("up", d_model, hidden, false, init_std)),
      proj_(add_child<Linear>("proj", hidden, d_model, false, init_std)) {}

Tensor SwiGluMlp::forward(Context& ctx, const Tensor& x) {
  Tensor g = ctx.forward(gate_, x);
  Tensor u = ctx.forward(up_, x);
  Tensor h = ctx.allocate(g.shape(), DType::kF32, MemoryUse::kActivation);
  const float* gp = g.data<float>();
  const float* up = u.data<float>();
  float* hp = h.data<float>();
  detail::parallel_for(g.numel(), 4096, [=](int64_t i0, int64_t i1, int) { detail::swiglu_forward(gp, up, i0, i1, hp); });
  if (ctx.training()) {
    g_ = g;
    u_ = u;
  }
  g = u = {};
  return ctx.forward(proj_, h);
}

Tensor SwiGluMlp::backward(Context& ctx, const Tensor& dy) {
  ZS_ASSERT(g_.raw() != nullptr, "SwiGluMlp backward without saved state");
  Tensor dh = ctx.backward(proj_, dy);
  Tensor dg = ctx.allocate(g_.shape(), DType::kF32, MemoryUse::kGradient);
  Tensor du = ctx.allocate(u_.shape(), DType::kF32, MemoryUse::kGradient);
  const float* dhp = dh.data<float>();
  const float* gp = g_.data<float>();
  const float* up = u_.data<float>();
  float* dgp = dg.data<float>();
  float* dup = du.data<float>();
  detail::parallel_for(dh.numel(), 4096,
                       [=](int64_t i0, int64_t i1, int) { detail::swiglu_backward(dhp, gp, up, i0, i1, dgp, dup); });
  dh = {};
  clear_own_saved();
  // Reverse of the forward's order: up, then gate.
  Tensor dx = ctx.backward(up_, du);
  du = {};
  Tensor dx_gate = ctx.backward(gate_, dg);
  detail::add(dx.data<float>(), dx_gate.data<float>(), dx.data<float>(), dx.numel());
  return dx;
}

// ---- the attention function (nn/detail/gqa_attention.h) ----

namespace {

// Copies heads of `src` (B*T rows of n_src * hs at stride n_src * hs) into `dst` rows (stride
// dst_stride, starting at column offset): head h of dst <- head h / rep of src.
void expand_heads(const float* src, int64_t rows, int64_t n_src, int64_t rep, int64_t hs, float* dst, int64_t dst_stride) {
  detail::parallel_for(rows, 16, [=](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t h = 0; h < n_src * rep; ++h) {
        std::copy_n(src + r * n_src * hs + (h / rep) * hs, hs, dst + r * dst_stride + h * hs);
      }
    }
  });
}

// The reverse: dst head g = sum over h with h / rep == g of src head h (in order of h).
void reduce_heads(const float* src, int64_t src_stride, int64_t rows, int64_t n_dst, int64_t rep, int64_t hs, float* dst) {
  detail::parallel_for(rows, 16, [=](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t g = 0; g < n_dst; ++g) {
        float* out = dst + r * n_dst * hs + g * hs;
        const float* in = src + r * src_stride + g * rep * hs;
        std::copy_n(in, hs, out);
        for (int64_t i = 1; i < rep; ++i) detail::add(out, in + i * hs, out, hs);
      }
    }
  });
}

}  // namespace

Tensor detail::gqa_attention_forward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, int64_t n_head,
                                     int64_t n_kv_head, GemmPath path, bool keep_probs, GqaSaved* saved) {
  const int64_t B = q.size(0), T = q.size(1), C = q.size(2), hs = C / n_head, rows = B * T, rep = n_head / n_kv_head;
  Tensor qkv = ctx.allocate({B, T, 3 * C}, DType::kF32, saved != nullptr ? MemoryUse::kActivation : MemoryUse::kScratch);
  float* dst = qkv.data<float>();
  const float* qp = q.data<float>();
  parallel_for(rows, 16, [=](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) std::copy_n(qp + r * C, C, dst + r * 3 * C);
  });
  expand_heads(k.data<float>(), rows, n_kv_head, rep, hs, dst + C, 3 * C);
  expand_heads(v.data<float>(), rows, n_kv_head, rep, hs, dst + 2 * C, 3 * C);
  SingleThreadedBlas blas;
  Tensor probs;
  Tensor y = causal_attention_forward(ctx, qkv, n_head, path, saved != nullptr && keep_probs, &probs, blas);
  if (saved != nullptr) {
    saved->qkv = qkv;
    saved->probs = keep_probs ? probs : Tensor();
  }
  return y;
}

void detail::gqa_attention_backward(Context& ctx, const GqaSaved& saved, const Tensor& dy, int64_t n_head,
                                    int64_t n_kv_head, GemmPath path, Tensor* dq, Tensor* dk, Tensor* dv) {
  const int64_t B = dy.size(0), T = dy.size(1), C = dy.size(2), hs = C / n_head, rows = B * T, rep = n_head / n_kv_head;
  Tensor dqkv;
  {
    SingleThreadedBlas blas;
    AttentionScratch scratch;
    dqkv = causal_attention_backward(ctx, saved.qkv, saved.probs, dy, n_head, path, &scratch, blas);
  }
  *dq = ctx.allocate({B, T, C}, DType::kF32, MemoryUse::kGradient);
  *dk = ctx.allocate({B, T, n_kv_head * hs}, DType::kF32, MemoryUse::kGradient);
  *dv = ctx.allocate({B, T, n_kv_head * hs}, DType::kF32, MemoryUse::kGradient);
  const float* src = dqkv.data<float>();
  float* dqp = dq->data<float>();
  parallel_for(rows, 16, [=](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) std::copy_n(src + r * 3 * C, C, dqp + r * C);
  });
  reduce_heads(src + C, 3 * C, rows, n_kv_head, rep, hs, dk->data<float>());
  reduce_heads(src + 2 * C, 3 * C, rows, n_kv_head, rep, hs, dv->data<float>());
}

// ---- GqaAttention ----

GqaAttention::GqaAttention(int64_t d_model, int64_t n_head, int64_t n_kv_head, int64_t max_seq_len, double rope_theta,
                           float init_std)
    : d_(d_model),
      n_head_(n_head),
      n_kv_head_(n_kv_head),
      hs_(d_model / n_head),
      q_(add_child<Linear>("q", d_model, d_model, false, init_std)),
      k_(add_child<Linear>("k", d_model, n_kv_head * (d_model / n_head), false, init_std)),
      v_(add_child<Linear>("v", d_model, n_kv_head * (d_model / n_head), false, init_std)),
      proj_(add_child<Linear>("proj", d_model, d_model, false, init_std)),
      max_seq_len_(max_seq_len) {
  ZS_MODEL_CHECK(n_head > 0 && d_model % n_head == 0 && hs_ % 2 == 0 && n_kv_head > 0 && n_head % n_kv_head == 0,
                 "GqaAttention: d_model {} must split into n_head {} heads of an even size, n_kv_head {} divide n_head",
                 d_model, n_head, n_kv_head);
  cos_.resize(static_cast<size_t>(max_seq_len * hs_ / 2));
  sin_.resize(cos_.size());
  detail::rope_tables(max_seq_len, hs_, rope_theta, cos_.data(), sin_.data());
}

Tensor GqaAttention::forward(Context& ctx, const Tensor& x) {
  ZS_MODEL_CHECK(x.dim() == 3 && x.size(2) == d_, "GqaAttention: expected (B, T, {}), got {}", d_,
                 memory::shape_string(x.shape()));
  const int64_t T = x.size(1), rows = x.size(0) * T;
  ZS_MODEL_CHECK(T <= max_seq_len_, "GqaAttention: {} positions exceed max_seq_len {}", T, max_seq_len_);
  const bool train = ctx.training();
  Tensor q = ctx.forward(q_, x);
  Tensor k = ctx.forward(k_, x);
  Tensor v = ctx.forward(v_, x);
  compute_dtype_ = q_.weight_dtype();
  // The rotary embedding in place on the projections' fresh outputs (a Linear saves its input only).
  float* qp = q.data<float>();
  float* kp = k.data<float>();
  const float* c = cos_.data();
  const float* s = sin_.data();
  const int64_t H = n_head_, K = n_kv_head_, hs = hs_;
  detail::parallel_for(rows, 16, [=](int64_t r0, int64_t r1, int) {
    detail::rope_apply(qp, r0, r1, H * hs, T, H, hs, c, s, false);
    detail::rope_apply(kp, r0, r1, K * hs, T, K, hs, c, s, false);
  });
  detail::GqaSaved saved;
  Tensor y = detail::gqa_attention_forward(ctx, q, k, v, n_head_, n_kv_head_, detail::gemm_path_for(compute_dtype_),
                                           !recompute_scores_, train ? &saved : nullptr);
  q = k = v = {};
  if (train) {
    qkv_ = saved.qkv;
    probs_ = saved.probs;
  }
  return ctx.forward(proj_, y);
}

Tensor GqaAttention::backward(Context& ctx, const Tensor& dout) {
  ZS_ASSERT(qkv_.raw() != nullptr, "GqaAttention backward without saved state");
  Tensor dy = ctx.backward(proj_, dout);
  Tensor dq, dk, dv;
  detail::gqa_attention_backward(ctx, detail::GqaSaved{qkv_, probs_}, dy, n_head_, n_kv_head_,
                                 detail::gemm_path_for(compute_dtype_), &dq, &dk, &dv);
  clear_own_saved();
  dy = {};
  const int64_t T = dq.size(1), rows = dq.size(0) * T;
  float* dqp = dq.data<float>();
  float* dkp = dk.data<float>();
  const float* c = cos_.data();
  const float* s = sin_.data();
  const int64_t H = n_head_, K = n_kv_head_, hs = hs_;
  detail::parallel_for(rows, 16, [=](int64_t r0, int64_t r1, int) {
    detail::rope_apply(dqp, r0, r1, H * hs, T, H, hs, c, s, true);
    detail::rope_apply(dkp, r0, r1, K * hs, T, K, hs, c, s, true);
  });
  // Reverse of the forward's order: v, k, q.
  Tensor dx = ctx.backward(v_, dv);
  dv = {};
  {
    Tensor d = ctx.backward(k_, dk);
    detail::add(dx.data<float>(), d.data<float>(), dx.data<float>(), dx.numel());
  }
  dk = {};
  Tensor d = ctx.backward(q_, dq);
  detail::add(dx.data<float>(), d.data<float>(), dx.data<float>(), dx.numel());
  return dx;
}

// ---- LlamaBlock ----

LlamaBlock::LlamaBlock(const LlamaConfig& cfg)
    : ln1_(add_child<RmsNorm>("ln1", cfg.d_model, cfg.norm_eps)),
      attn_(add_child<GqaAttention>("attn", cfg.d_model, cfg.n_head, cfg.n_kv_head, cfg.max_seq_len, cfg.rope_theta,
                                    cfg.init_std)),
      ln2_(add_child<RmsNorm>("ln2", cfg.d_model, cfg.norm_eps)),
      mlp_(add_child<SwiGluMlp>("mlp", cfg.d_model, llama_d_ff(cfg), cfg.init_std)) {}

Tensor LlamaBlock::forward(Context& ctx, const Tensor& x) {
  Tensor a = ctx.forward(attn_, ctx.forward(ln1_, x));
  Tensor x1 = ctx.allocate(x.shape(), DType::kF32, MemoryUse::kActivation);
  detail::add(x.data<float>(), a.data<float>(), x1.data<float>(), x.numel());
  a = {};
  Tensor m = ctx.forward(mlp_, ctx.forward(ln2_, x1));
  Tensor y = ctx.allocate(x.shape(), DType::kF32, MemoryUse::kActivation);
  detail::add(x1.data<float>(), m.data<float>(), y.data<float>(), x.numel());
  return y;
}

Tensor LlamaBlock::backward(Context& ctx, const Tensor& dy) {
  // As nn::Block's: the residual passes dy through; each branch's fresh gradient takes the sum in place.
  Tensor dx1 = ctx.backward(ln2_, ctx.backward(mlp_, dy));
  detail::add(dy.data<float>(), dx1.data<float>(), dx1.data<float>(), dy.numel());
  Tensor dx = ctx.backward(ln1_, ctx.backward(attn_, dx1));
  detail::add(dx1.data<float>(), dx.data<float>(), dx.data<float>(), dy.numel());
  return dx;
}

}  // namespace zs::nn
