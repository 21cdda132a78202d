// LLaMA-family language model (Hugging Face's LlamaForCausalLM): token embedding, n_layer pre-norm
// blocks of RMSNorm, grouped-query causal attention with rotary position embedding and a SwiGLU MLP,
// a final RMSNorm and an untied output head; no biases anywhere.
//
//   zs::nn::LlamaConfig cfg{.n_layer = 2, .d_model = 64, .n_head = 4, .n_kv_head = 2, .d_ff = 172,
//                           .max_seq_len = 32, .vocab_size = 256};
//   zs::nn::LlamaModel model(cfg);               // throws ConfigError for a bad config
//   zs::nn::materialize(model, /*seed=*/1);
//   zs::nn::HostContext ctx;
//   float loss = ctx.forward_loss(model, batch); // inputs/targets int32 (B, T), T <= max_seq_len
//   ctx.backward_loss(model, 1.0f);
//
// Parameters, in canonical order (C d_model, V vocab, F d_ff, hs = C / n_head, K n_kv_head):
//   wte (V, C)                              token embedding
//   blocks.<i>.ln1.weight (C)               RMSNorm before attention
//   blocks.<i>.attn.q.weight (C, C)         rows h*hs.. are head h's query
//   blocks.<i>.attn.k.weight (K*hs, C)      key heads; query head h reads kv head h / (n_head / K)
//   blocks.<i>.attn.v.weight (K*hs, C)
//   blocks.<i>.attn.proj.weight (C, C)      output projection (Hugging Face's o_proj)
//   blocks.<i>.ln2.weight (C)               RMSNorm before the MLP
//   blocks.<i>.mlp.gate.weight (F, C)       y = proj(silu(gate x) * (up x))
//   blocks.<i>.mlp.up.weight (F, C)
//   blocks.<i>.mlp.proj.weight (C, F)       (Hugging Face's down_proj)
//   ln_f.weight (C)
//   lm_head.weight (V, C)
// The rotary embedding follows Hugging Face's layout (rotate_half: element j of a head pairs with
// j + hs/2), so Hugging Face's q_proj/k_proj rows are ours as they are. Init (Hugging Face's): every
// weight normal(0, init_std), RMSNorm weights one (tagged no_weight_decay).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "memory/tensor.h"
#include "nn/cross_entropy.h"
#include "nn/gpt.h"
#include "nn/layers.h"
#include "nn/model.h"
#include "nn/module.h"

namespace zs::nn {

namespace detail {
struct RopeTables;
}

struct LlamaConfig {
  int64_t n_layer = 4;
  int64_t d_model = 256;
  int64_t n_head = 4;
  int64_t n_kv_head = 4;      // grouped-query attention: divides n_head (n_head: multi-head attention)
  int64_t d_ff = 0;           // 0: LLaMA's 8/3 d_model rounded up to a multiple of 256 (llama_default_d_ff)
  int64_t max_seq_len = 256;  // the longest sequence (the rotary tables' rows)
  int64_t vocab_size = 32000;
  double rope_theta = 10000.0;
  float norm_eps = 1e-6f;     // Hugging Face's rms_norm_eps default
  float init_std = 0.02f;
  // DeepSpeed's sparse_attention section (nn/sparse_attention.h), as GptConfig's.
  std::optional<SparseAttentionConfig> sparse_attention{};
  ProgressiveLayerDrop layer_drop{};  // as GptConfig's
};

// LLaMA's MLP width for d_model (Meta's rule, multiple_of 256): 11008 for 4096.
int64_t llama_default_d_ff(int64_t d_model);
// d_ff, or llama_default_d_ff(d_model) where it is 0.
int64_t llama_d_ff(const LlamaConfig& cfg);

// Throws ConfigError naming `model.<key>` and the fix: sizes > 0, d_model divisible by n_head, an even
// head size (the rotary pairs), n_kv_head dividing n_head, rope_theta > 1, norm_eps and init_std > 0.
void validate(const LlamaConfig& cfg);

// Parameter elements: V*C*2 + L*(2*C*C + 2*K*hs*C + 3*C*F + 2*C) + C.
int64_t llama_param_count(const LlamaConfig& cfg);

// Training FLOPs per token at sequence length `seq_len`, as nn::gpt_train_flops_per_token counts a GPT's:
// 6 x the matrix-product parameters (the blocks' q, k, v, proj, gate, up and proj weights and the
// output head; the embedding is a lookup) + 12 L T C for the attention's full T x T products.
double llama_train_flops_per_token(const LlamaConfig& cfg, int64_t seq_len);

// RMSNorm over the last dimension (fused kernel, nn/detail/fused_ops.h): y = w * x / sqrt(mean(x^2) + eps).
// weight ones, tagged no_weight_decay. Saves its input and the rows' 1 / rms.
class RmsNorm : public Module {
 public:
  explicit RmsNorm(int64_t dim, float eps = 1e-6f);
  std::string_view type_name() const override { return "RmsNorm"; }
  Parameter& weight() { return weight_; }

