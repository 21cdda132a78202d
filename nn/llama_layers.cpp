// nn::RmsNorm, nn::SwiGluMlp, nn::GqaAttention and nn::LlamaBlock (nn/llama.h), and the computations
// between their linears (nn/detail/llama_ops.h).
#include "core/errors.h"
#include "nn/detail/fused_ops.h"
#include "nn/detail/llama_ops.h"
#include "nn/detail/ops.h"
#include "nn/detail/pre_norm_block.h"
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
  Tensor h = detail::swiglu(ctx, g, u);
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
  Tensor dg, du;
  detail::swiglu_grad(ctx, dh, g_, u_, &dg, &du);
  dh = {};
  clear_own_saved();
  // Reverse of the forward's order: up, then gate.
  Tensor dx = ctx.backward(up_, du);
  du = {};
  Tensor dx_gate = ctx.backward(gate_, dg);
  detail::add(dx.data<float>(), dx_gate.data<float>(), dx.data<float>(), dx.numel());
  return dx;
}

// ---- the computations between the linears (nn/detail/llama_ops.h) ----

Tensor detail::gqa_attention_forward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, int64_t n_head,
                                     int64_t n_kv_head, DType compute, GqaSaved* saved, const BlockSparsity& sparsity) {
  const int64_t hs = q.size(2) / n_head;
  FusedAttentionSaved s =
      fused_attention_forward(ctx, {q, 0, n_head}, {k, 0, n_kv_head}, {v, 0, n_kv_head}, hs, compute, sparsity);
  if (saved != nullptr) *saved = GqaSaved{q, k, v, s.out, s.lse};
  return s.out;
}

void detail::gqa_attention_backward(Context& ctx, const GqaSaved& saved, const Tensor& dy, int64_t n_head,
                                    int64_t n_kv_head, DType compute, Tensor* dq, Tensor* dk, Tensor* dv,
                                    const BlockSparsity& sparsity) {
  const int64_t B = dy.size(0), T = dy.size(1), C = dy.size(2), hs = C / n_head;
  *dq = ctx.allocate({B, T, C}, DType::kF32, MemoryUse::kGradient);
  *dk = ctx.allocate({B, T, n_kv_head * hs}, DType::kF32, MemoryUse::kGradient);
  *dv = ctx.allocate({B, T, n_kv_head * hs}, DType::kF32, MemoryUse::kGradient);
  fused_attention_backward(ctx, {saved.q, 0, n_head}, {saved.k, 0, n_kv_head}, {saved.v, 0, n_kv_head},
                           FusedAttentionSaved{saved.out, saved.lse}, dy, hs, compute, {*dq, 0, n_head},
                           {*dk, 0, n_kv_head}, {*dv, 0, n_kv_head}, sparsity);
}

detail::RopeTables::RopeTables(int64_t max_seq_len_, int64_t head_size, double theta)
    : max_seq_len(max_seq_len_), hs(head_size) {
  cos.resize(static_cast<size_t>(max_seq_len * hs / 2));
  sin.resize(cos.size());
  rope_tables(max_seq_len, hs, theta, cos.data(), sin.data());
}

void detail::rope_in_place(const RopeTables& rope, const Tensor& q, const Tensor& k, int64_t n_head, int64_t n_kv_head,
                           bool inverse) {
  const int64_t T = q.size(1), rows = q.size(0) * T, hs = rope.hs;
  ZS_MODEL_CHECK(T <= rope.max_seq_len, "rotary embedding: {} positions exceed max_seq_len {}", T, rope.max_seq_len);
  float* qp = q.data<float>();
  float* kp = k.data<float>();
  const float* c = rope.cos.data();
  const float* s = rope.sin.data();
  parallel_for(rows, 16, [=](int64_t r0, int64_t r1, int) {
    rope_apply(qp, r0, r1, n_head * hs, T, n_head, hs, c, s, inverse);
    rope_apply(kp, r0, r1, n_kv_head * hs, T, n_kv_head, hs, c, s, inverse);
  });
}

