// pp::TpGptStage: a chunk of tp::GptModel, the same arithmetic as tp/gpt.cpp cut at the chunk's ends.
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "core/errors.h"
#include "nn/detail/linear.h"
#include "nn/detail/ops.h"
#include "nn/detail/parallel.h"
#include "nn/param_access.h"
#include "pp/detail/blocks.h"
#include "pp/gpt.h"
#include "tp/detail/vocab.h"
#include "tp/linear.h"
#include "tp/transformer.h"

namespace zs::pp {

using memory::DType;
using memory::Tensor;
using nn::MemoryUse;

TpGptStage::TpGptStage(const nn::GptConfig& cfg, tp::TensorParallel tp, int64_t first_block, int64_t end_block,
                       bool first, bool last, bool recompute)
    : cfg_(cfg), tp_(tp), first_(first), last_(last), loss_(tp) {
  if (first || (last && cfg.tied_embeddings)) {
    wte_ = &declare_param("wte", {cfg.vocab_size / tp_.size(), cfg.d_model}, nn::Init::normal(0.0f, cfg.init_std));
    wte_->set_tensor_slice({.dim = 0, .parts = tp_.size(), .index = tp_.rank()});
  }
  if (first) wpe_ = &declare_param("wpe", {cfg.seq_len, cfg.d_model}, nn::Init::normal(0.0f, cfg.init_std));
  auto& blocks = add_child<detail::BlockRange>("blocks");
  const float proj_std = cfg.init_std / std::sqrt(2.0f * static_cast<float>(cfg.n_layer));
  const auto layout = nn::make_sparse_layout(cfg.sparse_attention, cfg.n_head, cfg.seq_len);
  for (int64_t i = first_block; i < end_block; ++i) {
    auto& block = blocks.add<tp::ParallelBlock>(i, cfg.d_model, cfg.n_head, tp_, cfg.init_std, proj_std);
    block.set_recomputed(recompute);
    block.attention().set_kernel(cfg.attention);
    block.attention().set_sparsity(layout);
  }
  blocks_ = &blocks;
  if (last) {
    ln_f_ = tp_.sharded_sequence() ? static_cast<nn::Module*>(&add_child<tp::SequenceParallelLayerNorm>("ln_f", cfg.d_model, tp_))
                                   : &add_child<nn::LayerNorm>("ln_f", cfg.d_model);
    if (!cfg.tied_embeddings) {
      lm_head_ = &add_child<tp::ColumnParallelLinear>("lm_head", cfg.d_model, cfg.vocab_size, tp_, false, cfg.init_std);
    }
  }
  nn::assign_names(*this);
}

memory::Shape TpGptStage::boundary_shape(int64_t batch, int64_t seq) const {
  return {batch, tp_.sharded_sequence() ? tp::sequence_shard(tp_, seq) : seq, cfg_.d_model};
}

void TpGptStage::clear_own_saved() {
  loss_.clear();
  ids_ = final_x_ = output_ = output_grad_ = input_grad_ = {};
}

float TpGptStage::forward_loss(nn::Context& ctx, const nn::Batch& batch) {
  const bool train = ctx.training(), shard = tp_.sharded_sequence();
  const int64_t C = cfg_.d_model;
  const int64_t Vl = wte_ != nullptr ? wte_->shape()[0] : 0, first_row = Vl * tp_.rank();
  const Tensor& shape_of = first_ ? batch.inputs : batch.targets;
  if (first_ || last_) {
    ZS_MODEL_CHECK(shape_of.raw() != nullptr && shape_of.dtype() == DType::kI32 && shape_of.dim() == 2,
                   "TpGptStage: {} must be int32 token ids (B, T), got {}", first_ ? "inputs" : "targets",
                   memory::shape_string(shape_of.shape()));
    batch_ = shape_of.size(0);
    seq_ = shape_of.size(1);
  }
  Tensor x;
  if (first_) {
    const Tensor& ids = batch.inputs;
    const int64_t B = batch_, T = seq_, N = B * T;
    if (T > cfg_.seq_len) {
      throw ConfigError(fmt::format("data: sequences of {} tokens exceed model.seq_len = {}; raise model.seq_len or "
                                    "shorten the data sequence length",
                                    T, cfg_.seq_len));
    }
    const int64_t Ts = shard ? tp::sequence_shard(tp_, T) : T, t0 = shard ? Ts * tp_.rank() : 0;
    if (nn::detail::kernels_enabled()) nn::detail::check_ids(ids.data<int32_t>(), N, cfg_.vocab_size, "token");
    Tensor wte = nn::weight_f32(ctx, *wte_);
    Tensor sum = ctx.allocate({B, T, C}, DType::kF32, shard ? MemoryUse::kScratch : MemoryUse::kActivation);
    tp::detail::vocab_lookup(ids.data<int32_t>(), N, wte.data<float>(), first_row, Vl, C, sum.data<float>());
    if (shard) {
      x = tp::reduce_scatter_sequence(ctx, tp_, sum, MemoryUse::kActivation);
    } else {
      tp::all_reduce(tp_, sum);
      x = sum;
    }
    Tensor wpe = nn::weight_f32(ctx, *wpe_);
    const float* pp = wpe.data<float>();
    float* xp = x.data<float>();
    nn::detail::parallel_for(B * Ts, 64, [=](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* p = pp + (t0 + r % Ts) * C;
        float* o = xp + r * C;
        for (int64_t j = 0; j < C; ++j) o[j] += p[j];
      }
    });
    if (train) ids_ = ids;
  } else {
    x = batch.inputs;
    ZS_MODEL_CHECK(x.dtype() == DType::kF32 && x.dim() == 3 && x.size(2) == C,
                   "TpGptStage: a middle chunk's input must be the fp32 activation (B, T, {}), got {}", C,
                   memory::shape_string(x.shape()));
  }
  x = ctx.forward(*blocks_, x);
  if (!last_) {
    output_ = x;
    return 0.0f;
  }
  x = ctx.forward(*ln_f_, x);
  Tensor logits;  // (B, T, vocab/tp): this rank's vocabulary columns
  if (lm_head_ != nullptr) {
    logits = ctx.forward(*lm_head_, x);
  } else {
    // Note [tied head products] in nn/gpt.cpp: a Linear whose weight is this rank's rows of wte.
    const Tensor xf = shard ? tp::gather_sequence(ctx, tp_, x, MemoryUse::kScratch) : x;
    logits = nn::detail::linear_forward(ctx, xf, batch_ * seq_, *wte_, nullptr);
    if (train) final_x_ = x;
  }
  return loss_.forward(ctx, logits, batch.targets);
}

