#include "tp/gpt.h"

#include <cmath>
#include <string>

#include <fmt/format.h>

#include "core/errors.h"
#include "nn/detail/linear.h"
#include "nn/detail/ops.h"
#include "nn/detail/parallel.h"
#include "nn/param_access.h"
#include "tp/detail/vocab.h"
#include "tp/transformer.h"
#include "nn/detail/token_batch.h"

namespace zs::tp {

using memory::DType;
using memory::Tensor;
using nn::MemoryUse;

int64_t padded_vocab_size(int64_t vocab, const TensorParallelConfig& par) {
  if (par.tensor_parallel_size <= 1) return vocab;
  const int64_t multiple = int64_t{par.make_vocab_size_divisible_by} * par.tensor_parallel_size;
  return (vocab + multiple - 1) / multiple * multiple;
}

namespace {

// The tensor-parallel blocks have GPT-2's widths only: refused by name, never silently ignored.
void check_standard_widths(const nn::GptConfig& cfg) {
  if (!nn::gpt_standard_widths(cfg)) {
    throw ConfigError(fmt::format("model.d_ff / model.norm_eps: the tensor-parallel GPT builds GPT-2's MLP width 4 * d_model and "
                                  "LayerNorm epsilon 1e-5 only (got d_ff {}, norm_eps {}); remove them from the "
                                  "model section or set model.tensor_parallel_size to 1",
                                  nn::gpt_d_ff(cfg), cfg.norm_eps));
  }
}

}  // namespace

void validate(const nn::GptConfig& cfg, const TensorParallelConfig& par, int world_size) {
  nn::validate(cfg);
  const int t = par.tensor_parallel_size;
  if (t > 1) check_standard_widths(cfg);
  if (t < 1) throw ConfigError(fmt::format("model.tensor_parallel_size: must be a positive integer, got {}", t));
  if (par.make_vocab_size_divisible_by < 1) {
    throw ConfigError(fmt::format("model.make_vocab_size_divisible_by: must be a positive integer (1: pad the "
                                  "vocabulary only to a multiple of model.tensor_parallel_size), got {}",
                                  par.make_vocab_size_divisible_by));
  }
  auto divides = [&](int64_t v, const std::string& what) {
    if (v % t != 0) {
      throw ConfigError(fmt::format("model.tensor_parallel_size: {} does not divide {} = {}; choose a tensor-parallel "
                                    "size that divides {}",
                                    t, what, v, what));
    }
  };
  divides(cfg.n_head, "model.n_head");
  divides(4 * cfg.d_model, "the MLP width 4 * model.d_model");
  divides(world_size, "the world size (ranks)");
  if (par.sequence_parallel && cfg.seq_len % t != 0) {
    throw ConfigError(fmt::format("model.sequence_parallel: splits sequences over model.tensor_parallel_size = {} "
                                  "ranks, which does not divide model.seq_len = {}; choose a seq_len divisible by {} "
                                  "or turn model.sequence_parallel off",
                                  t, cfg.seq_len, t));
  }
}

namespace {

const nn::GptConfig& checked(const nn::GptConfig& cfg, const TensorParallelConfig& par, const comm::Group* group) {
  const int size = group != nullptr ? group->size() : 1;
  if (size != par.tensor_parallel_size) {
    throw UsageError(fmt::format("tp::GptModel: model.tensor_parallel_size = {} but the tensor-parallel group has {} "
                                 "rank(s); pass comm::Topology's tensor_parallel() group of that size",
                                 par.tensor_parallel_size, size));
  }
  validate(cfg, par, size);
  check_standard_widths(cfg);
  return cfg;
}

}  // namespace

GptModel::GptModel(const nn::GptConfig& cfg, const TensorParallelConfig& par, const comm::Group* group)
    : cfg_(checked(cfg, par, group)),
      tp_{.group = group, .sequence_parallel = par.sequence_parallel},
      wte_(declare_param("wte", {padded_vocab_size(cfg.vocab_size, par) / tp_.size(), cfg.d_model},
                         nn::Init::normal(0.0f, cfg.init_std))),
      wpe_(declare_param("wpe", {cfg.seq_len, cfg.d_model}, nn::Init::normal(0.0f, cfg.init_std))),
      blocks_(add_child<nn::Sequential>("blocks")),
      ln_f_(tp_.sharded_sequence() ? add_child<SequenceParallelLayerNorm>("ln_f", cfg.d_model, tp_)
                                   : add_child<nn::LayerNorm>("ln_f", cfg.d_model)),
      padded_vocab_(padded_vocab_size(cfg.vocab_size, par)),
      loss_(tp_, cfg.vocab_size) {
  wte_.set_tensor_slice({.dim = 0,
                         .parts = tp_.size(),
                         .index = tp_.rank(),
                         .full_extent = padded_vocab_ != cfg.vocab_size ? cfg.vocab_size : 0});
  const float proj_std = cfg.init_std / std::sqrt(2.0f * static_cast<float>(cfg.n_layer));
  const auto layout = nn::make_sparse_layout(cfg.sparse_attention, cfg.n_head, cfg.seq_len);
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    auto& attn = blocks_.append<ParallelBlock>(cfg.d_model, cfg.n_head, tp_, cfg.init_std, proj_std).attention();
    attn.set_kernel(cfg.attention);
    attn.set_sparsity(layout);
  }
  if (!cfg.tied_embeddings) {
    lm_head_ = &add_child<ColumnParallelLinear>("lm_head", cfg.d_model, cfg.vocab_size, tp_, false, cfg.init_std,
                                                /*stride=*/1, padded_vocab_);
  }
  nn::assign_names(*this);
}

