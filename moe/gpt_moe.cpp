#include "moe/gpt_moe.h"

#include <cmath>

#include "core/errors.h"
#include "nn/attention.h"
#include "nn/transformer.h"
#include "tp/embedding.h"
#include "tp/gpt.h"
#include "tp/linear.h"
#include "tp/transformer.h"
#include "nn/detail/token_batch.h"

namespace zs::moe {

using memory::DType;
using memory::Tensor;
using nn::MemoryUse;

void validate(const GptMoeConfig& cfg, int tensor_parallel_size, bool sequence_parallel, int world_size) {
  if (tensor_parallel_size != 1) {
    tp::validate(cfg.gpt,
                 {.tensor_parallel_size = tensor_parallel_size,
                  .sequence_parallel = sequence_parallel,
                  .make_vocab_size_divisible_by = cfg.make_vocab_size_divisible_by},
                 world_size);
  } else {
    nn::validate(cfg.gpt);
  }
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

// Note [experts under tensor parallelism]
// With tp > 1 the GPT-MoE's attention and dense MLPs are split as in tp::GptModel, but each MoE layer
// (gate and experts) stays whole on every tensor-parallel rank, and every tp rank of a replica routes
// and computes ALL of the replica's tokens: the same expert work, redundantly. Megatron instead splits
// the tokens over the tp ranks for the dispatch (with sequence parallelism each rank routes its own
// shard). We do not, because DeepSpeed's gating is a function of the token set one gate sees: the
// capacity (tokens / E * capacity_factor * k), which choices are dropped, the random token selection
// and l_aux (a product of per-expert means) all change when a gate sees 1/tp of the tokens, so a tp 2
// run would train differently from tp 1 (as a different micro-batch size would). Keeping the whole
// token set keeps tp 1, tp 2 and dp x tp alike to fp32 rounding (tests/moe/tp_engine_test) and needs
// no new collective for the routing: the all-to-alls run over comm::Topology's "ep" groups, which
// join the same tp rank of ep replicas, so the tp ranks of a replica exchange with their own
// counterparts and never with each other. The price is the expert FLOPs repeated tp times and whole
// experts on every tp rank (their states are still sharded by ZeRO over the edp group). Without
// sequence parallelism the layer's input is whole and identical on every tp rank already; with it the
// layer norm's sequence shard is all-gathered before the layer and each rank keeps its own shard of
// the (identical) output; backward mirrors it: the output gradient's shards are all-gathered, and
// each rank keeps its shard of the input gradient. The gate's and experts' gradients are then whole
// and identical on every tp rank (each saw every token), so the engine treats them as any replicated
// parameter: kept bitwise equal, counted once in the gradient norm.

namespace {

const GptMoeConfig& checked(const GptMoeConfig& cfg, const tp::TensorParallel& tp) {
  validate(cfg, tp.size(), tp.sequence_parallel, tp.size());
  return cfg;
}

// The vocabulary the vocab-parallel embedding and head hold (tp::padded_vocab_size).
int64_t padded_vocab(const GptMoeConfig& cfg, const tp::TensorParallel& tp) {
  return tp::padded_vocab_size(cfg.gpt.vocab_size, {.tensor_parallel_size = tp.size(),
                                                    .make_vocab_size_divisible_by = cfg.make_vocab_size_divisible_by});
}

// The pre-LN block of nn::Block with its feed-forward part chosen by the builder (Mlp or MoE); with
// tp > 1 the attention and the dense MLP are tp/'s, the norms on sequence shards with sequence
// parallelism, and the MoE whole (Note [experts under tensor parallelism]).
class MoeBlock : public nn::Module {
 public:
  MoeBlock(int64_t d, int64_t heads, float init_std, float proj_std, const MoEOptions* moe, int64_t expert_hidden,
           const comm::ExpertGroups* groups, const tp::TensorParallel& tp)
      : tp_(tp),
        ln1_(add_norm("ln1", d)),
        attn_(tp.size() > 1 ? static_cast<nn::Module&>(
                                  add_child<tp::ParallelAttention>("attn", d, heads, tp, init_std, proj_std))
                            : add_child<nn::CausalSelfAttention>("attn", d, heads, init_std, proj_std)),
        ln2_(add_norm("ln2", d)) {
    if (moe != nullptr) {
      moe_ = &add_child<MoE>(
          "moe", d, [=] { return std::make_unique<nn::Mlp>(d, init_std, proj_std, expert_hidden); }, *moe, groups);
      ffn_ = moe_;
    } else if (tp.size() > 1) {
      ffn_ = &add_child<tp::ParallelMlp>("mlp", d, tp, init_std, proj_std);
    } else {
      ffn_ = &add_child<nn::Mlp>("mlp", d, init_std, proj_std);
    }
  }
  std::string_view type_name() const override { return "MoeBlock"; }
  MoE* moe() { return moe_; }
  // model.attention's kernel and sparse_attention's layout, on whichever attention the block has (tp's or nn's).
  void set_attention(nn::AttentionKernel k, const std::shared_ptr<const nn::SparseLayout>& layout) {
    if (auto* parallel = dynamic_cast<tp::ParallelAttention*>(&attn_)) {
      parallel->set_kernel(k);
      parallel->set_sparsity(layout);
    } else {
      static_cast<nn::CausalSelfAttention&>(attn_).set_kernel(k);
      static_cast<nn::CausalSelfAttention&>(attn_).set_sparsity(layout);
    }
  }

 protected:
  Tensor forward(nn::Context& ctx, const Tensor& x) override {
    Tensor a = ctx.forward(attn_, ctx.forward(ln1_, x));
    Tensor x1 = ctx.allocate(x.shape(), DType::kF32, MemoryUse::kActivation);
    add(x, a, x1);
    a = {};
    Tensor h = ctx.forward(ln2_, x1);
    Tensor m;
    if (moe_ != nullptr && tp_.sharded_sequence()) {
      // The MoE sees the whole sequence on every tp rank; each keeps its shard of the output.
      Tensor whole = tp::gather_sequence(ctx, tp_, h, MemoryUse::kActivation);
      h = {};
      m = tp::scatter_sequence(ctx, tp_, ctx.forward(*ffn_, whole), MemoryUse::kActivation);
    } else {
      m = ctx.forward(*ffn_, h);
    }
    Tensor y = ctx.allocate(x.shape(), DType::kF32, MemoryUse::kActivation);
    add(x1, m, y);
    return y;
  }
  Tensor backward(nn::Context& ctx, const Tensor& dy) override {
    Tensor dh;
    if (moe_ != nullptr && tp_.sharded_sequence()) {
      // Every tp rank computes the whole input gradient from the gathered output gradient: its own
      // shard of it is this rank's (no sum: the ranks computed the same thing).
      Tensor whole = ctx.backward(*ffn_, tp::gather_sequence(ctx, tp_, dy, MemoryUse::kGradient));
      dh = tp::scatter_sequence(ctx, tp_, whole, MemoryUse::kGradient);
    } else {
      dh = ctx.backward(*ffn_, dy);
    }
    Tensor dx1 = ctx.backward(ln2_, dh);
    dh = {};
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
  nn::LayerNorm& add_norm(std::string name, int64_t d) {
    // On sequence shards the norm's gradients are partial: summed over the group in its backward.
    if (tp_.sharded_sequence()) return add_child<tp::SequenceParallelLayerNorm>(std::move(name), d, tp_);
    return add_child<nn::LayerNorm>(std::move(name), d);
  }

  tp::TensorParallel tp_;
  nn::LayerNorm& ln1_;
  nn::Module& attn_;
  nn::LayerNorm& ln2_;
  nn::Module* ffn_ = nullptr;
  MoE* moe_ = nullptr;
};

// The position table: whole on every tp rank; on a sequence shard its gradient covers this rank's
// positions only and is summed over tp in its backward (Note [replicated gradients of sequence
// shards] in tp/mappings.h; nothing happens without sequence shards).
class PositionEmbedding : public nn::Embedding {
 public:
  PositionEmbedding(int64_t num, int64_t dim, float init_std, const tp::TensorParallel& tp)
      : nn::Embedding(num, dim, init_std), tp_(tp) {}

 protected:
  Tensor backward(nn::Context& ctx, const Tensor& dy) override {
    tp::ReplicatedGradients replicated(ctx, tp_, {&weight()});
    Tensor dx = nn::Embedding::backward(ctx, dy);
    replicated.reduce();
    return dx;
  }

 private:
  tp::TensorParallel tp_;
};

}  // namespace

GptMoeModel::GptMoeModel(const GptMoeConfig& cfg, const comm::ExpertGroups* groups, tp::TensorParallel tp)
    : cfg_(checked(cfg, tp)),
      tp_(tp),
      wte_(tp.size() > 1 ? static_cast<nn::Module&>(add_child<tp::VocabParallelEmbedding>(
                               "wte", cfg.gpt.vocab_size, cfg.gpt.d_model, tp, cfg.gpt.init_std, padded_vocab(cfg, tp)))
                         : add_child<nn::Embedding>("wte", cfg.gpt.vocab_size, cfg.gpt.d_model, cfg.gpt.init_std)),
      wpe_(tp.sharded_sequence() ? add_child<PositionEmbedding>("wpe", cfg.gpt.seq_len, cfg.gpt.d_model, cfg.gpt.init_std, tp)
                                 : add_child<nn::Embedding>("wpe", cfg.gpt.seq_len, cfg.gpt.d_model, cfg.gpt.init_std)),
      blocks_(add_child<nn::Sequential>("blocks")),
      ln_f_(tp.sharded_sequence() ? add_child<tp::SequenceParallelLayerNorm>("ln_f", cfg.gpt.d_model, tp)
                                  : add_child<nn::LayerNorm>("ln_f", cfg.gpt.d_model)),
      lm_head_(tp.size() > 1 ? static_cast<nn::Module&>(add_child<tp::ColumnParallelLinear>(
                                   "lm_head", cfg.gpt.d_model, cfg.gpt.vocab_size, tp, false, cfg.gpt.init_std,
                                   /*stride=*/1, padded_vocab(cfg, tp)))
                             : add_child<nn::Linear>("lm_head", cfg.gpt.d_model, cfg.gpt.vocab_size, false,
                                                     cfg.gpt.init_std)),
      tp_loss_(tp, cfg.gpt.vocab_size) {
  const float proj_std = cfg.gpt.init_std / std::sqrt(2.0f * static_cast<float>(cfg.gpt.n_layer));
  const auto layout = nn::make_sparse_layout(cfg.gpt.sparse_attention, cfg.gpt.n_head, cfg.gpt.seq_len);
  for (int64_t i = 0; i < cfg.gpt.n_layer; ++i) {
    const bool is_moe = (i + 1) % cfg.every_n_layers == 0;
    auto& b = blocks_.append<MoeBlock>(cfg.gpt.d_model, cfg.gpt.n_head, cfg.gpt.init_std, proj_std,
                                       is_moe ? &cfg_.moe : nullptr, cfg.expert_hidden, groups, tp_);
    b.set_attention(cfg.gpt.attention, layout);
    if (b.moe() != nullptr) moe_.push_back(b.moe());
  }
  assign_names(*this);
}

float GptMoeModel::forward_loss(nn::Context& ctx, const nn::Batch& batch) {
  const Tensor& ids = batch.inputs;
  nn::detail::check_token_ids(ids, "GptMoe");
  const int64_t B = ids.size(0), T = ids.size(1);
  if (T > cfg_.gpt.seq_len) {
    throw ConfigError(fmt::format("data: sequences of {} tokens exceed model.seq_len = {}", T, cfg_.gpt.seq_len));
  }
  // With sequence parallelism the token embedding is this rank's sequence shard: positions [t0, t0 + Ts).
  const bool shard = tp_.sharded_sequence();
  const int64_t Ts = shard ? tp::sequence_shard(tp_, T) : T, t0 = shard ? Ts * tp_.rank() : 0;
  positions_ = ctx.allocate({B, Ts}, DType::kI32, MemoryUse::kActivation);
  for (int64_t i = 0; i < B * Ts; ++i) positions_.data<int32_t>()[i] = static_cast<int32_t>(t0 + i % Ts);
  Tensor tok = ctx.forward(wte_, ids);
  Tensor pos = ctx.forward(wpe_, positions_);
  Tensor x = ctx.allocate(tok.shape(), DType::kF32, MemoryUse::kActivation);
  if (ctx.computes())
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = tok.data<float>()[i] + pos.data<float>()[i];
  tok = pos = {};
  x = ctx.forward(blocks_, x);
  x = ctx.forward(ln_f_, x);
  Tensor logits = ctx.forward(lm_head_, x);
  float loss = tp_.size() > 1 ? tp_loss_.forward(ctx, logits, batch.targets) : loss_.forward(ctx, logits, batch.targets);
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
  Tensor d = tp_.size() > 1 ? tp_loss_.backward(ctx, grad_scale) : loss_.backward(ctx, grad_scale);
  d = ctx.backward(lm_head_, d);
  d = ctx.backward(ln_f_, d);
  d = ctx.backward(blocks_, d);
  // Both embeddings receive the same gradient (x = tok + pos).
  ctx.backward(wpe_, d);
  ctx.backward(wte_, d);
  positions_ = {};
}

}  // namespace zs::moe
