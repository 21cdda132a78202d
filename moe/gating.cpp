#include "moe/gating.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/errors.h"

namespace zs::moe {

NoisyGatePolicy parse_noisy_gate_policy(std::string_view text, std::string_view key) {
  if (text.empty() || text == "None") return NoisyGatePolicy::kNone;
  if (text == "Jitter") return NoisyGatePolicy::kJitter;
  if (text == "RSample") return NoisyGatePolicy::kRSample;
  throw ConfigError(fmt::format("{}: unknown noisy gate policy '{}'; expected \"None\", \"Jitter\" or \"RSample\" "
                                "(DeepSpeed's spelling)",
                                key, text));
}

std::string_view noisy_gate_policy_name(NoisyGatePolicy p) {
  switch (p) {
    case NoisyGatePolicy::kNone: return "None";
    case NoisyGatePolicy::kJitter: return "Jitter";
    case NoisyGatePolicy::kRSample: return "RSample";
  }
  return "None";
}

void GateConfig::validate(std::string_view prefix) const {
  if (num_experts < 1) throw ConfigError(fmt::format("{}num_experts: expected >= 1, got {}", prefix, num_experts));
  if (k < 1 || k > num_experts) {
    throw ConfigError(fmt::format("{}k: expected 1..num_experts ({}), got {}; each token picks k distinct experts",
                                  prefix, num_experts, k));
  }
  if (!(capacity_factor > 0.0) || !std::isfinite(capacity_factor)) {
    throw ConfigError(fmt::format("{}capacity_factor: expected a positive number, got {}", prefix, capacity_factor));
  }
  if (!(eval_capacity_factor > 0.0) || !std::isfinite(eval_capacity_factor)) {
    throw ConfigError(
        fmt::format("{}eval_capacity_factor: expected a positive number, got {}", prefix, eval_capacity_factor));
  }
  if (min_capacity < 0) throw ConfigError(fmt::format("{}min_capacity: expected >= 0, got {}", prefix, min_capacity));
}

bool GateConfig::uses_noise(bool training) const {
  if (training && noisy_gate_policy == NoisyGatePolicy::kJitter) return true;
  if (k == 1) return use_rts || (training && noisy_gate_policy == NoisyGatePolicy::kRSample);
  return k == 2 && top2_2nd_expert_sampling;
}

// ---- noise ----

namespace {
uint64_t step_seed(uint64_t seed, uint64_t step) { return splitmix64(seed ^ splitmix64(step)); }
std::string stream_name(std::string_view layer, std::string_view purpose) {
  return fmt::format("{}/moe.{}", layer, purpose);
}
}  // namespace

GateNoise::GateNoise(uint64_t seed, std::string_view layer, uint64_t step, int64_t first_token)
    : rts_(step_seed(seed, step), stream_name(layer, "rts")),
      gumbel_(step_seed(seed, step), stream_name(layer, "gumbel")),
      jitter_(step_seed(seed, step), stream_name(layer, "jitter")),
      first_token_(first_token) {}

GateNoise GateNoise::keyed(uint64_t seed, std::string_view layer, uint64_t step, int64_t first_token) {
  return GateNoise(seed, layer, step, first_token);
}

float GateNoise::rts(int64_t s, int e, int num_experts) const {
  return rts_.uniform(static_cast<uint64_t>((first_token_ + s) * num_experts + e));
}

float GateNoise::gumbel(int64_t s, int e, int num_experts) const {
  // uniform() is in [0, 1) on a 2^-24 grid; the midpoint keeps u in (0, 1) so both logs are finite.
  const float u = gumbel_.uniform(static_cast<uint64_t>((first_token_ + s) * num_experts + e)) + 0x1p-25f;
  return -std::log(-std::log(u));
}

float GateNoise::jitter_factor(int64_t s, int64_t j, int64_t features) const {
  constexpr float kEps = 1e-2f;  // DeepSpeed's multiplicative_jitter epsilon
  return jitter_.uniform(static_cast<uint64_t>((first_token_ + s) * features + j), 1.0f - kEps, 1.0f + kEps);
}

int64_t Gating::dropped() const {
  int64_t n = 0;
  for (size_t i = 0; i < slot.size(); ++i) n += expert[i] >= 0 && slot[i] < 0 ? 1 : 0;
  return n;
}

// ---- forward ----

namespace {

int64_t configured_capacity(int64_t tokens, int experts, double factor, int k, int min_capacity) {
  // DeepSpeed: ceil((num_tokens / num_experts) * torch.tensor(capacity_factor * k)), a float32 product.
  const float per_expert = static_cast<float>(static_cast<double>(tokens) / static_cast<double>(experts));
  const float product = per_expert * static_cast<float>(factor * k);
  const auto c = static_cast<int64_t>(std::ceil(product));
  return std::max<int64_t>(c, min_capacity);
}

int argmax_row(const float* v, int n, int skip = -1) {
  int best = -1;
  for (int e = 0; e < n; ++e) {
    if (e == skip) continue;
    if (best < 0 || v[e] > v[best]) best = e;
  }
  return best;
}

// For every expert, keeps at most `capacity` of the choices routed to it: those with the largest
// score (ties to the lower token), or the first by position when score is null. Marks the others
// dropped (slot -1) and numbers the kept ones 0, 1, ... in position order.
void keep_by_score(Gating& g, const std::function<float(int64_t s, int j)>* score, int64_t capacity) {
  const int64_t S = g.tokens;
  const int k = g.k;
  std::vector<std::vector<int64_t>> routed(static_cast<size_t>(g.num_experts));  // choice indices s * k + j
  for (int64_t i = 0; i < S * k; ++i) routed[static_cast<size_t>(g.expert[i])].push_back(i);
  for (auto& list : routed) {
    if (static_cast<int64_t>(list.size()) > capacity && score != nullptr) {
      std::vector<int64_t> by_score = list;
      std::stable_sort(by_score.begin(), by_score.end(), [&](int64_t a, int64_t b) {
        return (*score)(a / k, static_cast<int>(a % k)) > (*score)(b / k, static_cast<int>(b % k));
      });
      std::vector<char> keep(static_cast<size_t>(S * k), 0);
      for (int64_t i = 0; i < capacity; ++i) keep[static_cast<size_t>(by_score[static_cast<size_t>(i)])] = 1;
      std::erase_if(list, [&](int64_t i) { return !keep[static_cast<size_t>(i)]; });
    } else if (static_cast<int64_t>(list.size()) > capacity) {
      list.resize(static_cast<size_t>(capacity));
    }
    int32_t next = 0;
    for (int64_t i : list) g.slot[static_cast<size_t>(i)] = next++;
  }
}

void softmax_rows(std::span<const float> logits, int64_t S, int E, std::vector<float>& out) {
  out.resize(static_cast<size_t>(S * E));
  for (int64_t s = 0; s < S; ++s) {
    const float* z = logits.data() + s * E;
    float* p = out.data() + s * E;
    float m = z[0];
    for (int e = 1; e < E; ++e) m = std::max(m, z[e]);
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(z[e] - m));
    for (int e = 0; e < E; ++e) p[e] /= sum;
  }
}

}  // namespace

