#include "nn/llama.h"

#include <cmath>

#include "core/errors.h"
#include "nn/detail/ops.h"
#include "nn/param_access.h"
#include "nn/detail/token_batch.h"

namespace zs::nn {

using memory::DType;
using memory::Tensor;

int64_t llama_default_d_ff(int64_t d_model) {
  const int64_t hidden = 2 * (4 * d_model) / 3;
  return (hidden + 255) / 256 * 256;
}

int64_t llama_d_ff(const LlamaConfig& cfg) { return cfg.d_ff > 0 ? cfg.d_ff : llama_default_d_ff(cfg.d_model); }

void validate(const LlamaConfig& cfg) {
  auto positive = [](int64_t v, const char* key) {
    if (v <= 0) throw ConfigError(fmt::format("model.{}: must be a positive integer, got {}", key, v));
  };
  positive(cfg.n_layer, "n_layer");
  positive(cfg.d_model, "d_model");
  positive(cfg.n_head, "n_head");
  positive(cfg.n_kv_head, "n_kv_head");
  positive(cfg.max_seq_len, "max_seq_len");
  positive(cfg.vocab_size, "vocab_size");
  if (cfg.d_ff < 0) throw ConfigError(fmt::format("model.d_ff: must be a positive integer, got {}", cfg.d_ff));
  if (cfg.d_model % cfg.n_head != 0 || (cfg.d_model / cfg.n_head) % 2 != 0) {
    throw ConfigError(fmt::format("model.d_model: {} must split into model.n_head = {} heads of an even size (the rotary "
                                  "embedding rotates pairs); choose d_model as a multiple of 2 * n_head (e.g. {})",
                                  cfg.d_model, cfg.n_head, (cfg.d_model / (2 * cfg.n_head) + 1) * 2 * cfg.n_head));
  }
  if (cfg.n_head % cfg.n_kv_head != 0) {
    throw ConfigError(fmt::format("model.n_kv_head: {} does not divide model.n_head = {} (each key/value head serves "
                                  "n_head / n_kv_head query heads); choose a divisor of {}",
                                  cfg.n_kv_head, cfg.n_head, cfg.n_head));
  }
  if (!(std::isfinite(cfg.rope_theta) && cfg.rope_theta > 1.0)) {
    throw ConfigError(fmt::format("model.rope_theta: must be a finite number > 1 (LLaMA uses 10000), got {}", cfg.rope_theta));
  }
  if (!(std::isfinite(cfg.norm_eps) && cfg.norm_eps > 0.0f)) {
    throw ConfigError(fmt::format("model.norm_eps: must be a finite number > 0 (LLaMA uses 1e-6 or 1e-5), got {}", cfg.norm_eps));
  }
  if (!(std::isfinite(cfg.init_std) && cfg.init_std > 0.0f)) {
    throw ConfigError(fmt::format("model.init_std: must be a finite number > 0 (LLaMA uses 0.02), got {}", cfg.init_std));
  }
  if (cfg.vocab_size > INT32_MAX) throw ConfigError(fmt::format("model.vocab_size: {} exceeds int32 token ids", cfg.vocab_size));
}

int64_t llama_param_count(const LlamaConfig& cfg) {
  const int64_t C = cfg.d_model, V = cfg.vocab_size, L = cfg.n_layer, F = llama_d_ff(cfg);
  const int64_t kv = cfg.n_kv_head * (C / cfg.n_head);
  return 2 * V * C + L * (2 * C * C + 2 * kv * C + 3 * C * F + 2 * C) + C;
}

double llama_train_flops_per_token(const LlamaConfig& cfg, int64_t seq_len) {
  const double C = static_cast<double>(cfg.d_model), V = static_cast<double>(cfg.vocab_size);
  const double L = static_cast<double>(cfg.n_layer), T = static_cast<double>(seq_len);
  const double F = static_cast<double>(llama_d_ff(cfg));
  const double kv = static_cast<double>(cfg.n_kv_head * (cfg.d_model / cfg.n_head));
  const double n_matmul = L * (2.0 * C * C + 2.0 * kv * C + 3.0 * C * F) + V * C;
  return 6.0 * n_matmul + 12.0 * L * T * C;
}

namespace {

const LlamaConfig& checked(const LlamaConfig& cfg) {
  validate(cfg);
  return cfg;
}

}  // namespace

LlamaModel::LlamaModel(const LlamaConfig& cfg)
    : cfg_(checked(cfg)),
      wte_(declare_param("wte", {cfg.vocab_size, cfg.d_model}, Init::normal(0.0f, cfg.init_std))),
      blocks_(add_child<Sequential>("blocks")),
      ln_f_(add_child<RmsNorm>("ln_f", cfg.d_model, cfg.norm_eps)),
      lm_head_(add_child<Linear>("lm_head", cfg.d_model, cfg.vocab_size, false, cfg.init_std)) {
  const auto layout = make_sparse_layout(cfg.sparse_attention, cfg.n_head, cfg.max_seq_len);
  for (int64_t i = 0; i < cfg.n_layer; ++i) blocks_.append<LlamaBlock>(cfg_).attention().set_sparsity(layout);
  assign_names(*this);
}

void LlamaModel::set_recompute(const GptRecompute& r) {
  ZS_ASSERT(!forward_pending(), "LlamaModel::set_recompute between a forward and its backward");
  ZS_ASSERT(static_cast<int64_t>(r.blocks.size()) <= cfg_.n_layer, "GptRecompute names {} blocks of {}", r.blocks.size(),
            cfg_.n_layer);
  auto blocks = blocks_.children();
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto& block = static_cast<LlamaBlock&>(*blocks[i]);
    // r.selective changes nothing: the fused attention never keeps the probabilities (GqaAttention).
    block.set_recomputed(i < r.blocks.size() && r.blocks[i]);
  }
}

