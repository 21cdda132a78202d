#include "moe/gpt_moe.h"

#include <cmath>

#include "core/errors.h"
#include "nn/attention.h"
#include "nn/transformer.h"

namespace zs::moe {

using memory::DType;
using memory::Tensor;
using nn::MemoryUse;

void validate(const GptMoeConfig& cfg) {
  nn::validate(cfg.gpt);
  if (!nn::gpt_standard_widths(cfg.gpt)) {
    throw ConfigError(fmt::format("model.d_ff / model.norm_eps: the GPT-MoE builder builds GPT-2's MLP width 4 * d_model and "
                                  "LayerNorm epsilon 1e-5 only (got d_ff {}, norm_eps {}); remove them from the "
                                  "model section (model.moe.expert_hidden sets the width of the experts)",
                                  nn::gpt_d_ff(cfg.gpt), cfg.gpt.norm_eps));
  }
  if (cfg.gpt.tied_embeddings) {
    throw ConfigError("model.tied_embeddings: the GPT-MoE builder has an untied lm_head; set it to false");
  }
  cfg.moe.validate("model.moe.");
  if (cfg.every_n_layers < 1 || cfg.every_n_layers > cfg.gpt.n_layer) {
    throw ConfigError(fmt::format("model.moe.every_n_layers: expected 1..n_layer ({}), got {}", cfg.gpt.n_layer,
                                  cfg.every_n_layers));
  }
  if (cfg.expert_hidden < 0) {
    throw ConfigError(fmt::format("model.moe.expert_hidden: expected >= 0 (0: 4 * d_model), got {}", cfg.expert_hidden));
  }
  if (!(cfg.aux_loss_coef >= 0.0f) || !std::isfinite(cfg.aux_loss_coef)) {
    throw ConfigError(fmt::format("model.moe.aux_loss_coef: expected a finite number >= 0, got {}", cfg.aux_loss_coef));
  }
}

namespace {

const GptMoeConfig& checked(const GptMoeConfig& cfg) {
  validate(cfg);
  return cfg;
}

// The pre-LN block of nn::Block with its feed-forward part chosen by the builder (Mlp or MoE).
class MoeBlock : public nn::Module {
 public:
  MoeBlock(int64_t d, int64_t heads, float init_std, float proj_std, const MoEOptions* moe, int64_t expert_hidden,
           const comm::ExpertGroups* groups)
      : ln1_(add_child<nn::LayerNorm>("ln1", d)),
        attn_(add_child<nn::CausalSelfAttention>("attn", d, heads, init_std, proj_std)),
        ln2_(add_child<nn::LayerNorm>("ln2", d)) {
    if (moe != nullptr) {
      moe_ = &add_child<MoE>(
          "moe", d, [=] { return std::make_unique<nn::Mlp>(d, init_std, proj_std, expert_hidden); }, *moe, groups);
      ffn_ = moe_;
    } else {
      ffn_ = &add_child<nn::Mlp>("mlp", d, init_std, proj_std);
    }
  }
  std::string_view type_name() const override { return "MoeBlock"; }
  MoE* moe() { return moe_; }

 protected:
  Tensor forward(nn::Context& ctx, const Tensor& x) override {
    Tensor a = ctx.forward(attn_, ctx.forward(ln1_, x));
    Tensor x1 = ctx.allocate(x.shape(), DType::kF32, MemoryUse::kActivation);
    add(x, a, x1);
    a = {};
    Tensor m = ctx.forward(*ffn_, ctx.forward(ln2_, x1));
    Tensor y = ctx.allocate(x.shape(), DType::kF32, MemoryUse::kActivation);
    add(x1, m, y);
    return y;
  }
  Tensor backward(nn::Context& ctx, const Tensor& dy) override {
    Tensor dx1 = ctx.backward(ln2_, ctx.backward(*ffn_, dy));
    add(dy, dx1, dx1);
    Tensor dx = ctx.backward(ln1_, ctx.backward(attn_, dx1));
    add(dx1, dx, dx);
    return dx;
  }

 private:
  static void add(const Tensor& a, const Tensor& b, const Tensor& out) {
    if (a.raw() == nullptr || b.raw() == nullptr) return;
    const float* pa = a.data<float>();
    const float* pb = b.data<float>();
    float* po = out.data<float>();
    for (int64_t i = 0; i < a.numel(); ++i) po[i] = pa[i] + pb[i];
  }