void TpGptStage::backward_loss(nn::Context& ctx, float grad_scale) {
  const bool shard = tp_.sharded_sequence();
  const int64_t B = batch_, T = seq_, C = cfg_.d_model, N = B * T;
  const int64_t Vl = wte_ != nullptr ? wte_->shape()[0] : 0, first_row = Vl * tp_.rank();
  Tensor dx;
  if (last_) {
    Tensor dlogits = loss_.backward(ctx, grad_scale);
    if (lm_head_ != nullptr) {
      dx = ctx.backward(*lm_head_, dlogits);
    } else {
      // The tied head is a column-parallel product: dx sums every rank's columns' part.
      const Tensor xf = shard ? tp::gather_sequence(ctx, tp_, final_x_, MemoryUse::kScratch) : final_x_;
      // Deferred in ZB-H1 as GptStage::backward_loss does, but not on a chunk that is also the first,
      // nor with the sequence sharded (xf is then this pass's scratch gather).
      Tensor dxf = first_ || shard ? nn::detail::linear_backward(ctx, dlogits, N, xf, *wte_, nullptr)
                          : nn::detail::linear_backward_deferrable(ctx, *this, dlogits, /*dy_reused=*/false, N, xf,
                                                                   *wte_, nullptr);
      if (shard) {
        dx = tp::reduce_scatter_sequence(ctx, tp_, dxf, MemoryUse::kGradient);
      } else {
        tp::all_reduce(tp_, dxf);
        dx = dxf;
      }
    }
    final_x_ = {};
    dx = ctx.backward(*ln_f_, dx);
  } else {
    ZS_ASSERT(output_grad_.raw() != nullptr, "TpGptStage backward without set_output_grad");
    dx = std::exchange(output_grad_, {});
  }
  dx = ctx.backward(*blocks_, dx);
  if (!first_) {
    input_grad_ = dx;
    return;
  }
  // The embedding's input gradient, whole on every rank (gathered from the shards): each rank adds its
  // own vocabulary rows, and every rank the same whole position gradient.
  const Tensor dxf = shard ? tp::gather_sequence(ctx, tp_, dx, MemoryUse::kScratch) : dx;
  {
    nn::GradAccumulator g(ctx, *wte_);
    tp::detail::vocab_accumulate(ids_.data<int32_t>(), N, dxf.data<float>(), first_row, Vl, C, g.data());
    g.commit();
  }
  nn::GradAccumulator g(ctx, *wpe_);
  nn::detail::sum_rows_into(dxf.data<float>(), N, C, T, g.data());
  g.commit();
  ids_ = {};
}

}  // namespace zs::pp