Gating compute_gating(std::span<const float> logits, int64_t S, const GateConfig& cfg, bool training,
                      const GateNoise* noise, const AgreeMax& agree_max) {
  const int E = cfg.num_experts;
  const int k = cfg.k;
  ZS_ASSERT(static_cast<int64_t>(logits.size()) == S * E, "gating: {} logits for {} tokens of {} experts", logits.size(),
            S, E);
  ZS_ASSERT(noise != nullptr || !cfg.uses_noise(training), "gating: this configuration draws noise but got none");
  Gating g;
  g.tokens = S;
  g.num_experts = E;
  g.k = k;
  g.expert.assign(static_cast<size_t>(S * k), -1);
  g.slot.assign(static_cast<size_t>(S * k), -1);
  g.weight.assign(static_cast<size_t>(S * k), 0.0f);
  g.ce.assign(static_cast<size_t>(E), 0.0f);
  g.exp_counts.assign(static_cast<size_t>(E), 0);
  g.kept_counts.assign(static_cast<size_t>(E), 0);
  softmax_rows(logits, S, E, g.gates);
  const float* gates = g.gates.data();

  // Choices.
  std::vector<float> row(static_cast<size_t>(E));
  std::vector<int> order(static_cast<size_t>(E));
  for (int64_t s = 0; s < S; ++s) {
    const float* p = gates + s * E;
    const float* z = logits.data() + s * E;
    int32_t* ex = g.expert.data() + s * k;
    if (k == 1) {
      if (training && cfg.noisy_gate_policy == NoisyGatePolicy::kRSample) {
        for (int e = 0; e < E; ++e) row[static_cast<size_t>(e)] = z[e] + noise->gumbel(s, e, E);
        ex[0] = argmax_row(row.data(), E);
      } else {
        ex[0] = argmax_row(p, E);
      }
    } else if (k == 2) {
      ex[0] = argmax_row(p, E);
      for (int e = 0; e < E; ++e) row[static_cast<size_t>(e)] = z[e] + (cfg.top2_2nd_expert_sampling ? noise->gumbel(s, e, E) : 0.0f);
      ex[1] = argmax_row(row.data(), E, ex[0]);
    } else {
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
      for (int j = 0; j < k; ++j) ex[j] = order[static_cast<size_t>(j)];
    }
    for (int j = 0; j < k; ++j) ++g.exp_counts[static_cast<size_t>(ex[j])];
  }

  // Load-balancing loss: ce counts first choices for k <= 2, all k choices for k > 2.
  if (S > 0) {
    std::vector<double> me(static_cast<size_t>(E), 0.0);
    for (int64_t s = 0; s < S; ++s)
      for (int e = 0; e < E; ++e) me[static_cast<size_t>(e)] += gates[s * E + e];
    for (int64_t s = 0; s < S; ++s) {
      for (int j = 0; j < (k <= 2 ? 1 : k); ++j) g.ce[static_cast<size_t>(g.expert[s * k + j])] += 1.0f;
    }
    // top-1: sum(me*ce)*E; top-2: mean(me*ce)*E^2 = sum(me*ce)*E; top-k: mean(me*ce)*E^2/k.
    g.aux_scale = k <= 2 ? static_cast<float>(E) : static_cast<float>(E) / static_cast<float>(k);
    double sum = 0.0;
    for (int e = 0; e < E; ++e) {
      g.ce[static_cast<size_t>(e)] /= static_cast<float>(S);
      sum += me[static_cast<size_t>(e)] / static_cast<double>(S) * g.ce[static_cast<size_t>(e)];
    }
    g.l_aux = static_cast<float>(sum * g.aux_scale);
  }

  // Capacity and slots.
  const bool drop = cfg.drop_tokens;
  if (!drop) {
    int64_t load = 0;
    for (int64_t c : g.exp_counts) load = std::max(load, c);
    g.capacity = agree_max ? agree_max(load) : load;
    if (k == 1) g.capacity = std::min(g.capacity, S);
  } else {
    const double factor = training ? cfg.capacity_factor : cfg.eval_capacity_factor;
    g.capacity = configured_capacity(S, E, factor, k, cfg.min_capacity);
  }
  const int64_t limit = drop ? g.capacity : std::numeric_limits<int64_t>::max();
  if (k == 1) {
    std::function<float(int64_t, int)> rts = [&](int64_t s, int) { return noise->rts(s, g.expert[s], E); };
    keep_by_score(g, drop && cfg.use_rts ? &rts : nullptr, limit);
  } else if (k == 2) {
    // Position order among an expert's first choices, then its second choices from slot count1[e] on
    // (count1 before dropping, as DeepSpeed's locations2 += sum(mask1)); slots past capacity drop.
    std::vector<int64_t> first(static_cast<size_t>(E), 0), second(static_cast<size_t>(E), 0);
    for (int64_t s = 0; s < S; ++s) {
      const int64_t l1 = first[static_cast<size_t>(g.expert[s * 2])]++;
      g.slot[s * 2] = l1 < limit ? static_cast<int32_t>(l1) : -1;
    }
    for (int64_t s = 0; s < S; ++s) {
      const auto e2 = static_cast<size_t>(g.expert[s * 2 + 1]);
      const int64_t l2 = first[e2] + second[e2]++;
      g.slot[s * 2 + 1] = l2 < limit ? static_cast<int32_t>(l2) : -1;
    }
  } else {
    std::function<float(int64_t, int)> prob = [&](int64_t s, int j) { return gates[s * E + g.expert[s * k + j]]; };
    keep_by_score(g, &prob, limit);
  }

  // Combine weights.
  for (int64_t s = 0; s < S; ++s) {
    if (k == 1) {
      if (g.slot[s] >= 0) g.weight[s] = gates[s * E + g.expert[s]];
      continue;
    }
    float denom = 0.0f;
    for (int j = 0; j < k; ++j)
      if (g.slot[s * k + j] >= 0) denom += gates[s * E + g.expert[s * k + j]];
    denom = std::max(denom, std::numeric_limits<float>::epsilon());
    for (int j = 0; j < k; ++j)
      if (g.slot[s * k + j] >= 0) g.weight[s * k + j] = gates[s * E + g.expert[s * k + j]] / denom;
  }
  for (int64_t i = 0; i < S * k; ++i)
    if (g.slot[i] >= 0) ++g.kept_counts[static_cast<size_t>(g.expert[i])];
  return g;
}