 protected:
  memory::Tensor forward(Context& ctx, const memory::Tensor& x) override;
  memory::Tensor backward(Context& ctx, const memory::Tensor& dy) override;
  void clear_own_saved() override { input_ = rstd_ = {}; }

 private:
  int64_t dim_;
  float eps_;
  Parameter& weight_;
  memory::Tensor input_;
  memory::Tensor rstd_;  // (rows)
};

// The SwiGLU MLP: proj(silu(gate x) * up x), no biases; the product is one fused kernel pass.
// Saves gate's and up's outputs.
class SwiGluMlp : public Module {
 public:
  SwiGluMlp(int64_t d_model, int64_t hidden, float init_std = 0.02f);
  std::string_view type_name() const override { return "SwiGluMlp"; }

 protected:
  memory::Tensor forward(Context& ctx, const memory::Tensor& x) override;
  memory::Tensor backward(Context& ctx, const memory::Tensor& dy) override;
  void clear_own_saved() override { g_ = u_ = {}; }

 private:
  Linear& gate_;
  Linear& up_;
  Linear& proj_;
  memory::Tensor g_, u_;
};

// Causal grouped-query attention with the rotary embedding on q and k (after their projections), no
// biases. The attention itself is one function pair (nn/detail/llama_ops.h) on the fused kernel
// (nn/fused_attention.h): it saves q, k, v, the output and a log-sum-exp per row, never the T x T
// probabilities, so Megatron's selective recompute has nothing more to drop here.
class GqaAttention : public Module {
 public:
  GqaAttention(int64_t d_model, int64_t n_head, int64_t n_kv_head, int64_t max_seq_len, double rope_theta,
               float init_std = 0.02f);
  ~GqaAttention() override;
  std::string_view type_name() const override { return "GqaAttention"; }
  // As CausalSelfAttention::set_sparsity (nn/attention.h).
  void set_sparsity(std::shared_ptr<const SparseLayout> layout) { sparsity_ = std::move(layout); }

 protected:
  memory::Tensor forward(Context& ctx, const memory::Tensor& x) override;
  memory::Tensor backward(Context& ctx, const memory::Tensor& dy) override;
  void clear_own_saved() override { saved_q_ = saved_k_ = saved_v_ = saved_out_ = saved_lse_ = {}; }

 private:
  int64_t d_, n_head_, n_kv_head_, hs_;
  Linear& q_;
  Linear& k_;
  Linear& v_;
  Linear& proj_;
  std::unique_ptr<detail::RopeTables> rope_;  // nn/detail/llama_ops.h
  // What the attention saved (detail::GqaSaved).
  memory::Tensor saved_q_, saved_k_, saved_v_, saved_out_, saved_lse_;
  memory::DType compute_dtype_ = memory::DType::kF32;
  std::shared_ptr<const SparseLayout> sparsity_;
};

// Pre-norm block: x1 = x + attn(ln1(x)), y = x1 + mlp(ln2(x1)). Children: ln1, attn, ln2, mlp.
class LlamaBlock : public Module {
 public:
  explicit LlamaBlock(const LlamaConfig& cfg);
  std::string_view type_name() const override { return "LlamaBlock"; }
  GqaAttention& attention() { return attn_; }
  // As Block::set_dropped (nn/transformer.h).
  void set_dropped(bool dropped) { dropped_ = dropped; }

 protected:
  memory::Tensor forward(Context& ctx, const memory::Tensor& x) override;
  memory::Tensor backward(Context& ctx, const memory::Tensor& dy) override;

 private:
  RmsNorm& ln1_;
  GqaAttention& attn_;
  RmsNorm& ln2_;
  SwiGluMlp& mlp_;
  bool dropped_ = false;
};

class LlamaModel : public Model {
 public:
  explicit LlamaModel(const LlamaConfig& cfg);
  std::string_view type_name() const override { return "Llama"; }
  const LlamaConfig& config() const { return cfg_; }
  // Which blocks recompute in backward (GptRecompute's meaning). Between steps only.
  void set_recompute(const GptRecompute& r);

 protected:
  float forward_loss(Context& ctx, const Batch& batch) override;
  void backward_loss(Context& ctx, float grad_scale) override;
  void clear_own_saved() override;

 private:
  LlamaConfig cfg_;
  Parameter& wte_;
  Sequential& blocks_;
  RmsNorm& ln_f_;
  Linear& lm_head_;
  SoftmaxCrossEntropy loss_;
  memory::Tensor ids_;  // (B, T) int32
};

}  // namespace zs::nn
