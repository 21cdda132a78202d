#include "pp/gpt.h"

#include <cmath>
#include <string>

#include <fmt/format.h>

#include "core/errors.h"
#include "nn/detail/linear.h"
#include "nn/detail/ops.h"
#include "nn/param_access.h"
#include "nn/transformer.h"
#include "pp/detail/blocks.h"
#include "tp/gpt.h"
#include "tp/transformer.h"
#include "nn/detail/token_batch.h"

namespace zs::pp {

using memory::DType;
using memory::Tensor;
using nn::MemoryUse;


namespace {

// Per block: its parameter elements, the embeddings added to the first and the final norm and head to
// the last: every parameter of the pipeline (the tied head's copy included) in exactly one entry.
std::vector<int64_t> gpt_block_costs(const nn::GptConfig& cfg) {
  nn::validate(cfg);
  const int64_t C = cfg.d_model, V = cfg.vocab_size, L = cfg.n_layer;
  std::vector<int64_t> cost(static_cast<size_t>(L), 12 * C * C + 13 * C);
  cost.front() += V * C + cfg.seq_len * C;  // wte, wpe
  cost.back() += 2 * C + V * C;             // ln_f, the head (lm_head, or the tied copy of wte)
  return cost;
}

// Note [compute partition]
// pipeline.partition_method "compute": each block's cost is its training FLOPs per token, the terms of
// nn::gpt_train_flops_per_token (nn/gpt.h): 6 (4 C^2 + 2 C F) for its products and 12 T C for the
// attention scores, forward and backward; the last block also carries the output head's 6 V C (its
// loss's softmax is elementwise, not counted, as nn/flops.h counts). The first block's embedding
// lookup costs no products and adds nothing, though the parameter method counts its V C + T C
// elements as much as the head's. This is Megatron's --account-for-embedding/loss-in-pipeline-split
// with their FLOP counts instead of "one layer each": the last stage gets fewer blocks in the
// proportion its head costs, and the first is not relieved of blocks for an embedding that costs
// nothing. Blocks are whole, so a head much smaller than a block (a byte vocabulary: V / 12 C of one)
// leaves the stages as uneven as before: no whole-block split does better.
std::vector<int64_t> gpt_block_compute(const nn::GptConfig& cfg) {
  nn::validate(cfg);
  const int64_t C = cfg.d_model, V = cfg.vocab_size, T = cfg.seq_len, F = nn::gpt_d_ff(cfg);
  std::vector<int64_t> cost(static_cast<size_t>(cfg.n_layer), 6 * (4 * C * C + 2 * C * F) + 12 * T * C);
  cost.back() += 6 * V * C;
  return cost;
}

// The per-block costs `part`'s method balances (parameters unless it is "compute").
std::vector<int64_t> partition_costs(const nn::GptConfig& cfg, const PartitionConfig& part) {
  return part.method == PartitionMethod::kCompute ? gpt_block_compute(cfg) : gpt_block_costs(cfg);
}

}  // namespace

std::vector<int64_t> gpt_partition(const nn::GptConfig& cfg, const PartitionConfig& part, int global_chunks) {
  return partition(part, partition_costs(cfg, part), global_chunks);
}

int64_t gpt_stage_param_count(const nn::GptConfig& cfg, const PartitionConfig& part, int stages, int chunks, int stage) {
  const std::vector<int64_t> cost = gpt_block_costs(cfg);
  const std::vector<int64_t> bounds = gpt_partition(cfg, part, stages * chunks);
  int64_t n = 0;
  for (int c = 0; c < chunks; ++c) {
    const auto g = static_cast<size_t>(c * stages + stage);
    for (int64_t b = bounds[g]; b < bounds[g + 1]; ++b) n += cost[static_cast<size_t>(b)];
  }
  return n;
}

// Note [stage gradients intact]
// GptStage::grads_intact: ZB-H1's deferred weight gradients may keep their dy without a copy (Note
// [deferred weight gradients] in nn/context.h) because nothing in the chunk writes into a gradient
// once it has passed it to a child's backward. The ones kept: each nn::Linear's dy, i.e. the block's
// own dy (the MLP's proj), ln2's gradient plus the residual (the attention's proj), GELU's and the
// attention core's outputs (fc, qkv), and the head's logits gradient (a fresh tensor from the loss).
// pre_norm_block_backward (nn/detail/pre_norm_block.h) adds the residuals into ln2's and ln1's fresh
// outputs before passing them on; BlockRange, the pipeline (output_grad_, input_grad_, the sends) and
// the embedding's backward only read. A change that sums into a gradient in place after passing it
// down must return false here.
GptStage::GptStage(const nn::GptConfig& cfg, int64_t first_block, int64_t end_block, bool first, bool last,
                   bool recompute)
    : cfg_(cfg), first_(first), last_(last) {
  if (first || (last && cfg.tied_embeddings)) {
    wte_ = &declare_param("wte", {cfg.vocab_size, cfg.d_model}, nn::Init::normal(0.0f, cfg.init_std));
  }
  if (first) wpe_ = &declare_param("wpe", {cfg.seq_len, cfg.d_model}, nn::Init::normal(0.0f, cfg.init_std));
  auto& blocks = add_child<detail::BlockRange>("blocks");
  const float proj_std = cfg.init_std / std::sqrt(2.0f * static_cast<float>(cfg.n_layer));
  const auto layout = nn::make_sparse_layout(cfg.sparse_attention, cfg.n_head, cfg.seq_len);
  for (int64_t i = first_block; i < end_block; ++i) {
    auto& block = blocks.add<nn::Block>(i, cfg.d_model, cfg.n_head, cfg.init_std, proj_std);
    block.set_recomputed(recompute);
    block.attention().set_kernel(cfg.attention);
    block.attention().set_sparsity(layout);
  }
  blocks_ = &blocks;
  if (last) {
    ln_f_ = &add_child<nn::LayerNorm>("ln_f", cfg.d_model);
    if (!cfg.tied_embeddings) lm_head_ = &add_child<nn::Linear>("lm_head", cfg.d_model, cfg.vocab_size, false, cfg.init_std);
  }
  nn::assign_names(*this);
}

void GptStage::clear_own_saved() {
  loss_.clear();
  ids_ = final_x_ = output_ = output_grad_ = input_grad_ = {};
}

// The same arithmetic as nn::GptModel::forward_loss, cut at the chunk's ends.
float GptStage::forward_loss(nn::Context& ctx, const nn::Batch& batch) {
  const bool train = ctx.training();
  const int64_t C = cfg_.d_model, V = cfg_.vocab_size;
  Tensor x;
  if (first_) {
    const Tensor& ids = batch.inputs;
    nn::detail::check_token_ids(ids, "GptStage");
    const int64_t B = ids.size(0), T = ids.size(1);
    if (T > cfg_.seq_len) {
      throw ConfigError(fmt::format("data: sequences of {} tokens exceed model.seq_len = {}; raise model.seq_len or "
                                    "shorten the data sequence length",
                                    T, cfg_.seq_len));
    }
    Tensor wte = nn::weight_f32(ctx, *wte_), wpe = nn::weight_f32(ctx, *wpe_);
    x = ctx.allocate({B, T, C}, DType::kF32, MemoryUse::kActivation);
    nn::detail::embedding_lookup(ids.data<int32_t>(), B * T, wte.data<float>(), V, C, wpe.data<float>(), T,
                                 x.data<float>());
    if (train) ids_ = ids;
  } else {
    x = batch.inputs;
    ZS_MODEL_CHECK(x.dtype() == DType::kF32 && x.dim() == 3 && x.size(2) == C,
                   "GptStage: a middle chunk's input must be the fp32 activation (B, T, {}), got {}", C,
                   memory::shape_string(x.shape()));
  }
  x = ctx.forward(*blocks_, x);
  if (!last_) {
    output_ = x;
    return 0.0f;
  }
  x = ctx.forward(*ln_f_, x);
  Tensor logits;
  if (lm_head_ != nullptr) {
    logits = ctx.forward(*lm_head_, x);
  } else {
    // Note [tied head products] in nn/gpt.cpp: the tied head is a Linear whose weight is wte.
    logits = nn::detail::linear_forward(ctx, x, x.size(0) * x.size(1), *wte_, nullptr);
    if (train) final_x_ = x;
  }
  return loss_.forward(ctx, logits, batch.targets);
}

void GptStage::backward_loss(nn::Context& ctx, float grad_scale) {
  const int64_t C = cfg_.d_model;
  Tensor dx;
  if (last_) {
    Tensor dlogits = loss_.backward(ctx, grad_scale);
    if (lm_head_ != nullptr) {
      dx = ctx.backward(*lm_head_, dlogits);
    } else {
      // ZB-H1 defers the tied head's weight gradient to the W pass like any nn::Linear's (Note [ZB-H1]
      // in pp/schedule.h), but not where this chunk is also the first: the embedding's gradient then
      // goes into the same wte after the head's, in every schedule's order.
      const int64_t n = final_x_.size(0) * final_x_.size(1);
      dx = first_ ? nn::detail::linear_backward(ctx, dlogits, n, final_x_, *wte_, nullptr)
                  : nn::detail::linear_backward_deferrable(ctx, *this, dlogits, /*dy_reused=*/false, n, final_x_, *wte_,
                                                           nullptr);
    }
    final_x_ = {};
    dx = ctx.backward(*ln_f_, dx);
  } else {
    ZS_ASSERT(output_grad_.raw() != nullptr, "GptStage backward without set_output_grad");
    dx = std::exchange(output_grad_, {});
  }
  dx = ctx.backward(*blocks_, dx);
  if (first_) {
    const int64_t N = ids_.numel(), T = ids_.size(1);
    {
      nn::GradAccumulator g(ctx, *wte_);
      nn::detail::embedding_accumulate(ids_.data<int32_t>(), N, dx.data<float>(), C, g.data());
      g.commit();
    }
    nn::GradAccumulator g(ctx, *wpe_);
    nn::detail::sum_rows_into(dx.data<float>(), N, C, T, g.data());
    g.commit();
    ids_ = {};
  } else {
    input_grad_ = dx;
  }
}

namespace {

// pc.recompute_plan onto a chunk's blocks (named by their global index).
template <typename Block>
void apply_recompute_plan(StageModel& chunk, const nn::GptRecompute& plan) {
  for (nn::Module* m : chunk.named_modules()) {
    auto* b = dynamic_cast<Block*>(m);
    if (b == nullptr) continue;
    const std::string& local = b->local_name();
    const auto i = static_cast<size_t>(std::stoll(local));
    if (i < plan.blocks.size() && plan.blocks[i]) b->set_recomputed(true);
    if (plan.selective) b->attention().set_recompute_scores(true);
  }
}

}  // namespace

std::vector<ChunkFactory> gpt_chunk_factories(const nn::GptConfig& cfg, const comm::Group& group,
                                              const GptPipelineConfig& pc, std::vector<int64_t>* bounds) {
  if (!nn::gpt_standard_widths(cfg)) {
    throw ConfigError(fmt::format("model.d_ff / model.norm_eps: the pipeline GPT builds GPT-2's MLP width 4 * d_model and "
                                  "LayerNorm epsilon 1e-5 only (got d_ff {}, norm_eps {}); remove them from the "
                                  "model section",
                                  nn::gpt_d_ff(cfg), cfg.norm_eps));
  }
  const int p = group.size(), v = pc.virtual_pipeline_size, r = group.rank();
  if (v < 1) throw ConfigError(fmt::format("model.virtual_pipeline_size: must be a positive integer, got {}", v));
  *bounds = gpt_partition(cfg, pc.partition, p * v);
  const int G = p * v;
  const comm::Group* tg = pc.tensor_parallel_group;
  if (tg != nullptr) {
    tp::validate(cfg, {.tensor_parallel_size = tg->size(), .sequence_parallel = pc.sequence_parallel}, tg->size());
    // The pipeline's tensor-parallel stages split the vocabulary without padding.
    if (cfg.vocab_size % tg->size() != 0) {
      throw ConfigError(fmt::format("model.tensor_parallel_size: {} does not divide model.vocab_size = {}, which the "
                                    "pipeline's tensor-parallel stages split unpadded; choose a vocabulary divisible "
                                    "by {}",
                                    tg->size(), cfg.vocab_size, tg->size()));
    }
  } else if (pc.sequence_parallel) {
    throw ConfigError("model.sequence_parallel: needs tensor parallelism (model.tensor_parallel_size > 1)");
  }
  std::vector<ChunkFactory> factories;
  const nn::GptRecompute plan = pc.recompute_plan;
  for (int c = 0; c < v; ++c) {
    const int g = c * p + r;
    const int64_t b0 = (*bounds)[static_cast<size_t>(g)], b1 = (*bounds)[static_cast<size_t>(g) + 1];
    const bool first = g == 0, last = g == G - 1, rc = pc.recompute;
    if (tg != nullptr) {
      const tp::TensorParallel tpar{.group = tg, .sequence_parallel = pc.sequence_parallel};
      factories.push_back([=]() -> std::unique_ptr<StageModel> {
        auto s = std::make_unique<TpGptStage>(cfg, tpar, b0, b1, first, last, rc);
        apply_recompute_plan<tp::ParallelBlock>(*s, plan);
        return s;
      });
    } else {
      factories.push_back([=]() -> std::unique_ptr<StageModel> {
        auto s = std::make_unique<GptStage>(cfg, b0, b1, first, last, rc);
        apply_recompute_plan<nn::Block>(*s, plan);
        return s;
      });
    }
  }
  return factories;
}

GptPipeline::GptPipeline(const nn::GptConfig& cfg, const comm::Group& group, const GptPipelineConfig& pc)
    : cfg_(cfg), group_(group) {
  std::vector<ChunkFactory> factories = gpt_chunk_factories(cfg, group, pc, &bounds_);
  pipe_ = std::make_unique<Pipeline>(group, pc.pipeline, std::move(factories));
}

std::vector<nn::Parameter*> GptPipeline::params() {
  std::vector<nn::Parameter*> out;
  for (int c = 0; c < pipe_->chunks(); ++c) {
    for (nn::Parameter* q : pipe_->chunk(c).all_params()) out.push_back(q);
  }
  return out;
}

void GptPipeline::materialize(uint64_t seed, memory::DType dtype) {
  for (int c = 0; c < pipe_->chunks(); ++c) nn::materialize(pipe_->chunk(c), seed, dtype);
}

StepStats GptPipeline::step(nn::Context& ctx, std::span<const nn::Batch> micro_batches, float grad_scale) {
  StepStats st = pipe_->run(ctx, micro_batches, grad_scale);
  const int p = group_.size(), v = pipe_->chunks(), r = group_.rank();
  if (!cfg_.tied_embeddings || p * v == 1) return st;
  // Megatron's embedding group: the first chunk's wte (rank 0, chunk 0) and the last chunk's copy
  // (rank p - 1, chunk v - 1) each add the other's gradient; a + b == b + a, so both hold the same bits.
  nn::Parameter* first = r == 0 ? pipe_->chunk(0).shared_embedding() : nullptr;
  nn::Parameter* last = r == p - 1 ? pipe_->chunk(v - 1).shared_embedding() : nullptr;
  for (nn::Parameter* q : {first, last}) {
    if (q != nullptr) {
      ZS_ASSERT(q->grad().dtype() == DType::kF32, "pp: the tied embedding's gradient must be fp32 (got {})",
                memory::dtype_name(q->grad().dtype()));
    }
  }
  if (p == 1) {
    std::span<float> a = first->grad().f32(), b = last->grad().f32();
    for (size_t i = 0; i < a.size(); ++i) a[i] = b[i] = a[i] + b[i];
    return st;
  }
  if (r != 0 && r != p - 1) return st;
  nn::Parameter* mine = r == 0 ? first : last;
  Tensor other = Tensor::empty(mine->grad().shape(), DType::kF32);
  group_.sendrecv(mine->grad(), r == 0 ? p - 1 : 0, other, r == 0 ? p - 1 : 0);
  std::span<float> a = mine->grad().f32(), b = other.f32();
  for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  return st;
}

}  // namespace zs::pp
