// Top-k gating of a Mixture-of-Experts layer, as DeepSpeed computes it (deepspeed/moe/sharded_moe.py:
// top1gating, top2gating, topkgating), on the logits of one rank's tokens.
//
//   moe::GateConfig cfg{.num_experts = 8, .k = 2};
//   moe::GateNoise noise = moe::GateNoise::keyed(seed, "blocks.3.mlp", step, first_global_token);
//   moe::Gating g = moe::compute_gating(logits, tokens, cfg, /*training=*/true, &noise, agree_max);
//   // g.slot[s * k + j] >= 0: token s goes to expert g.expert[s * k + j] at that slot, weighted g.weight[...]
//   moe::gating_backward(g, dweight, dl_aux, dlogits);   // dlogits = d(loss)/d(logits)
//
// Semantics (S tokens, E experts, gates = softmax(logits) per token, all fp32):
//   - capacity = ceil(S / E * capacity_factor * k) (eval: eval_capacity_factor), at least min_capacity;
//     the product is rounded to fp32 before ceil, as DeepSpeed's float32 tensor arithmetic does.
//   - k = 1: expert = argmax(gates) (RSample: argmax(logits + Gumbel noise), training only). An expert
//     with more than `capacity` tokens keeps `capacity` of them: with use_rts those with the largest
//     uniform draw, else the first by position (DeepSpeed's topk over a 0/1 mask leaves the choice to
//     the backend; position order is its deterministic reading). weight = gates[s, e] (unnormalised).
//     l_aux = sum_e(me_e * ce_e) * E, me = mean gates, ce = fraction of tokens whose first choice is e.
//   - k = 2: first = argmax(gates); second = argmax over the other experts of logits (+ Gumbel noise when
//     top2_2nd_expert_sampling, in training and eval alike, as DeepSpeed). Slots: position order among
//     an expert's first choices, then its second choices from slot count1[e] on (the second expert's
//     slots are offset by the first's counts); a slot >= capacity is dropped. Kept weights are
//     normalised by max(sum of the token's kept gates, fp32 eps). l_aux = mean_e(me_e * ce_e) * E^2.
//   - k > 2: the k largest gates; an expert over capacity keeps its `capacity` tokens of largest gate
//     (DeepSpeed's drop_policy "probs"; ties to the lower position); slots in position order among the
//     kept; weights normalised as for k = 2. l_aux = mean_e(me_e * ce_e) * E^2 / k, ce from all k choices.
//   - drop_tokens = false: nothing is dropped and capacity = the largest expert load (count of routed
//     choices), agreed by `agree_max` (the MoE layer passes an allreduce MAX over its expert-parallel
//     group), and for k = 1 at most S.
//   - Jitter (noisy_gate_policy, training only) multiplies the gate's input, not the logits: the MoE
//     layer applies it (jitter_factor below) before the gate's Linear.
// S = 0 is allowed (a rank with no tokens): nothing is routed and l_aux = 0.
//
// Random numbers (GateNoise) are counter-based (core/rng.h): the draw for token s and expert e is
// element (first_token + s) * E + e of a stream keyed by (seed, layer name, purpose, step), so a token's
// draws depend on its global index, not on which rank holds it or how many ranks there are.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/rng.h"

namespace zs::moe {

enum class NoisyGatePolicy : uint8_t { kNone, kJitter, kRSample };

// "None" (or ""), "Jitter", "RSample", as DeepSpeed spells them; anything else is a ConfigError that
// names `key` and the accepted values.
NoisyGatePolicy parse_noisy_gate_policy(std::string_view text, std::string_view key = "noisy_gate_policy");
std::string_view noisy_gate_policy_name(NoisyGatePolicy p);

struct GateConfig {
  int num_experts = 1;
  int k = 1;
  double capacity_factor = 1.0;
  double eval_capacity_factor = 1.0;
  int min_capacity = 4;
  NoisyGatePolicy noisy_gate_policy = NoisyGatePolicy::kNone;
  bool drop_tokens = true;
  bool use_rts = true;
  bool top2_2nd_expert_sampling = true;

  // ConfigError naming the key (prefixed by `prefix`, e.g. "model.moe.") for a value out of range.
  void validate(std::string_view prefix = "") const;
  // True when a gating call in this mode draws random numbers (then it needs a GateNoise).
  bool uses_noise(bool training) const;
};

// The random streams of one gating call (see the file comment).
class GateNoise {
 public:
  // `layer` names the MoE layer (its module path); `step` is the optimizer step (or the evaluation
  // batch's index, under another layer name); `first_token` is the global index of this rank's first
  // token in that step (moe::MoE numbers tokens by sample: nn::BatchPosition).
  static GateNoise keyed(uint64_t seed, std::string_view layer, uint64_t step, int64_t first_token);

  // Uniform in [0, 1) for (token s, expert e): random token selection.
  float rts(int64_t s, int e, int num_experts) const;
  // Standard Gumbel for (token s, expert e): RSample and top-2 second-expert sampling.
  float gumbel(int64_t s, int e, int num_experts) const;
  // Uniform in [1 - 1e-2, 1 + 1e-2) for (token s, feature j): the Jitter policy's input factor.
  float jitter_factor(int64_t s, int64_t j, int64_t features) const;

 private:
  GateNoise(uint64_t seed, std::string_view layer, uint64_t step, int64_t first_token);
  CounterRng rts_, gumbel_, jitter_;
  int64_t first_token_;
};

// One gating call's decisions, kept for the backward.
struct Gating {
  int64_t tokens = 0;    // S
  int num_experts = 0;   // E
  int k = 1;
  int64_t capacity = 0;  // slots per expert (the agreed maximum load when drop_tokens is false)
  // (S, k), choice j of token s at s * k + j: expert index, slot in that expert's buffer (-1: dropped)
  // and combine weight (0 when dropped).
  std::vector<int32_t> expert;
  std::vector<int32_t> slot;
  std::vector<float> weight;
  std::vector<float> gates;           // (S, E) softmax of the logits
  std::vector<float> ce;              // (E) the l_aux's fraction of routed choices per expert
  std::vector<int64_t> exp_counts;    // (E) choices routed to each expert before capacity (DeepSpeed's exp_counts)
  std::vector<int64_t> kept_counts;   // (E) choices kept (each expert's filled slots)
  float l_aux = 0.0f;
  float aux_scale = 0.0f;             // l_aux = aux_scale * sum_e(me_e * ce_e)

  int64_t dropped() const;            // routed choices that were dropped
};

// Max of `local` over the expert-parallel group (identity on one rank).
using AgreeMax = std::function<int64_t(int64_t local)>;

// logits: (S, E) fp32. noise: required when cfg.uses_noise(training). agree_max: used when
// drop_tokens is false (nullptr: this rank alone).
Gating compute_gating(std::span<const float> logits, int64_t tokens, const GateConfig& cfg, bool training,
                      const GateNoise* noise, const AgreeMax& agree_max = nullptr);

// dlogits (S, E) = d(loss)/d(logits) given dweight (S, k) = d(loss)/d(weight) (entries of dropped
// choices are ignored) and dl_aux = d(loss)/d(l_aux). Overwrites dlogits.
void gating_backward(const Gating& g, std::span<const float> dweight, float dl_aux, std::span<float> dlogits);

}  // namespace zs::moe
