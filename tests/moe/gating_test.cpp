// moe::compute_gating against a reference written the way DeepSpeed's sharded_moe.py computes it:
// dense one-hot masks, cumulative sums for slots, column sums for counts; plus hand-worked cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/errors.h"
#include "core/rng.h"
#include "moe/gating.h"

namespace zs::moe {
namespace {

struct Ref {
  int64_t capacity = 0;
  std::vector<int> expert, slot;  // (S, k)
  std::vector<float> weight;      // (S, k)
  std::vector<int64_t> counts;    // routed before capacity
  double l_aux = 0;
};

using Mask = std::vector<std::vector<int>>;  // [s][e] in {0, 1}

std::vector<float> softmax(const std::vector<float>& z, int64_t S, int E) {
  std::vector<float> p(z.size());
  for (int64_t s = 0; s < S; ++s) {
    float m = -std::numeric_limits<float>::infinity();
    for (int e = 0; e < E; ++e) m = std::max(m, z[s * E + e]);
    float sum = 0;
    for (int e = 0; e < E; ++e) sum += p[s * E + e] = std::exp(z[s * E + e] - m);
    for (int e = 0; e < E; ++e) p[s * E + e] /= sum;
  }
  return p;
}

int argmax(const float* v, int n) { return static_cast<int>(std::max_element(v, v + n) - v); }

Mask one_hot(const std::vector<int>& idx, int E) {
  Mask m(idx.size(), std::vector<int>(static_cast<size_t>(E), 0));
  for (size_t s = 0; s < idx.size(); ++s) m[s][static_cast<size_t>(idx[s])] = 1;
  return m;
}

// locations = cumsum(mask, dim=0) - 1
Mask cumsum_minus_one(const Mask& m) {
  Mask out = m;
  const size_t E = m.empty() ? 0 : m[0].size();
  for (size_t e = 0; e < E; ++e) {
    int run = 0;
    for (size_t s = 0; s < m.size(); ++s) out[s][e] = (run += m[s][e]) - 1;
  }
  return out;
}

int64_t capacity_of(int64_t S, int E, double f, int k, int minc) {
  const float c = static_cast<float>(static_cast<double>(S) / E) * static_cast<float>(f * k);
  return std::max<int64_t>(static_cast<int64_t>(std::ceil(c)), minc);
}

// Keeps per expert the `cap` rows of highest score (ties: lower row).
void keep_top(Mask& mask, const std::vector<std::vector<float>>& score, int64_t cap) {
  const size_t S = mask.size(), E = S ? mask[0].size() : 0;
  for (size_t e = 0; e < E; ++e) {
    std::vector<size_t> rows;
    for (size_t s = 0; s < S; ++s) rows.push_back(s);
    std::stable_sort(rows.begin(), rows.end(), [&](size_t a, size_t b) {
      const float sa = mask[a][e] ? score[a][e] : -1.0f, sb = mask[b][e] ? score[b][e] : -1.0f;
      return sa > sb;
    });
    for (size_t i = static_cast<size_t>(std::min<int64_t>(cap, static_cast<int64_t>(S))); i < S; ++i) mask[rows[i]][e] = 0;
  }
}

Ref reference(const std::vector<float>& logits, int64_t S, const GateConfig& c, bool training, const GateNoise* noise) {
  const int E = c.num_experts, k = c.k;
  Ref r;
  auto gates = softmax(logits, S, E);
  r.expert.assign(static_cast<size_t>(S * k), -1);
  r.slot.assign(static_cast<size_t>(S * k), -1);
  r.weight.assign(static_cast<size_t>(S * k), 0.0f);
  std::vector<double> me(E, 0.0), ce(E, 0.0);
  for (int64_t s = 0; s < S; ++s)
    for (int e = 0; e < E; ++e) me[e] += gates[s * E + e] / S;
  const double f = training ? c.capacity_factor : c.eval_capacity_factor;
  if (k == 1) {
    std::vector<int> idx(S);
    for (int64_t s = 0; s < S; ++s) {
      std::vector<float> v(gates.begin() + s * E, gates.begin() + (s + 1) * E);
      if (training && c.noisy_gate_policy == NoisyGatePolicy::kRSample)
        for (int e = 0; e < E; ++e) v[e] = logits[s * E + e] + noise->gumbel(s, e, E);
      idx[s] = argmax(v.data(), E);
    }
    Mask m1 = one_hot(idx, E);
    r.counts.assign(E, 0);
    for (int64_t s = 0; s < S; ++s)
      for (int e = 0; e < E; ++e) r.counts[e] += m1[s][e], ce[e] += m1[s][e] / double(S);
    for (int e = 0; e < E; ++e) r.l_aux += me[e] * ce[e] * E;
    if (c.drop_tokens) {
      r.capacity = capacity_of(S, E, f, 1, c.min_capacity);
      std::vector<std::vector<float>> score(S, std::vector<float>(E));
      for (int64_t s = 0; s < S; ++s)
        for (int e = 0; e < E; ++e) score[s][e] = c.use_rts ? noise->rts(s, e, E) : float(S - s);  // else by position
      keep_top(m1, score, r.capacity);
    } else {
      r.capacity = std::min<int64_t>(*std::max_element(r.counts.begin(), r.counts.end()), S);
    }
    Mask loc = cumsum_minus_one(m1);
    for (int64_t s = 0; s < S; ++s) {
      r.expert[s] = idx[s];
      if (m1[s][idx[s]]) r.slot[s] = loc[s][idx[s]], r.weight[s] = gates[s * E + idx[s]];
    }
    return r;
  }
  if (k == 2) {
    std::vector<int> i1(S), i2(S);
    for (int64_t s = 0; s < S; ++s) {
      i1[s] = argmax(gates.data() + s * E, E);
      std::vector<float> z(logits.begin() + s * E, logits.begin() + (s + 1) * E);
      if (c.top2_2nd_expert_sampling)
        for (int e = 0; e < E; ++e) z[e] += noise->gumbel(s, e, E);
      z[i1[s]] = -std::numeric_limits<float>::infinity();
      i2[s] = argmax(z.data(), E);
    }
    Mask m1 = one_hot(i1, E), m2 = one_hot(i2, E);
    Mask l1 = cumsum_minus_one(m1), l2 = cumsum_minus_one(m2);
    std::vector<int> first(E, 0);
    for (int64_t s = 0; s < S; ++s)
      for (int e = 0; e < E; ++e) first[e] += m1[s][e];
    for (int64_t s = 0; s < S; ++s)
      for (int e = 0; e < E; ++e) l2[s][e] += first[e];
    r.counts.assign(E, 0);
    for (int64_t s = 0; s < S; ++s)
      for (int e = 0; e < E; ++e) r.counts[e] += m1[s][e] + m2[s][e], ce[e] += m1[s][e] / double(S);
    double mean = 0;
    for (int e = 0; e < E; ++e) mean += me[e] * ce[e] / E;
    r.l_aux = mean * E * E;
    r.capacity = c.drop_tokens ? capacity_of(S, E, f, 2, c.min_capacity)
                               : *std::max_element(r.counts.begin(), r.counts.end());
    for (int64_t s = 0; s < S; ++s) {
      const bool keep1 = l1[s][i1[s]] < r.capacity, keep2 = l2[s][i2[s]] < r.capacity;
      const float g1 = keep1 ? gates[s * E + i1[s]] : 0.0f, g2 = keep2 ? gates[s * E + i2[s]] : 0.0f;
      const float denom = std::max(g1 + g2, std::numeric_limits<float>::epsilon());
      r.expert[s * 2] = i1[s];
      r.expert[s * 2 + 1] = i2[s];
      if (keep1) r.slot[s * 2] = l1[s][i1[s]], r.weight[s * 2] = g1 / denom;
      if (keep2) r.slot[s * 2 + 1] = l2[s][i2[s]], r.weight[s * 2 + 1] = g2 / denom;
    }
    return r;
  }
  // top-k
  Mask mask(S, std::vector<int>(E, 0));
  for (int64_t s = 0; s < S; ++s) {
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return gates[s * E + a] > gates[s * E + b]; });
    for (int j = 0; j < k; ++j) mask[s][order[j]] = 1, r.expert[s * k + j] = order[j];
  }
  r.counts.assign(E, 0);
  for (int64_t s = 0; s < S; ++s)
    for (int e = 0; e < E; ++e) r.counts[e] += mask[s][e], ce[e] += mask[s][e] / double(S);
  double mean = 0;
  for (int e = 0; e < E; ++e) mean += me[e] * ce[e] / E;
  r.l_aux = mean * E * E / k;
  if (c.drop_tokens) {
    r.capacity = capacity_of(S, E, f, k, c.min_capacity);
    std::vector<std::vector<float>> score(S, std::vector<float>(E));
    for (int64_t s = 0; s < S; ++s)
      for (int e = 0; e < E; ++e) score[s][e] = gates[s * E + e];
    keep_top(mask, score, r.capacity);
  } else {
    r.capacity = *std::max_element(r.counts.begin(), r.counts.end());
  }
  Mask loc = cumsum_minus_one(mask);
  for (int64_t s = 0; s < S; ++s) {
    float denom = 0;
    for (int e = 0; e < E; ++e) denom += mask[s][e] * gates[s * E + e];
    denom = std::max(denom, std::numeric_limits<float>::epsilon());
    for (int j = 0; j < k; ++j) {
      const int e = r.expert[s * k + j];
      if (mask[s][e]) r.slot[s * k + j] = loc[s][e], r.weight[s * k + j] = gates[s * E + e] / denom;
    }
  }
  return r;
}

