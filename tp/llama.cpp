#include "tp/llama.h"

#include <fmt/format.h>

#include "core/errors.h"
#include "nn/detail/llama_ops.h"
#include "nn/detail/ops.h"
#include "nn/detail/parallel.h"
#include "nn/detail/pre_norm_block.h"
#include "nn/param_access.h"
#include "tp/detail/vocab.h"
#include "nn/detail/token_batch.h"

namespace zs::tp {

using memory::DType;
using memory::Tensor;
using nn::MemoryUse;

void validate_llama(const nn::LlamaConfig& cfg, int tensor_parallel_size, bool sequence_parallel, int world_size) {
  nn::validate(cfg);
  const int t = tensor_parallel_size;
  if (t < 1) throw ConfigError(fmt::format("model.tensor_parallel_size: must be a positive integer, got {}", t));
  auto divides = [&](int64_t v, const std::string& what) {
    if (v % t != 0) {
      throw ConfigError(fmt::format("model.tensor_parallel_size: {} does not divide {} = {}; choose a tensor-parallel "
                                    "size that divides {}",
                                    t, what, v, what));
    }
  };
  divides(cfg.n_head, "model.n_head");
  divides(cfg.n_kv_head, "model.n_kv_head");
  divides(nn::llama_d_ff(cfg), "the MLP width model.d_ff");
  divides(cfg.vocab_size, "model.vocab_size");
  divides(world_size, "the world size (ranks)");
  if (sequence_parallel && t > 1) {
    throw ConfigError("model.sequence_parallel: not built for model.type \"llama\" yet; set it to false (tensor "
                      "parallelism alone splits LLaMA's heads and MLP)");
  }
}

// ---- ParallelGqaAttention ----

ParallelGqaAttention::ParallelGqaAttention(const nn::LlamaConfig& cfg, TensorParallel tp)
    : heads_(cfg.n_head / tp.size()),
      kv_heads_(cfg.n_kv_head / tp.size()),
      q_(add_child<ColumnParallelLinear>("q", cfg.d_model, cfg.d_model, tp, false, cfg.init_std)),
      k_(add_child<ColumnParallelLinear>("k", cfg.d_model, cfg.n_kv_head * (cfg.d_model / cfg.n_head), tp, false,
                                         cfg.init_std)),
      v_(add_child<ColumnParallelLinear>("v", cfg.d_model, cfg.n_kv_head * (cfg.d_model / cfg.n_head), tp, false,
                                         cfg.init_std)),
      proj_(add_child<RowParallelLinear>("proj", cfg.d_model, cfg.d_model, tp, false, cfg.init_std)),
      rope_(std::make_unique<nn::detail::RopeTables>(cfg.max_seq_len, cfg.d_model / cfg.n_head, cfg.rope_theta)),
      first_head_(tp.rank() * heads_) {
  ZS_MODEL_CHECK(cfg.n_head % tp.size() == 0 && cfg.n_kv_head % tp.size() == 0,
                 "ParallelGqaAttention: n_head {} and n_kv_head {} must divide by tp {}", cfg.n_head, cfg.n_kv_head,
                 tp.size());
}

ParallelGqaAttention::~ParallelGqaAttention() = default;

Tensor ParallelGqaAttention::forward(nn::Context& ctx, const Tensor& x) {
  const bool train = ctx.training();
  Tensor q = ctx.forward(q_, x);
  Tensor k = ctx.forward(k_, x);
  Tensor v = ctx.forward(v_, x);
  compute_dtype_ = q_.weight_dtype();
  nn::detail::rope_in_place(*rope_, q, k, heads_, kv_heads_, false);
  nn::detail::GqaSaved saved;
  Tensor y = nn::detail::gqa_attention_forward(ctx, q, k, v, heads_, kv_heads_, compute_dtype_, train ? &saved : nullptr,
                                               {sparsity_.get(), first_head_});
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

Tensor ParallelGqaAttention::backward(nn::Context& ctx, const Tensor& dout) {
  ZS_ASSERT(saved_q_.raw() != nullptr, "ParallelGqaAttention backward without saved state");
  Tensor dy = ctx.backward(proj_, dout);
  Tensor dq, dk, dv;
  nn::detail::gqa_attention_backward(ctx, nn::detail::GqaSaved{saved_q_, saved_k_, saved_v_, saved_out_, saved_lse_}, dy, heads_, kv_heads_, compute_dtype_, &dq, &dk, &dv,
                                     {sparsity_.get(), first_head_});
  clear_own_saved();
  dy = {};
  nn::detail::rope_in_place(*rope_, dq, dk, heads_, kv_heads_, true);
  // Reverse of the forward's order; each column layer's dx is already summed over the group.
  Tensor dx = ctx.backward(v_, dv);
  dv = {};
  {
    Tensor d = ctx.backward(k_, dk);
    nn::detail::add(dx.data<float>(), d.data<float>(), dx.data<float>(), dx.numel());
  }
  dk = {};
  Tensor d = ctx.backward(q_, dq);
  nn::detail::add(dx.data<float>(), d.data<float>(), dx.data<float>(), dx.numel());
  return dx;
}

// ---- ParallelSwiGluMlp ----

ParallelSwiGluMlp::ParallelSwiGluMlp(const nn::LlamaConfig& cfg, TensorParallel tp)
    : gate_(add_child<ColumnParallelLinear>("gate", cfg.d_model, nn::llama_d_ff(cfg), tp, false, cfg.init_std)),
      up_(add_child<ColumnParallelLinear>("up", cfg.d_model, nn::llama_d_ff(cfg), tp, false, cfg.init_std)),
      proj_(add_child<RowParallelLinear>("proj", nn::llama_d_ff(cfg), cfg.d_model, tp, false, cfg.init_std)) {}

Tensor ParallelSwiGluMlp::forward(nn::Context& ctx, const Tensor& x) {
  Tensor g = ctx.forward(gate_, x);
  Tensor u = ctx.forward(up_, x);
  Tensor h = nn::detail::swiglu(ctx, g, u);
  if (ctx.training()) {
    g_ = g;
    u_ = u;
  }
  g = u = {};
  return ctx.forward(proj_, h);
}

Tensor ParallelSwiGluMlp::backward(nn::Context& ctx, const Tensor& dy) {
  ZS_ASSERT(g_.raw() != nullptr, "ParallelSwiGluMlp backward without saved state");
  Tensor dh = ctx.backward(proj_, dy);
  Tensor dg, du;
  nn::detail::swiglu_grad(ctx, dh, g_, u_, &dg, &du);
  dh = {};
  clear_own_saved();
  Tensor dx = ctx.backward(up_, du);
  du = {};
  Tensor dx_gate = ctx.backward(gate_, dg);
  nn::detail::add(dx.data<float>(), dx_gate.data<float>(), dx.data<float>(), dx.numel());
  return dx;
}

// ---- ParallelLlamaBlock ----

ParallelLlamaBlock::ParallelLlamaBlock(const nn::LlamaConfig& cfg, TensorParallel tp)
    : ln1_(add_child<nn::RmsNorm>("ln1", cfg.d_model, cfg.norm_eps)),
      attn_(add_child<ParallelGqaAttention>("attn", cfg, tp)),
      ln2_(add_child<nn::RmsNorm>("ln2", cfg.d_model, cfg.norm_eps)),
      mlp_(add_child<ParallelSwiGluMlp>("mlp", cfg, tp)) {}

Tensor ParallelLlamaBlock::forward(nn::Context& ctx, const Tensor& x) {
  if (dropped_) return nn::detail::dropped_block_forward(ctx, x, ln1_, attn_, ln2_, mlp_);
  return nn::detail::pre_norm_block_forward(ctx, x, ln1_, attn_, ln2_, mlp_);
}

Tensor ParallelLlamaBlock::backward(nn::Context& ctx, const Tensor& dy) {
  if (dropped_) return nn::detail::dropped_block_backward(ctx, dy, ln1_, attn_, ln2_, mlp_);
  return nn::detail::pre_norm_block_backward(ctx, dy, ln1_, attn_, ln2_, mlp_);
}

// ---- LlamaModel ----

namespace {

const nn::LlamaConfig& checked(const nn::LlamaConfig& cfg, const comm::Group* group) {
  const int size = group != nullptr ? group->size() : 1;
  validate_llama(cfg, size, false, size);
  return cfg;
}

}  // namespace

LlamaModel::LlamaModel(const nn::LlamaConfig& cfg, const comm::Group* group)
    : cfg_(checked(cfg, group)),
      tp_{.group = group},
      wte_(declare_param("wte", {cfg.vocab_size / tp_.size(), cfg.d_model}, nn::Init::normal(0.0f, cfg.init_std))),
      blocks_(add_child<nn::Sequential>("blocks")),
      ln_f_(add_child<nn::RmsNorm>("ln_f", cfg.d_model, cfg.norm_eps)),
      lm_head_(add_child<ColumnParallelLinear>("lm_head", cfg.d_model, cfg.vocab_size, tp_, false, cfg.init_std)),
      loss_(tp_) {
  wte_.set_tensor_slice({.dim = 0, .parts = tp_.size(), .index = tp_.rank()});
  const auto layout = nn::make_sparse_layout(cfg.sparse_attention, cfg.n_head, cfg.max_seq_len);
  for (int64_t i = 0; i < cfg.n_layer; ++i) blocks_.append<ParallelLlamaBlock>(cfg_, tp_).attention().set_sparsity(layout);
  nn::assign_names(*this);
}

void LlamaModel::set_recompute(const nn::GptRecompute& r) {
  ZS_ASSERT(!forward_pending(), "tp::LlamaModel::set_recompute between a forward and its backward");
  auto blocks = blocks_.children();
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto& block = static_cast<ParallelLlamaBlock&>(*blocks[i]);
    // r.selective changes nothing: the fused attention never keeps the probabilities (nn/llama.h).
    block.set_recomputed(i < r.blocks.size() && r.blocks[i]);
  }
}

void LlamaModel::clear_own_saved() {
  loss_.clear();
  ids_ = {};
}

float LlamaModel::forward_loss(nn::Context& ctx, const nn::Batch& batch) {
  const Tensor& ids = batch.inputs;
  nn::detail::check_token_batch(batch, "Llama");
  const int64_t B = ids.size(0), T = ids.size(1), C = cfg_.d_model, N = B * T;
  const int64_t Vl = wte_.shape()[0], first = Vl * tp_.rank();
  if (T > cfg_.max_seq_len) {
    throw ConfigError(fmt::format("data: sequences of {} tokens exceed model.max_seq_len = {}; raise model.max_seq_len "
                                  "or shorten the data sequence length",
                                  T, cfg_.max_seq_len));
  }
  if (nn::detail::kernels_enabled()) nn::detail::check_ids(ids.data<int32_t>(), N, cfg_.vocab_size, "token");
  Tensor x = ctx.allocate({B, T, C}, DType::kF32, MemoryUse::kActivation);
  {
    // The vocab-parallel lookup: each rank its own rows, summed over the group.
    Tensor wte = nn::weight_f32(ctx, wte_);
    detail::vocab_lookup(ids.data<int32_t>(), N, wte.data<float>(), first, Vl, C, x.data<float>());
    all_reduce(tp_, x);
  }
  nn::mark_dropped_blocks<ParallelLlamaBlock>(blocks_, cfg_.layer_drop, ctx);
  x = ctx.forward(blocks_, x);
  x = ctx.forward(ln_f_, x);
  Tensor logits = ctx.forward(lm_head_, x);  // (B, T, vocab/tp)
  x = {};
  const float loss = loss_.forward(ctx, logits, batch.targets);
  if (ctx.training()) ids_ = ids;
  return loss;
}

void LlamaModel::backward_loss(nn::Context& ctx, float grad_scale) {
  ZS_ASSERT(ids_.raw() != nullptr, "Llama backward_loss without a training-mode forward_loss");
  const int64_t N = ids_.numel(), C = cfg_.d_model;
  const int64_t Vl = wte_.shape()[0], first = Vl * tp_.rank();
  Tensor dx = ctx.backward(lm_head_, loss_.backward(ctx, grad_scale));  // summed over the group
  dx = ctx.backward(ln_f_, dx);
  dx = ctx.backward(blocks_, dx);
  {
    nn::GradAccumulator g(ctx, wte_);
    detail::vocab_accumulate(ids_.data<int32_t>(), N, dx.data<float>(), first, Vl, C, g.data());
    g.commit();
  }
  clear_own_saved();
}

}  // namespace zs::tp