  nn::LayerNorm& ln1_;
  nn::CausalSelfAttention& attn_;
  nn::LayerNorm& ln2_;
  nn::Module* ffn_ = nullptr;
  MoE* moe_ = nullptr;
};

}  // namespace

GptMoeModel::GptMoeModel(const GptMoeConfig& cfg, const comm::ExpertGroups* groups)
    : cfg_(checked(cfg)),
      wte_(add_child<nn::Embedding>("wte", cfg.gpt.vocab_size, cfg.gpt.d_model, cfg.gpt.init_std)),
      wpe_(add_child<nn::Embedding>("wpe", cfg.gpt.seq_len, cfg.gpt.d_model, cfg.gpt.init_std)),
      blocks_(add_child<nn::Sequential>("blocks")),
      ln_f_(add_child<nn::LayerNorm>("ln_f", cfg.gpt.d_model)),
      lm_head_(add_child<nn::Linear>("lm_head", cfg.gpt.d_model, cfg.gpt.vocab_size, false, cfg.gpt.init_std)) {
  const float proj_std = cfg.gpt.init_std / std::sqrt(2.0f * static_cast<float>(cfg.gpt.n_layer));
  for (int64_t i = 0; i < cfg.gpt.n_layer; ++i) {
    const bool is_moe = (i + 1) % cfg.every_n_layers == 0;
    auto& b = blocks_.append<MoeBlock>(cfg.gpt.d_model, cfg.gpt.n_head, cfg.gpt.init_std, proj_std,
                                       is_moe ? &cfg_.moe : nullptr, cfg.expert_hidden, groups);
    if (b.moe() != nullptr) moe_.push_back(b.moe());
  }
  assign_names(*this);
}

float GptMoeModel::forward_loss(nn::Context& ctx, const nn::Batch& batch) {
  const Tensor& ids = batch.inputs;
  ZS_MODEL_CHECK(ids.raw() != nullptr && ids.dtype() == DType::kI32 && ids.dim() == 2 && ids.is_contiguous(),
                 "GptMoe: inputs must be contiguous int32 token ids (B, T), got a {} tensor {}",
                 memory::dtype_name(ids.dtype()), memory::shape_string(ids.shape()));
  const int64_t B = ids.size(0), T = ids.size(1);
  if (T > cfg_.gpt.seq_len) {
    throw ConfigError(fmt::format("data: sequences of {} tokens exceed model.seq_len = {}", T, cfg_.gpt.seq_len));
  }
  positions_ = ctx.allocate({B, T}, DType::kI32, MemoryUse::kActivation);
  for (int64_t i = 0; i < B * T; ++i) positions_.data<int32_t>()[i] = static_cast<int32_t>(i % T);
  Tensor tok = ctx.forward(wte_, ids);
  Tensor pos = ctx.forward(wpe_, positions_);
  Tensor x = ctx.allocate(tok.shape(), DType::kF32, MemoryUse::kActivation);
  if (ctx.computes())
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = tok.data<float>()[i] + pos.data<float>()[i];
  tok = pos = {};
  x = ctx.forward(blocks_, x);
  x = ctx.forward(ln_f_, x);
  Tensor logits = ctx.forward(lm_head_, x);
  float loss = loss_.forward(ctx, logits, batch.targets);
  l_aux_ = 0.0f;
  for (const MoE* m : moe_) l_aux_ += m->l_aux();
  if (!ctx.training()) {
    positions_ = {};
    return loss;  // evaluation: the language-model loss; the load-balancing term trains the gates only
  }
  return loss + cfg_.aux_loss_coef * l_aux_;
}

void GptMoeModel::backward_loss(nn::Context& ctx, float grad_scale) {
  for (MoE* m : moe_) m->set_aux_loss_grad(cfg_.aux_loss_coef * grad_scale);
  Tensor d = loss_.backward(ctx, grad_scale);
  d = ctx.backward(lm_head_, d);
  d = ctx.backward(ln_f_, d);
  d = ctx.backward(blocks_, d);
  // Both embeddings receive the same gradient (x = tok + pos).
  ctx.backward(wpe_, d);
  ctx.backward(wte_, d);
  positions_ = {};
}

}  // namespace zs::moe