Tensor detail::swiglu(Context& ctx, const Tensor& g, const Tensor& u) {
  Tensor h = ctx.allocate(g.shape(), DType::kF32, MemoryUse::kActivation);
  const float* gp = g.data<float>();
  const float* up = u.data<float>();
  float* hp = h.data<float>();
  parallel_for(g.numel(), 4096, [=](int64_t i0, int64_t i1, int) { swiglu_forward(gp, up, i0, i1, hp); });
  return h;
}

void detail::swiglu_grad(Context& ctx, const Tensor& dh, const Tensor& g, const Tensor& u, Tensor* dg, Tensor* du) {
  *dg = ctx.allocate(g.shape(), DType::kF32, MemoryUse::kGradient);
  *du = ctx.allocate(u.shape(), DType::kF32, MemoryUse::kGradient);
  const float* dhp = dh.data<float>();
  const float* gp = g.data<float>();
  const float* up = u.data<float>();
  float* dgp = dg->data<float>();
  float* dup = du->data<float>();
  parallel_for(dh.numel(), 4096, [=](int64_t i0, int64_t i1, int) { swiglu_backward(dhp, gp, up, i0, i1, dgp, dup); });
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
      rope_(std::make_unique<detail::RopeTables>(max_seq_len, hs_, rope_theta)) {
  ZS_MODEL_CHECK(n_head > 0 && d_model % n_head == 0 && hs_ % 2 == 0 && n_kv_head > 0 && n_head % n_kv_head == 0,
                 "GqaAttention: d_model {} must split into n_head {} heads of an even size, n_kv_head {} divide n_head",
                 d_model, n_head, n_kv_head);
}

GqaAttention::~GqaAttention() = default;

Tensor GqaAttention::forward(Context& ctx, const Tensor& x) {
  ZS_MODEL_CHECK(x.dim() == 3 && x.size(2) == d_, "GqaAttention: expected (B, T, {}), got {}", d_,
                 memory::shape_string(x.shape()));
  const bool train = ctx.training();
  Tensor q = ctx.forward(q_, x);
  Tensor k = ctx.forward(k_, x);
  Tensor v = ctx.forward(v_, x);
  compute_dtype_ = q_.weight_dtype();
  // The rotary embedding in place on the projections' fresh outputs (a Linear saves its input only).
  detail::rope_in_place(*rope_, q, k, n_head_, n_kv_head_, false);
  detail::GqaSaved saved;
  Tensor y = detail::gqa_attention_forward(ctx, q, k, v, n_head_, n_kv_head_, compute_dtype_, train ? &saved : nullptr,
                                           {sparsity_.get(), 0});
  q = k = v = {};
  if (train) {
    saved_q_ = saved.q;
    saved_k_ = saved.k;
    saved_v_ = saved.v;
    saved_out_ = saved.out;
    saved_lse_ = saved.lse;
  }
  return ctx.forward(proj_, y);
}

Tensor GqaAttention::backward(Context& ctx, const Tensor& dout) {
  ZS_ASSERT(saved_q_.raw() != nullptr, "GqaAttention backward without saved state");
  Tensor dy = ctx.backward(proj_, dout);
  Tensor dq, dk, dv;
  detail::gqa_attention_backward(ctx, detail::GqaSaved{saved_q_, saved_k_, saved_v_, saved_out_, saved_lse_}, dy, n_head_, n_kv_head_, compute_dtype_, &dq, &dk, &dv,
                                 {sparsity_.get(), 0});
  clear_own_saved();
  dy = {};
  detail::rope_in_place(*rope_, dq, dk, n_head_, n_kv_head_, true);
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
  if (dropped_) return detail::dropped_block_forward(ctx, x, ln1_, attn_, ln2_, mlp_);
  return detail::pre_norm_block_forward(ctx, x, ln1_, attn_, ln2_, mlp_);
}

Tensor LlamaBlock::backward(Context& ctx, const Tensor& dy) {
  if (dropped_) return detail::dropped_block_backward(ctx, dy, ln1_, attn_, ln2_, mlp_);
  return detail::pre_norm_block_backward(ctx, dy, ln1_, attn_, ln2_, mlp_);
}

}  // namespace zs::nn
