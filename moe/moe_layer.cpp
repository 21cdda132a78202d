#include "moe/moe_layer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "core/errors.h"

namespace zs::moe {

using memory::DType;
using memory::Tensor;
using nn::MemoryUse;

// ---- options ----

GateConfig MoEOptions::gate_config() const {
  return GateConfig{.num_experts = num_experts,
                    .k = k,
                    .capacity_factor = capacity_factor,
                    .eval_capacity_factor = eval_capacity_factor,
                    .min_capacity = min_capacity,
                    .noisy_gate_policy = noisy_gate_policy,
                    .drop_tokens = drop_tokens,
                    .use_rts = use_rts,
                    .top2_2nd_expert_sampling = top2_2nd_expert_sampling};
}

void MoEOptions::validate(std::string_view prefix) const {
  if (ep_size < 1) throw ConfigError(fmt::format("{}ep_size: expected >= 1, got {}", prefix, ep_size));
  gate_config().validate(prefix);
  if (num_experts % ep_size != 0) {
    throw ConfigError(fmt::format("{}num_experts: {} experts cannot be spread evenly over {}ep_size = {} ranks; choose "
                                  "num_experts as a multiple of ep_size (e.g. {})",
                                  prefix, num_experts, prefix, ep_size, (num_experts / ep_size + 1) * ep_size));
  }
}

namespace {

const MoEOptions& checked(const MoEOptions& o, const comm::ExpertGroups* groups, int64_t d) {
  o.validate();
  if (d < 1) throw ConfigError(fmt::format("hidden_size: expected >= 1, got {}", d));
  if (groups == nullptr && o.ep_size != 1) {
    throw ConfigError(fmt::format("ep_size: {} needs the expert-parallel groups: pass world.split_groups({}) to "
                                  "moe::MoE (without groups the layer runs on one process, ep_size 1)",
                                  o.ep_size, o.ep_size));
  }
  if (groups != nullptr && groups->ep.size() != o.ep_size) {
    throw ConfigError(fmt::format("ep_size: {} but the groups passed to moe::MoE have an expert-parallel group of {} "
                                  "ranks; pass world.split_groups({}) (the world size must be a multiple of ep_size)",
                                  o.ep_size, groups->ep.size(), o.ep_size));
  }
  return o;
}

// The gate: Linear(d, E) without bias under "gate.wg", DeepSpeed's TopKGate.wg. Runs the Linear only;
// the gating math on its logits lives in gating.cpp.
class TopKGate : public nn::Module {
 public:
  TopKGate(int64_t d, int experts) : wg_(add_child<nn::Linear>("wg", d, experts, /*bias=*/false)) {}
  std::string_view type_name() const override { return "TopKGate"; }

 protected:
  Tensor forward(nn::Context& ctx, const Tensor& x) override { return ctx.forward(wg_, x); }
  Tensor backward(nn::Context& ctx, const Tensor& dy) override { return ctx.backward(wg_, dy); }

 private:
  nn::Linear& wg_;
};

// The experts this rank holds, as children named by global index; MoE runs them one by one.
class ExpertList : public nn::Module {
 public:
  std::string_view type_name() const override { return "Experts"; }
  nn::Module& add(int global_index, std::unique_ptr<nn::Module> expert) {
    nn::Module& ref = *expert;
    adopt_child(std::to_string(global_index), std::move(expert));
    return ref;
  }