void LlamaModel::clear_own_saved() {
  loss_.clear();
  ids_ = {};
}

float LlamaModel::forward_loss(Context& ctx, const Batch& batch) {
  const Tensor& ids = batch.inputs;
  detail::check_token_batch(batch, "Llama");
  const int64_t B = ids.size(0), T = ids.size(1), C = cfg_.d_model, N = B * T;
  if (T > cfg_.max_seq_len) {
    throw ConfigError(fmt::format("data: sequences of {} tokens exceed model.max_seq_len = {}; raise model.max_seq_len "
                                  "or shorten the data sequence length",
                                  T, cfg_.max_seq_len));
  }
  Tensor x = ctx.allocate({B, T, C}, DType::kF32, MemoryUse::kActivation);
  {
    Tensor wte = weight_f32(ctx, wte_);
    detail::embedding_lookup(ids.data<int32_t>(), N, wte.data<float>(), cfg_.vocab_size, C, nullptr, T, x.data<float>());
  }
  mark_dropped_blocks<LlamaBlock>(blocks_, cfg_.layer_drop, ctx);
  x = ctx.forward(blocks_, x);
  x = ctx.forward(ln_f_, x);
  Tensor logits = ctx.forward(lm_head_, x);
  x = {};
  const float loss = loss_.forward(ctx, logits, batch.targets);
  if (ctx.training()) ids_ = ids;
  return loss;
}

void LlamaModel::backward_loss(Context& ctx, float grad_scale) {
  ZS_ASSERT(ids_.raw() != nullptr, "Llama backward_loss without a training-mode forward_loss");
  Tensor dx = ctx.backward(lm_head_, loss_.backward(ctx, grad_scale));
  dx = ctx.backward(ln_f_, dx);
  dx = ctx.backward(blocks_, dx);
  {
    GradAccumulator g(ctx, wte_);
    detail::embedding_accumulate(ids_.data<int32_t>(), ids_.numel(), dx.data<float>(), cfg_.d_model, g.data());
    g.commit();
  }
  clear_own_saved();
}

}  // namespace zs::nn