void GptModel::set_recompute(const nn::GptRecompute& r) {
  ZS_ASSERT(!forward_pending(), "tp::GptModel::set_recompute between a forward and its backward");
  ZS_ASSERT(static_cast<int64_t>(r.blocks.size()) <= cfg_.n_layer, "GptRecompute names {} blocks of {}",
            r.blocks.size(), cfg_.n_layer);
  recompute_ = r;
  auto blocks = blocks_.children();
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto& block = static_cast<ParallelBlock&>(*blocks[i]);
    block.set_recomputed(i < r.blocks.size() && r.blocks[i]);
    block.attention().set_recompute_scores(r.selective);
  }
}

void GptModel::clear_own_saved() {
  loss_.clear();
  ids_ = final_x_ = {};
}

float GptModel::forward_loss(nn::Context& ctx, const nn::Batch& batch) {
  const Tensor& ids = batch.inputs;
  nn::detail::check_token_batch(batch, "Gpt");
  const int64_t B = ids.size(0), T = ids.size(1), C = cfg_.d_model, N = B * T;
  const int64_t Vl = wte_.shape()[0], first = Vl * tp_.rank();
  if (T > cfg_.seq_len) {
    throw ConfigError(fmt::format("data: sequences of {} tokens exceed model.seq_len = {}; raise model.seq_len or "
                                  "shorten the data sequence length",
                                  T, cfg_.seq_len));
  }
  const bool shard = tp_.sharded_sequence();
  const int64_t Ts = shard ? sequence_shard(tp_, T) : T, t0 = shard ? Ts * tp_.rank() : 0;
  const bool train = ctx.training();
  if (nn::detail::kernels_enabled()) nn::detail::check_ids(ids.data<int32_t>(), N, cfg_.vocab_size, "token");
  Tensor wte = nn::weight_f32(ctx, wte_);
  Tensor x;
  {
    // The vocab-parallel lookup: each rank its own rows, summed over the group (or its sequence shard
    // of the sum), then the positions (whole on every rank) added to what this rank holds.
    Tensor sum = ctx.allocate({B, T, C}, DType::kF32, shard ? MemoryUse::kScratch : MemoryUse::kActivation);
    detail::vocab_lookup(ids.data<int32_t>(), N, wte.data<float>(), first, Vl, C, sum.data<float>());
    if (shard) {
      x = reduce_scatter_sequence(ctx, tp_, sum, MemoryUse::kActivation);
    } else {
      all_reduce(tp_, sum);
      x = sum;
    }
    Tensor wpe = nn::weight_f32(ctx, wpe_);
    const float* pp = wpe.data<float>();
    float* xp = x.data<float>();
    nn::detail::parallel_for(B * Ts, 64, [=](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* p = pp + (t0 + r % Ts) * C;
        float* o = xp + r * C;
        for (int64_t j = 0; j < C; ++j) o[j] += p[j];
      }
    });
  }
  nn::mark_dropped_blocks<ParallelBlock>(blocks_, cfg_.layer_drop, ctx);
  x = ctx.forward(blocks_, x);
  x = ctx.forward(ln_f_, x);
  Tensor logits;  // (B, T, vocab/tp): this rank's vocabulary columns
  if (lm_head_ != nullptr) {
    logits = ctx.forward(*lm_head_, x);
  } else {
    const Tensor xf = shard ? gather_sequence(ctx, tp_, x, MemoryUse::kScratch) : x;
    // Note [tied head products] in nn/gpt.cpp: a Linear whose weight is this rank's rows of wte.
    logits = nn::detail::linear_forward(ctx, xf, N, wte_, nullptr);
  }
  const float loss = loss_.forward(ctx, logits, batch.targets);
  if (train) {
    ids_ = ids;
    if (lm_head_ == nullptr) final_x_ = x;
  }
  return loss;
}

void GptModel::backward_loss(nn::Context& ctx, float grad_scale) {
  ZS_ASSERT(ids_.raw() != nullptr, "Gpt backward_loss without a training-mode forward_loss");
  const int64_t T = ids_.size(1), C = cfg_.d_model, N = ids_.numel();
  const int64_t Vl = wte_.shape()[0], first = Vl * tp_.rank();
  const bool shard = tp_.sharded_sequence();
  Tensor dlogits = loss_.backward(ctx, grad_scale);
  Tensor dx;
  if (lm_head_ != nullptr) {
    dx = ctx.backward(*lm_head_, dlogits);
  } else {
    // The tied head is a column-parallel product: dx sums every rank's columns' part.
    const Tensor xf = shard ? gather_sequence(ctx, tp_, final_x_, MemoryUse::kScratch) : final_x_;
    Tensor dxf = nn::detail::linear_backward(ctx, dlogits, N, xf, wte_, nullptr);
    if (shard) {
      dx = reduce_scatter_sequence(ctx, tp_, dxf, MemoryUse::kGradient);
    } else {
      all_reduce(tp_, dxf);
      dx = dxf;
    }
  }
  dlogits = {};
  final_x_ = {};
  dx = ctx.backward(ln_f_, dx);
  dx = ctx.backward(blocks_, dx);
  // The embedding's input gradient, whole on every rank (gathered from the shards): each rank adds its
  // own vocabulary rows, and every rank the same whole position gradient.
  const Tensor dxf = shard ? gather_sequence(ctx, tp_, dx, MemoryUse::kScratch) : dx;
  {
    nn::GradAccumulator g(ctx, wte_);
    detail::vocab_accumulate(ids_.data<int32_t>(), N, dxf.data<float>(), first, Vl, C, g.data());
    g.commit();
  }
  {
    nn::GradAccumulator g(ctx, wpe_);
    nn::detail::sum_rows_into(dxf.data<float>(), N, C, T, g.data());
    g.commit();
  }
  clear_own_saved();
}

}  // namespace zs::tp
