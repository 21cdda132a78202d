#include "nn/gpt.h"

#include <cmath>
#include <string>

#include "core/errors.h"
#include "nn/detail/linear.h"
#include "nn/detail/ops.h"
#include "nn/param_access.h"
#include "nn/transformer.h"
#include "nn/detail/token_batch.h"

namespace zs::nn {

using memory::DType;
using memory::Tensor;

void validate(const GptConfig& cfg) {
  auto positive = [](int64_t v, const char* key) {
    if (v <= 0) throw ConfigError(fmt::format("model.{}: must be a positive integer, got {}", key, v));
  };
  positive(cfg.n_layer, "n_layer");
  positive(cfg.d_model, "d_model");
  positive(cfg.n_head, "n_head");
  positive(cfg.seq_len, "seq_len");
  positive(cfg.vocab_size, "vocab_size");
  if (cfg.d_ff < 0) throw ConfigError(fmt::format("model.d_ff: must be a positive integer, got {}", cfg.d_ff));
  if (!(std::isfinite(cfg.norm_eps) && cfg.norm_eps > 0.0f)) {
    throw ConfigError(fmt::format("model.norm_eps: must be a finite number > 0 (GPT-2 uses 1e-5), got {}", cfg.norm_eps));
  }
  if (cfg.d_model % cfg.n_head != 0) {
    throw ConfigError(fmt::format("model.d_model: {} is not divisible by model.n_head = {}; choose d_model as a "
                                  "multiple of n_head (e.g. {})",
                                  cfg.d_model, cfg.n_head, (cfg.d_model / cfg.n_head + 1) * cfg.n_head));
  }
  if (!(std::isfinite(cfg.init_std) && cfg.init_std > 0.0f)) {
    throw ConfigError(fmt::format("model.init_std: must be a finite number > 0 (GPT-2 uses 0.02), got {}", cfg.init_std));
  }
  if (cfg.vocab_size > INT32_MAX) throw ConfigError(fmt::format("model.vocab_size: {} exceeds int32 token ids", cfg.vocab_size));
}

int64_t gpt_param_count(const GptConfig& cfg) {
  const int64_t C = cfg.d_model, V = cfg.vocab_size, T = cfg.seq_len, L = cfg.n_layer, F = gpt_d_ff(cfg);
  return V * C + T * C + L * (4 * C * C + 2 * C * F + 9 * C + F) + 2 * C + (cfg.tied_embeddings ? 0 : V * C);
}

double gpt_train_flops_per_token(const GptConfig& cfg, int64_t seq_len) {
  const double C = static_cast<double>(cfg.d_model), V = static_cast<double>(cfg.vocab_size);
  const double L = static_cast<double>(cfg.n_layer), T = static_cast<double>(seq_len);
  const double F = static_cast<double>(gpt_d_ff(cfg));
  const double n_matmul = L * (4.0 * C * C + 2.0 * C * F) + V * C;
  return 6.0 * n_matmul + 12.0 * L * T * C;
}

namespace {

const GptConfig& checked(const GptConfig& cfg) {
  validate(cfg);
  return cfg;
}

}  // namespace

GptModel::GptModel(const GptConfig& cfg)
    : cfg_(checked(cfg)),
      wte_(declare_param("wte", {cfg.vocab_size, cfg.d_model}, Init::normal(0.0f, cfg.init_std))),
      wpe_(declare_param("wpe", {cfg.seq_len, cfg.d_model}, Init::normal(0.0f, cfg.init_std))),
      blocks_(add_child<Sequential>("blocks")),
      ln_f_(add_child<LayerNorm>("ln_f", cfg.d_model, cfg.norm_eps)) {
  const float proj_std = cfg.init_std / std::sqrt(2.0f * static_cast<float>(cfg.n_layer));
  const auto layout = make_sparse_layout(cfg.sparse_attention, cfg.n_head, cfg.seq_len);
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    auto& attn = blocks_.append<Block>(cfg.d_model, cfg.n_head, cfg.init_std, proj_std, cfg.d_ff, cfg.norm_eps).attention();
    attn.set_kernel(cfg.attention);
    attn.set_sparsity(layout);
  }
  if (!cfg.tied_embeddings) lm_head_ = &add_child<Linear>("lm_head", cfg.d_model, cfg.vocab_size, false, cfg.init_std);
  assign_names(*this);
}

GptRecompute GptRecompute::every(int64_t n_layer, int64_t k) {
  ZS_ASSERT(k > 0, "GptRecompute::every: k = {} must be positive", k);
  GptRecompute r;
  r.blocks.resize(static_cast<size_t>(n_layer));
  for (int64_t i = 0; i < n_layer; ++i) r.blocks[static_cast<size_t>(i)] = i % k == 0;
  return r;
}

GptRecompute GptRecompute::first(int64_t n_layer, int64_t m) {
  GptRecompute r;
  r.blocks.resize(static_cast<size_t>(n_layer));
  for (int64_t i = 0; i < n_layer && i < m; ++i) r.blocks[static_cast<size_t>(i)] = true;
  return r;
}