std::vector<float> random_logits(int64_t S, int E, uint64_t seed, float scale = 2.0f) {
  CounterRng rng(seed, "gating_test");
  std::vector<float> z(static_cast<size_t>(S * E));
  for (size_t i = 0; i < z.size(); ++i) z[i] = scale * rng.normal(i);
  return z;
}

void expect_matches(const Gating& g, const Ref& r, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(g.capacity, r.capacity);
  ASSERT_EQ(g.expert.size(), r.expert.size());
  for (size_t i = 0; i < g.expert.size(); ++i) {
    ASSERT_EQ(g.expert[i], r.expert[i]) << "choice " << i;
    ASSERT_EQ(g.slot[i], r.slot[i]) << "choice " << i;
    ASSERT_NEAR(g.weight[i], r.weight[i], 1e-6) << "choice " << i;
  }
  EXPECT_EQ(g.exp_counts, r.counts);
  EXPECT_NEAR(g.l_aux, r.l_aux, 1e-5 * std::max(1.0, r.l_aux));
}

TEST(Gating, MatchesReferenceOverConfigurations) {
  int cases = 0;
  for (int k : {1, 2, 3}) {
    for (int E : {4, 6}) {
      for (int64_t S : {int64_t{5}, int64_t{24}, int64_t{64}}) {
        for (double cf : {0.5, 1.0, 2.0}) {
          for (bool drop : {true, false}) {
            for (bool rts : {true, false}) {
              for (bool training : {true, false}) {
                for (auto policy : {NoisyGatePolicy::kNone, NoisyGatePolicy::kRSample}) {
                  GateConfig c{.num_experts = E, .k = k, .capacity_factor = cf, .eval_capacity_factor = cf * 1.5,
                               .min_capacity = 2, .noisy_gate_policy = policy, .drop_tokens = drop, .use_rts = rts,
                               .top2_2nd_expert_sampling = rts};
                  auto logits = random_logits(S, E, static_cast<uint64_t>(cases));
                  GateNoise noise = GateNoise::keyed(7, "blocks.0.moe", static_cast<uint64_t>(cases), 100);
                  Gating g = compute_gating(logits, S, c, training, &noise);
                  expect_matches(g, reference(logits, S, c, training, &noise),
                                 fmt::format("k {} E {} S {} cf {} drop {} rts {} training {}", k, E, S, cf, drop, rts,
                                             training));
                  ++cases;
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 400);
}

TEST(Gating, TopOneCapacityDropsAndRandomSelection) {
  // 8 tokens, 2 experts, all prefer expert 0: capacity ceil(8/2 * 1) = 4 keeps 4 of them.
  const int64_t S = 8;
  std::vector<float> logits;
  for (int64_t s = 0; s < S; ++s) logits.insert(logits.end(), {1.0f + 0.1f * s, 0.0f});
  GateConfig c{.num_experts = 2, .k = 1, .min_capacity = 0, .use_rts = false};
  Gating g = compute_gating(logits, S, c, true, nullptr);
  EXPECT_EQ(g.capacity, 4);
  EXPECT_EQ(g.exp_counts, (std::vector<int64_t>{8, 0}));
  EXPECT_EQ(g.dropped(), 4);
  EXPECT_EQ(g.slot, (std::vector<int32_t>{0, 1, 2, 3, -1, -1, -1, -1}));  // without RTS: the first by position
  // l_aux = E * sum(me * ce) = 2 * me_0 * 1.
  double me0 = 0;
  for (int64_t s = 0; s < S; ++s) me0 += 1.0 / (1.0 + std::exp(-(1.0 + 0.1 * s))) / S;
  EXPECT_NEAR(g.l_aux, 2.0 * me0, 1e-6);
  EXPECT_FLOAT_EQ(g.weight[0], static_cast<float>(1.0 / (1.0 + std::exp(-1.0))));
  // With RTS the kept four are those with the largest draws, numbered in position order.
  c.use_rts = true;
  GateNoise noise = GateNoise::keyed(1, "layer", 0, 0);
  Gating r = compute_gating(logits, S, c, true, &noise);
  std::vector<int64_t> order(S);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return noise.rts(a, 0, 2) > noise.rts(b, 0, 2); });
  std::vector<int64_t> kept(order.begin(), order.begin() + 4);
  std::sort(kept.begin(), kept.end());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(r.slot[static_cast<size_t>(kept[i])], i);
  EXPECT_EQ(r.dropped(), 4);
  // The draws follow the token's global index, not its position on this rank.
  GateNoise shifted = GateNoise::keyed(1, "layer", 0, 3);
  EXPECT_EQ(shifted.rts(0, 1, 2), noise.rts(3, 1, 2));
  EXPECT_NE(GateNoise::keyed(1, "layer", 1, 0).rts(0, 0, 2), noise.rts(0, 0, 2));
  EXPECT_NE(GateNoise::keyed(1, "other", 0, 0).rts(0, 0, 2), noise.rts(0, 0, 2));
}

TEST(Gating, TopTwoSecondSlotsOffsetByFirstCounts) {
  // 4 tokens, 3 experts; first choices 0, 0, 1, 0; second choices 1, 2, 0, 1 (no sampling).
  std::vector<float> logits = {3, 2, 0, 3, 0, 2, 2, 3, 0, 3, 2, 0};
  GateConfig c{.num_experts = 3, .k = 2, .capacity_factor = 1.0, .min_capacity = 0, .top2_2nd_expert_sampling = false};
  // capacity = ceil(4/3 * 2) = 3
  Gating g = compute_gating(logits, 4, c, true, nullptr);
  EXPECT_EQ(g.capacity, 3);
  EXPECT_EQ(g.expert, (std::vector<int32_t>{0, 1, 0, 2, 1, 0, 0, 1}));
  // Expert 0: first choices at slots 0, 1, 2 (tokens 0, 1, 3); token 2's second choice at 3 + 0 = 3: dropped.
  // Expert 1: first choice token 2 at slot 0; second choices tokens 0, 3 at 1 + 0 = 1 and 1 + 1 = 2.
  // Expert 2: token 1's second choice at 0 + 0 = 0.
  EXPECT_EQ(g.slot, (std::vector<int32_t>{0, 1, 1, 0, 0, -1, 2, 2}));
  EXPECT_EQ(g.exp_counts, (std::vector<int64_t>{4, 3, 1}));
  EXPECT_FLOAT_EQ(g.weight[5], 0.0f);
  EXPECT_FLOAT_EQ(g.weight[4], 1.0f);  // token 2 keeps only its first choice: normalised to 1
  const float e3 = std::exp(3.0f), e2 = std::exp(2.0f);
  EXPECT_NEAR(g.weight[0], e3 / (e3 + e2), 1e-6);
  EXPECT_EQ(g.dropped(), 1);
}

TEST(Gating, NoDropCapacityIsTheAgreedMaximum) {
  auto logits = random_logits(16, 4, 3);
  GateConfig c{.num_experts = 4, .k = 2, .drop_tokens = false, .top2_2nd_expert_sampling = false};
  Gating g = compute_gating(logits, 16, c, true, nullptr, [](int64_t local) { return std::max<int64_t>(local, 20); });
  EXPECT_EQ(g.capacity, 20);
  EXPECT_EQ(g.dropped(), 0);
}

TEST(Gating, NoTokens) {
  GateConfig c{.num_experts = 4, .k = 2};
  GateNoise noise = GateNoise::keyed(0, "x", 0, 0);
  Gating g = compute_gating({}, 0, c, true, &noise);
  EXPECT_EQ(g.l_aux, 0.0f);
  EXPECT_EQ(g.dropped(), 0);
  EXPECT_EQ(g.capacity, 4);  // min_capacity
}

TEST(Gating, BackwardMatchesFiniteDifferences) {
  // d/dlogits of sum(weight * r) + a * l_aux, routing fixed (no noise, no ties), central differences in fp32.
  for (int k : {1, 2, 3}) {
    const int64_t S = 6;
    const int E = 4;
    auto logits = random_logits(S, E, 11 + k, 0.5f);
    GateConfig c{.num_experts = E, .k = k, .capacity_factor = 1.0, .min_capacity = 1, .use_rts = false,
                 .top2_2nd_expert_sampling = false};
    std::vector<float> r(static_cast<size_t>(S * k));
    for (size_t i = 0; i < r.size(); ++i) r[i] = 0.3f + 0.1f * static_cast<float>(i % 5);
    const float a = 0.7f;
    auto loss = [&](const std::vector<float>& z) {
      Gating g = compute_gating(z, S, c, true, nullptr);
      double sum = a * g.l_aux;
      for (size_t i = 0; i < r.size(); ++i) sum += g.weight[i] * r[i];
      return sum;
    };
    Gating g = compute_gating(logits, S, c, true, nullptr);
    std::vector<float> dz(static_cast<size_t>(S * E));
    gating_backward(g, r, a, dz);
    for (size_t i = 0; i < logits.size(); ++i) {
      const float h = 1e-2f;
      auto zp = logits, zm = logits;
      zp[i] += h;
      zm[i] -= h;
      Gating gp = compute_gating(zp, S, c, true, nullptr), gm = compute_gating(zm, S, c, true, nullptr);
      if (gp.slot != g.slot || gm.slot != g.slot || gp.expert != g.expert || gm.expert != g.expert) continue;
      const double fd = (loss(zp) - loss(zm)) / (2.0 * h);
      EXPECT_NEAR(dz[i], fd, 2e-3) << "k " << k << " logit " << i;
    }
  }
}

TEST(Gating, ConfigErrorsNameTheKey) {
  EXPECT_THROW(parse_noisy_gate_policy("gaussian"), ConfigError);
  EXPECT_EQ(parse_noisy_gate_policy("RSample"), NoisyGatePolicy::kRSample);
  try {
    GateConfig{.num_experts = 4, .k = 5}.validate("model.moe.");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.moe.k"), std::string::npos) << e.what();
  }
  EXPECT_THROW(GateConfig({.num_experts = 4, .capacity_factor = 0.0}).validate(), ConfigError);
}

}  // namespace
}  // namespace zs::moe
