// GPT-2 style language model: token + position embeddings, n_layer pre-LN blocks, final LayerNorm,
// logits over the vocabulary and a cross-entropy loss.
//
//   zs::nn::GptConfig cfg{.n_layer = 2, .d_model = 64, .n_head = 4, .seq_len = 32, .vocab_size = 256};
//   zs::nn::GptModel model(cfg);                    // throws ConfigError for a bad config
//   zs::nn::materialize(model, /*seed=*/1);         // or the engine places the parameters
//   zs::nn::HostContext ctx;
//   float loss = ctx.forward_loss(model, batch);    // batch: inputs/targets int32 (B, T), T <= seq_len
//   ctx.backward_loss(model, 1.0f);
//
// Parameters, in canonical order (full names):
//   wte (vocab, d)        token embedding; with tied_embeddings also the output head (logits = x wte^T)
//   wpe (seq_len, d)      position embedding
//   blocks.<i>.ln1.{weight,bias}  blocks.<i>.attn.qkv.{weight,bias}  blocks.<i>.attn.proj.{weight,bias}
//   blocks.<i>.ln2.{weight,bias}  blocks.<i>.mlp.fc.{weight,bias}    blocks.<i>.mlp.proj.{weight,bias}
//   ln_f.{weight,bias}
//   lm_head.weight (vocab, d)     only without tied_embeddings (no bias, as GPT-2)
// wte and wpe belong to the GPT module itself: it does the lookup and the tied head inline, so the
// engine's hooks on the root module cover them (they are needed at the start and the end of both
// passes). Init (GPT-2): weights normal(0, init_std), the residual projections attn.proj.weight and
// mlp.proj.weight normal(0, init_std / sqrt(2 * n_layer)), biases zero, LayerNorm weights one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "memory/tensor.h"
#include "nn/attention.h"
#include "nn/cross_entropy.h"
#include "nn/layer_drop.h"
#include "nn/layers.h"
#include "nn/model.h"
#include "nn/module.h"
#include "nn/sparse_attention.h"

namespace zs::nn {

struct GptConfig {
  int64_t n_layer = 4;
  int64_t d_model = 256;
  int64_t n_head = 4;
  int64_t seq_len = 256;      // maximum positions (rows of wpe); a batch may use fewer
  int64_t vocab_size = 256;   // the byte tokenizer's vocabulary
  bool tied_embeddings = true;
  float init_std = 0.02f;
  int64_t d_ff = 0;         // the MLP's hidden width; 0: GPT-2's 4 * d_model (Hugging Face's n_inner)
  float norm_eps = 1e-5f;   // the LayerNorms' epsilon (Hugging Face's layer_norm_epsilon)
  // The blocks' attention kernel (config key model.attention): the fused one (nn/fused_attention.h) or
  // the plain reference that saves the T x T probabilities (nn/attention.h).
  AttentionKernel attention = AttentionKernel::kFused;
  // DeepSpeed's sparse_attention section (nn/sparse_attention.h): the blocks' block-sparse layout on the
  // fused kernel; absent: dense causal attention.
  std::optional<SparseAttentionConfig> sparse_attention{};
  // DeepSpeed's progressive_layer_drop section (nn/layer_drop.h); off by default.
  ProgressiveLayerDrop layer_drop{};
};

// The GPT-2 of Hugging Face's GPT2LMHeadModel (model.type "gpt2"): GptModel with GPT-2 small's
// defaults, vocab 50257 (its BPE), 12 layers, d_model 768, 12 heads, 1024 positions, tied head.
inline GptConfig gpt2_defaults() {
  return GptConfig{.n_layer = 12, .d_model = 768, .n_head = 12, .seq_len = 1024, .vocab_size = 50257};
}

// d_ff, or 4 * d_model where it is 0.
inline int64_t gpt_d_ff(const GptConfig& cfg) { return cfg.d_ff > 0 ? cfg.d_ff : 4 * cfg.d_model; }
// Whether cfg has GPT-2's MLP width 4 * d_model and LayerNorm epsilon 1e-5, the only ones the
// tensor-parallel, pipeline and MoE GPTs build (they refuse others by name).
inline bool gpt_standard_widths(const GptConfig& cfg) { return gpt_d_ff(cfg) == 4 * cfg.d_model && cfg.norm_eps == 1e-5f; }

// Throws ConfigError naming `model.<key>` and the fix: every size > 0, d_model divisible by n_head,
// init_std finite and > 0.
void validate(const GptConfig& cfg);

// Number of parameter elements of GptModel(cfg):
//   V*C + T*C + L*(4*C^2 + 2*C*F + 9*C + F) + 2*C (+ V*C untied)   (V vocab, T seq_len, L n_layer,
//   C d_model, F gpt_d_ff: 12*C^2 + 13*C per layer at F = 4C)
int64_t gpt_param_count(const GptConfig& cfg);

// Training FLOPs per token (forward + backward) at sequence length `seq_len` (<= cfg.seq_len):
//   6 * N_matmul + 12 * L * seq_len * C,   N_matmul = L * (4 * C^2 + 2 * C * F) + V * C  (12 C^2 at F = 4C)
// N_matmul counts the weights used in matmuls (block linears and the output head; not the
// embedding lookups, biases or norms). Each weight costs 2 FLOPs per token forward and 4 backward.
// The attention term is q k^T and P v: 2 * 2 * seq_len * C per layer per token forward, times 3 for
// training; it counts the full T x T scores our kernels compute (the causal mask is applied after).
double gpt_train_flops_per_token(const GptConfig& cfg, int64_t seq_len);

// Activation recompute of the blocks (Activation recomputation in nn/module.h).
struct GptRecompute {
  std::vector<bool> blocks;  // blocks[i]: block i is recomputed; empty or shorter: the rest are not
  bool selective = false;    // every block's attention recomputes its scores (CausalSelfAttention)

  static GptRecompute none() { return {}; }
  // Blocks 0, k, 2k, ... (k = 1: every block).
  static GptRecompute every(int64_t n_layer, int64_t k);
  // The first m blocks: for m blocks the lowest peak (their re-runs come last in the backward, when the
  // later blocks' activations are already freed).
  static GptRecompute first(int64_t n_layer, int64_t m);
  static GptRecompute scores_only() { return {.blocks = {}, .selective = true}; }
  int64_t count() const;  // recomputed blocks
  std::string describe() const;  // "none", "blocks 0,2 of 4", "selective"
};

class GptModel : public Model {
 public:
  explicit GptModel(const GptConfig& cfg);
  std::string_view type_name() const override { return "Gpt"; }
  const GptConfig& config() const { return cfg_; }

  // Which blocks recompute in backward (default none). Between steps only (not between a forward and
  // its backward).
  void set_recompute(const GptRecompute& r);
  const GptRecompute& recompute() const { return recompute_; }

  Parameter& wte() { return wte_; }
  Parameter& wpe() { return wpe_; }

 protected:
  float forward_loss(Context& ctx, const Batch& batch) override;
  void backward_loss(Context& ctx, float grad_scale) override;
  void clear_own_saved() override;

 private:
  GptConfig cfg_;
  GptRecompute recompute_;
  Parameter& wte_;
  Parameter& wpe_;
  Sequential& blocks_;
  LayerNorm& ln_f_;
  Linear* lm_head_ = nullptr;
  SoftmaxCrossEntropy loss_;
  memory::Tensor ids_;      // (B, T) int32
  memory::Tensor final_x_;  // (B, T, C) ln_f output, for the tied head's weight gradient
};

}  // namespace zs::nn