int64_t GptRecompute::count() const {
  int64_t n = 0;
  for (bool b : blocks) n += b ? 1 : 0;
  return n;
}

std::string GptRecompute::describe() const {
  std::string which;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i]) which += fmt::format("{}{}", which.empty() ? "" : ",", i);
  }
  if (which.empty()) return selective ? "selective" : "none";
  return fmt::format("blocks {} of {}{}", which, blocks.size(), selective ? " + selective" : "");
}

void GptModel::set_recompute(const GptRecompute& r) {
  ZS_ASSERT(!forward_pending(), "GptModel::set_recompute between a forward and its backward");
  ZS_ASSERT(static_cast<int64_t>(r.blocks.size()) <= cfg_.n_layer, "GptRecompute names {} blocks of {}", r.blocks.size(),
            cfg_.n_layer);
  recompute_ = r;
  auto blocks = blocks_.children();
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto& block = static_cast<Block&>(*blocks[i]);
    block.set_recomputed(i < r.blocks.size() && r.blocks[i]);
    block.attention().set_recompute_scores(r.selective);
  }
}

void GptModel::clear_own_saved() {
  loss_.clear();
  ids_ = final_x_ = {};
}

// Note [tied head products]
// The tied head is a bias-free Linear whose weight is wte, so it runs through the Linear's own products
// (nn/detail/linear.h; pp/ and tp/'s GPTs likewise, with their rows of wte): logits = x wte^T,
// dx = dlogits wte and wte.grad += dlogits^T x on the path wte's dtype selects (nn/detail/gemm.h). It
// used to call sgemm whatever the dtype, with the bf16 embedding widened to an fp32 copy, so at vocab
// 32000 a bf16 step spent 18% of its CPU in the head's fp32 products (docs/benchmarks.md, "Where np
// 1's step goes"; the large GPT's bf16 step 2.13 -> 1.63 s there). On the AVX512-BF16 kernel its
// operands are now rounded to bf16 as they are packed, as PyTorch's autocast and Megatron's bf16 do,
// so bf16 losses there moved by design. fp32 runs, and bf16 runs whose products are sgemm (no
// AVX512-BF16, ZS_BF16_GEMM=sgemm), make the same sgemm calls on the same operands, bit for bit.
float GptModel::forward_loss(Context& ctx, const Batch& batch) {
  const Tensor& ids = batch.inputs;
  detail::check_token_batch(batch, "Gpt");
  const int64_t B = ids.size(0), T = ids.size(1), C = cfg_.d_model, V = cfg_.vocab_size, N = B * T;
  if (T > cfg_.seq_len) {
    throw ConfigError(fmt::format("data: sequences of {} tokens exceed model.seq_len = {}; raise model.seq_len or "
                                  "shorten the data sequence length",
                                  T, cfg_.seq_len));
  }
  const bool train = ctx.training();
  Tensor wte = weight_f32(ctx, wte_);
  Tensor x = ctx.allocate({B, T, C}, DType::kF32, MemoryUse::kActivation);
  {
    Tensor wpe = weight_f32(ctx, wpe_);
    detail::embedding_lookup(ids.data<int32_t>(), N, wte.data<float>(), V, C, wpe.data<float>(), T, x.data<float>());
  }
  mark_dropped_blocks<Block>(blocks_, cfg_.layer_drop, ctx);
  x = ctx.forward(blocks_, x);
  x = ctx.forward(ln_f_, x);
  Tensor logits;
  if (lm_head_ != nullptr) {
    logits = ctx.forward(*lm_head_, x);
  } else {
    logits = detail::linear_forward(ctx, x, N, wte_, nullptr);  // Note [tied head products]
  }
  const float loss = loss_.forward(ctx, logits, batch.targets);
  if (train) {
    ids_ = ids;
    if (lm_head_ == nullptr) final_x_ = x;
  }
  return loss;
}

void GptModel::backward_loss(Context& ctx, float grad_scale) {
  ZS_ASSERT(ids_.raw() != nullptr, "Gpt backward_loss without a training-mode forward_loss");
  const int64_t T = ids_.size(1), C = cfg_.d_model, N = ids_.numel();
  Tensor dlogits = loss_.backward(ctx, grad_scale);
  Tensor dx;
  if (lm_head_ != nullptr) {
    dx = ctx.backward(*lm_head_, dlogits);
  } else {
    dx = detail::linear_backward(ctx, dlogits, N, final_x_, wte_, nullptr);  // Note [tied head products]
  }
  dlogits = {};
  final_x_ = {};
  dx = ctx.backward(ln_f_, dx);
  dx = ctx.backward(blocks_, dx);
  {
    GradAccumulator g(ctx, wte_);
    detail::embedding_accumulate(ids_.data<int32_t>(), N, dx.data<float>(), C, g.data());
    g.commit();
  }
  {
    // Position t's gradient sums over the batch: rows r with r % T == t.
    GradAccumulator g(ctx, wpe_);
    detail::sum_rows_into(dx.data<float>(), N, C, T, g.data());
    g.commit();
  }
  clear_own_saved();
}

}  // namespace zs::nn