// ---- backward ----

void gating_backward(const Gating& g, std::span<const float> dweight, float dl_aux, std::span<float> dlogits) {
  const int64_t S = g.tokens;
  const int E = g.num_experts;
  const int k = g.k;
  ZS_ASSERT(static_cast<int64_t>(dweight.size()) == S * k && static_cast<int64_t>(dlogits.size()) == S * E,
            "gating backward: {} weight grads and {} logit grads for {} tokens", dweight.size(), dlogits.size(), S);
  std::vector<float> dg(static_cast<size_t>(E));
  for (int64_t s = 0; s < S; ++s) {
    const float* p = g.gates.data() + s * E;
    // d(l_aux)/d(gates[s, e]) = aux_scale * ce_e / S.
    for (int e = 0; e < E; ++e)
      dg[static_cast<size_t>(e)] = dl_aux * g.aux_scale * g.ce[static_cast<size_t>(e)] / static_cast<float>(S);
    if (k == 1) {
      if (g.slot[s] >= 0) dg[static_cast<size_t>(g.expert[s])] += dweight[s];
    } else {
      // w_i = p_i / D over the kept choices, D = max(sum kept p, eps): dw_i/dp_j = (delta_ij - w_i) / D,
      // or delta_ij / eps where the clamp is active (its gradient does not pass the sum).
      float sum = 0.0f, wdw = 0.0f;
      for (int j = 0; j < k; ++j) {
        const int64_t i = s * k + j;
        if (g.slot[i] < 0) continue;
        sum += p[g.expert[i]];
        wdw += g.weight[i] * dweight[i];
      }
      const float eps = std::numeric_limits<float>::epsilon();
      const bool clamped = !(sum > eps);
      const float denom = clamped ? eps : sum;
      for (int j = 0; j < k; ++j) {
        const int64_t i = s * k + j;
        if (g.slot[i] < 0) continue;
        dg[static_cast<size_t>(g.expert[i])] += (dweight[i] - (clamped ? 0.0f : wdw)) / denom;
      }
    }
    // Softmax backward: dz_e = p_e (dg_e - sum_j p_j dg_j).
    float dot = 0.0f;
    for (int e = 0; e < E; ++e) dot += p[e] * dg[static_cast<size_t>(e)];
    for (int e = 0; e < E; ++e) dlogits[s * E + e] = p[e] * (dg[static_cast<size_t>(e)] - dot);
  }
}

}  // namespace zs::moe