 protected:
  Tensor forward(nn::Context&, const Tensor&) override {
    throw ModelError("moe experts run through their MoE layer, not as a module of their own");
  }
  Tensor backward(nn::Context&, const Tensor&) override {
    throw ModelError("moe experts run through their MoE layer, not as a module of their own");
  }
};

std::unique_ptr<nn::Module> make_expert(const ExpertFactory& f) {
  std::unique_ptr<nn::Module> m = f ? f() : nullptr;
  ZS_MODEL_CHECK(m != nullptr, "moe::MoE: the expert factory returned no module; return std::make_unique<YourMlp>(...)");
  return m;
}

void tag_expert(nn::Module& m, int ep_size) {
  m.visit_params([&](nn::Parameter& p) {
    p.add_tag(nn::kTagExpert);
    p.set_expert_parallel_size(ep_size);
  });
}

}  // namespace

// What forward keeps for backward.
struct MoE::Saved {
  Gating gating;
  std::vector<int64_t> row;  // (S, k): the choice's row in the dispatch order, -1 when dropped
  ExchangePlan plan;
  Tensor expert_out;         // (rows sent, d): the experts' outputs in dispatch order
  std::optional<GateNoise> jitter;
  memory::Shape logits_shape;
  Tensor moe_out, mlp_out;   // use_residual: both branches (S, d)
  std::vector<float> coef;   // use_residual: (S, 2) softmax
};

MoE::MoE(int64_t hidden_size, const ExpertFactory& expert, MoEOptions options, const comm::ExpertGroups* groups)
    : d_(hidden_size),
      options_(checked(options, groups, hidden_size)),
      groups_(groups),
      gate_(add_child<TopKGate>("gate", hidden_size, options.num_experts)) {
  const int L = local_experts();
  first_expert_ = groups_ != nullptr ? groups_->ep.rank() * L : 0;
  auto& list = add_child<ExpertList>("experts");
  for (int l = 0; l < L; ++l) {
    nn::Module& e = list.add(first_expert_ + l, make_expert(expert));
    tag_expert(e, options_.ep_size);
    experts_.push_back(&e);
  }
  if (options_.use_residual) {
    auto m = make_expert(expert);
    mlp_ = m.get();
    adopt_child("mlp", std::move(m));
    coefficient_ = &add_child<nn::Linear>("coefficient", hidden_size, 2);
  }
}

MoE::~MoE() = default;

void MoE::clear_own_saved() { saved_.reset(); }

int64_t MoE::first_global_token(const nn::Context& ctx, int64_t tokens) const {
  // Tokens are numbered by sample: sample g's tokens are g * T .. g * T + T - 1 (T tokens per sample),
  // so a token's index is its identity in the global batch stream, whatever the world size, the
  // ep_size or the accumulation setting (nn::BatchPosition, set by the engine per micro-batch).
  const nn::BatchPosition& at = ctx.batch_position();
  if (at.samples < 0) {
    throw UsageError(fmt::format(
        "MoE '{}': its gate draws random numbers (random token selection, noisy gating or top-2 sampling), keyed by "
        "the micro-batch's place in the global batch: the engine sets it; when driving an nn::Context yourself, call "
        "ctx.set_batch_position({{step, first_sample, samples}}) before the forward",
        display_name()));
  }
  if (at.samples == 0 || tokens == 0) return at.first_sample;  // nothing drawn
  ZS_MODEL_CHECK(tokens % at.samples == 0,
                 "MoE '{}': {} tokens for a micro-batch of {} samples; the layer numbers tokens per sample, so each "
                 "sample must bring the same number of tokens (set samples in nn::BatchPosition to the token count to "
                 "number tokens one by one)",
                 display_name(), tokens, at.samples);
  return at.first_sample * (tokens / at.samples);
}

Tensor MoE::forward(nn::Context& ctx, const Tensor& x) {
  ZS_MODEL_CHECK(x.raw() != nullptr || x.numel() == 0, "MoE '{}': undefined input", display_name());
  ZS_MODEL_CHECK(x.dtype() == DType::kF32 && x.is_contiguous() && x.dim() >= 1 && x.size(-1) == d_,
                 "MoE '{}': expected a contiguous fp32 activation (..., {}), got a {} tensor {}", display_name(), d_,
                 memory::dtype_name(x.dtype()), memory::shape_string(x.shape()));
  const bool training = ctx.training();
  const bool computes = ctx.computes();
  const int64_t S = x.numel() / d_;
  const int E = options_.num_experts, k = options_.k;
  const GateConfig gc = options_.gate_config();
  const comm::Group* ep = groups_ != nullptr ? &groups_->ep : nullptr;
  auto saved = std::make_unique<Saved>();

  std::optional<GateNoise> noise;
  if (gc.uses_noise(training)) {
    const std::string key = training ? name() : name() + "/eval";
    noise = GateNoise::keyed(options_.rng_seed, key, static_cast<uint64_t>(ctx.batch_position().step),
                             first_global_token(ctx, S));
  }

  // Gate: logits = jitter(x) W_g^T in fp32.
  Tensor gate_in = x;
  if (training && options_.noisy_gate_policy == NoisyGatePolicy::kJitter) {
    gate_in = ctx.allocate(x.shape(), DType::kF32, MemoryUse::kActivation);
    const float* xp = x.data<float>();
    float* gp = gate_in.data<float>();
    for (int64_t s = 0; s < (computes ? S : 0); ++s)
      for (int64_t j = 0; j < d_; ++j) gp[s * d_ + j] = xp[s * d_ + j] * noise->jitter_factor(s, j, d_);
    saved->jitter = noise;
  }
  Tensor logits = ctx.forward(gate_, gate_in);
  saved->logits_shape = logits.shape();
  AgreeMax agree = [ep](int64_t load) {
    if (ep == nullptr || ep->size() == 1 || !ep->is_mpi()) return load;
    Tensor mine = Tensor::empty({1}, DType::kI32);
    Tensor all = Tensor::empty({ep->size()}, DType::kI32);
    mine.data<int32_t>()[0] = static_cast<int32_t>(load);
    ep->allgather(mine, all);
    return static_cast<int64_t>(*std::max_element(all.data<int32_t>(), all.data<int32_t>() + ep->size()));
  };
  std::span<const float> lg(computes ? logits.data<float>() : nullptr, computes ? static_cast<size_t>(S * E) : 0);
  std::vector<float> zeros;
  if (!computes) {
    // A measuring run (the estimator) has no logits: route token s to experts s, s+1, ... (mod E), a
    // balanced load, so the sizes allocated are those of a well-balanced layer.
    zeros.resize(static_cast<size_t>(S * E));
    for (int64_t s = 0; s < S; ++s)
      for (int e = 0; e < E; ++e) zeros[static_cast<size_t>(s * E + e)] = -static_cast<float>(((e - s) % E + E) % E);
    lg = zeros;
  }
  Gating& g = saved->gating = compute_gating(lg, S, gc, training, noise ? &*noise : nullptr, agree);

  // Dispatch order: by expert, then slot.
  std::vector<int64_t> offset(static_cast<size_t>(E) + 1, 0);
  for (int e = 0; e < E; ++e) offset[static_cast<size_t>(e) + 1] = offset[static_cast<size_t>(e)] + g.kept_counts[static_cast<size_t>(e)];
  std::vector<std::vector<std::pair<int32_t, int64_t>>> by_expert(static_cast<size_t>(E));
  for (int64_t i = 0; i < S * k; ++i)
    if (g.slot[i] >= 0) by_expert[static_cast<size_t>(g.expert[i])].push_back({g.slot[i], i});
  saved->row.assign(static_cast<size_t>(S * k), -1);
  for (int e = 0; e < E; ++e) {
    auto& list = by_expert[static_cast<size_t>(e)];
    std::sort(list.begin(), list.end());
    for (size_t r = 0; r < list.size(); ++r) saved->row[static_cast<size_t>(list[r].second)] = offset[static_cast<size_t>(e)] + static_cast<int64_t>(r);
  }
  const int64_t N = offset.back();
  // kActivation: without expert parallelism the experts take views of these rows as their inputs.
  Tensor send = ctx.allocate({N, d_}, DType::kF32, MemoryUse::kActivation);
  for (int64_t i = 0; i < (computes ? S * k : 0); ++i) {
    const int64_t r = saved->row[static_cast<size_t>(i)];
    if (r >= 0) std::memcpy(send.data<float>() + r * d_, x.data<float>() + (i / k) * d_, static_cast<size_t>(d_) * sizeof(float));
  }

  saved->plan = plan_exchange(ep, g.kept_counts, d_);
  std::vector<Tensor> inputs = to_experts(ctx, ep, saved->plan, send, MemoryUse::kActivation);
  send = {};
  std::vector<Tensor> outputs;
  for (size_t l = 0; l < experts_.size(); ++l) outputs.push_back(ctx.forward(*experts_[l], inputs[l]));
  inputs.clear();
  saved->expert_out = from_experts(ctx, ep, saved->plan, outputs, MemoryUse::kActivation);
  outputs.clear();

  // Combine: y_s = sum over kept choices of weight * expert output.
  Tensor y = ctx.allocate(x.shape(), DType::kF32, MemoryUse::kActivation);
  if (computes) y.zero();
  const float* Y = saved->expert_out.data<float>();
  for (int64_t i = 0; i < (computes ? S * k : 0); ++i) {
    const int64_t r = saved->row[static_cast<size_t>(i)];
    if (r < 0) continue;
    const float w = g.weight[static_cast<size_t>(i)];
    float* out = y.data<float>() + (i / k) * d_;
    for (int64_t j = 0; j < d_; ++j) out[j] += w * Y[r * d_ + j];
  }

  if (options_.use_residual) {
    // PR-MoE: y = moe(x) * c0 + mlp(x) * c1, (c0, c1) = softmax(coefficient(x)).
    Tensor mlp_out = ctx.forward(*mlp_, x);
    Tensor c = ctx.forward(*coefficient_, x);
    saved->coef.resize(static_cast<size_t>(S * 2));
    Tensor mixed = ctx.allocate(x.shape(), DType::kF32, MemoryUse::kActivation);
    for (int64_t s = 0; s < (computes ? S : 0); ++s) {
      const float z0 = c.data<float>()[s * 2], z1 = c.data<float>()[s * 2 + 1];
      const float m = std::max(z0, z1);
      const float e0 = std::exp(z0 - m), e1 = std::exp(z1 - m);
      const float p0 = e0 / (e0 + e1), p1 = e1 / (e0 + e1);
      saved->coef[static_cast<size_t>(s * 2)] = p0;
      saved->coef[static_cast<size_t>(s * 2 + 1)] = p1;
      for (int64_t j = 0; j < d_; ++j)
        mixed.data<float>()[s * d_ + j] = y.data<float>()[s * d_ + j] * p0 + mlp_out.data<float>()[s * d_ + j] * p1;
    }
    saved->moe_out = y;
    saved->mlp_out = mlp_out;
    y = mixed;
  }

  stats_.tokens = S;
  stats_.capacity = g.capacity;
  stats_.dropped = g.dropped();
  stats_.expert_counts = g.exp_counts;
  stats_.l_aux = g.l_aux;
  if (training) {
    saved_ = std::move(saved);
  } else {
    saved_.reset();
  }
  return y;
}

Tensor MoE::backward(nn::Context& ctx, const Tensor& dy) {
  ZS_ASSERT(saved_ != nullptr, "MoE '{}': backward without saved state", display_name());
  if (!aux_grad_set_) {
    throw UsageError(fmt::format(
        "MoE '{}': call set_aux_loss_grad(aux_loss_coef * grad_scale) before each backward (0 when the model does "
        "not add l_aux to its loss), so the gate learns from the load-balancing loss",
        display_name()));
  }
  Saved& sv = *saved_;
  const Gating& g = sv.gating;
  const int64_t S = g.tokens;
  const int E = g.num_experts, k = g.k;
  const comm::Group* ep = groups_ != nullptr ? &groups_->ep : nullptr;
  ZS_MODEL_CHECK(dy.numel() == S * d_ && dy.dtype() == DType::kF32 && dy.is_contiguous(),
                 "MoE '{}' backward: expected a contiguous fp32 gradient of {} elements, got {}", display_name(), S * d_,
                 memory::shape_string(dy.shape()));
  const bool computes = ctx.computes();  // false: a measuring run, allocations only
  const int64_t rows = computes ? S : 0;
  Tensor dx = ctx.allocate(dy.shape(), DType::kF32, MemoryUse::kGradient);
  if (computes) dx.zero();
  float* dxp = dx.data<float>();

  // PR-MoE mixing, then the branches: coefficient, mlp (reverse of forward).
  Tensor d_moe = dy;
  if (options_.use_residual) {
    d_moe = ctx.allocate(dy.shape(), DType::kF32, MemoryUse::kScratch);
    Tensor d_mlp = ctx.allocate(dy.shape(), DType::kF32, MemoryUse::kGradient);
    Tensor d_coef = ctx.allocate({S, 2}, DType::kF32, MemoryUse::kGradient);
    for (int64_t s = 0; s < rows; ++s) {
      const float p0 = sv.coef[static_cast<size_t>(s * 2)], p1 = sv.coef[static_cast<size_t>(s * 2 + 1)];
      float dp0 = 0.0f, dp1 = 0.0f;
      for (int64_t j = 0; j < d_; ++j) {
        const float gj = dy.data<float>()[s * d_ + j];
        d_moe.data<float>()[s * d_ + j] = gj * p0;
        d_mlp.data<float>()[s * d_ + j] = gj * p1;
        dp0 += gj * sv.moe_out.data<float>()[s * d_ + j];
        dp1 += gj * sv.mlp_out.data<float>()[s * d_ + j];
      }
      const float dot = p0 * dp0 + p1 * dp1;
      d_coef.data<float>()[s * 2] = p0 * (dp0 - dot);
      d_coef.data<float>()[s * 2 + 1] = p1 * (dp1 - dot);
    }
    Tensor a = ctx.backward(*coefficient_, d_coef);
    Tensor b = ctx.backward(*mlp_, d_mlp);
    for (int64_t i = 0; i < rows * d_; ++i) dxp[i] += a.data<float>()[i] + b.data<float>()[i];
  }

  // Through the combine: d(weight) and d(expert output rows).
  const int64_t N = sv.plan.rows_sent();
  std::vector<float> dweight(static_cast<size_t>(S * k), 0.0f);
  Tensor d_rows = ctx.allocate({N, d_}, DType::kF32, MemoryUse::kGradient);
  const float* Y = sv.expert_out.data<float>();
  const float* dm = d_moe.data<float>();
  for (int64_t i = 0; i < rows * k; ++i) {
    const int64_t r = sv.row[static_cast<size_t>(i)];
    if (r < 0) continue;
    const float w = g.weight[static_cast<size_t>(i)];
    const float* grad = dm + (i / k) * d_;
    float dot = 0.0f;
    for (int64_t j = 0; j < d_; ++j) {
      dot += grad[j] * Y[r * d_ + j];
      d_rows.data<float>()[r * d_ + j] = w * grad[j];
    }
    dweight[static_cast<size_t>(i)] = dot;
  }
  sv.expert_out = {};

  // Experts, in reverse order, behind the same two all-to-alls as forward.
  std::vector<Tensor> grads = to_experts(ctx, ep, sv.plan, d_rows, MemoryUse::kGradient);
  d_rows = {};
  std::vector<Tensor> dins(experts_.size());
  for (size_t l = experts_.size(); l-- > 0;) dins[l] = ctx.backward(*experts_[l], grads[l]);
  grads.clear();
  Tensor d_in_rows = from_experts(ctx, ep, sv.plan, dins, MemoryUse::kScratch);
  dins.clear();
  for (int64_t i = 0; i < rows * k; ++i) {
    const int64_t r = sv.row[static_cast<size_t>(i)];
    if (r < 0) continue;
    float* out = dxp + (i / k) * d_;
    for (int64_t j = 0; j < d_; ++j) out[j] += d_in_rows.data<float>()[r * d_ + j];
  }

  // Gate: weights and l_aux -> logits -> gate input (-> x through the jitter factor).
  Tensor dlogits = ctx.allocate(sv.logits_shape, DType::kF32, MemoryUse::kGradient);
  if (computes) gating_backward(g, dweight, aux_grad_, std::span<float>(dlogits.data<float>(), static_cast<size_t>(S * E)));
  Tensor dgate = ctx.backward(gate_, dlogits);
  for (int64_t s = 0; s < rows; ++s) {
    for (int64_t j = 0; j < d_; ++j) {
      const float f = sv.jitter ? sv.jitter->jitter_factor(s, j, d_) : 1.0f;
      dxp[s * d_ + j] += dgate.data<float>()[s * d_ + j] * f;
    }
  }

  saved_.reset();
  aux_grad_set_ = false;
  return dx;
}

}  // namespace zs::moe
