// LLaMA: whole-model finite differences against a straight double-precision reference (RMSNorm,
// rotary embedding, grouped-query attention, SwiGLU written as plain loops), the parameter names
// and shapes other tools map onto, parameter counts, config validation, and a few training steps.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "nn/data.h"
#include "nn/flops.h"
#include "nn/host_context.h"
#include "nn/llama.h"
#include "reference.h"

namespace zs::nn {
namespace {

using memory::DType;
using memory::Tensor;
using ref::ParamMap;
using ref::Vec;

LlamaConfig fd_config(int64_t n_kv_head) {
  return LlamaConfig{.n_layer = 2, .d_model = 16, .n_head = 4, .n_kv_head = n_kv_head, .d_ff = 24, .max_seq_len = 8,
                     .vocab_size = 32, .rope_theta = 10000.0, .norm_eps = 1e-5f, .init_std = 0.2f};
}

Batch make_batch(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  Batch b{Tensor::empty({B, T}, DType::kI32), Tensor::empty({B, T}, DType::kI32)};
  std::mt19937_64 gen(seed);
  for (int64_t i = 0; i < B * T; ++i) {
    b.inputs.data<int32_t>()[i] = static_cast<int32_t>(gen() % vocab);
    b.targets.data<int32_t>()[i] = static_cast<int32_t>(gen() % vocab);
  }
  return b;
}

Vec rms_norm(const Vec& x, const Vec& w, int64_t d, double eps) {
  Vec y(x.size());
  for (size_t r = 0; r < x.size() / static_cast<size_t>(d); ++r) {
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += x[r * d + j] * x[r * d + j];
    const double rs = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
    for (int64_t j = 0; j < d; ++j) y[r * d + j] = w[j] * x[r * d + j] * rs;
  }
  return y;
}

// Hugging Face's apply_rotary_pos_emb on rows of `heads` heads (position = row % T).
void rope(Vec& x, int64_t T, int64_t heads, int64_t hs, double theta) {
  const int64_t half = hs / 2;
  for (size_t r = 0; r < x.size() / static_cast<size_t>(heads * hs); ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      double* p = x.data() + r * heads * hs + h * hs;
      for (int64_t j = 0; j < half; ++j) {
        const double angle = static_cast<double>(static_cast<int64_t>(r) % T) * std::pow(theta, -2.0 * j / hs);
        const double a = p[j], b = p[j + half];
        p[j] = a * std::cos(angle) - b * std::sin(angle);
        p[j + half] = b * std::cos(angle) + a * std::sin(angle);
      }
    }
  }
}

Vec attention(const Vec& x, const ParamMap& p, const std::string& pre, int64_t B, int64_t T, const LlamaConfig& cfg) {
  const int64_t C = cfg.d_model, H = cfg.n_head, K = cfg.n_kv_head, hs = C / H, rep = H / K;
  Vec q = ref::linear(x, p.at(pre + "q.weight"), nullptr, C, C);
  Vec k = ref::linear(x, p.at(pre + "k.weight"), nullptr, C, K * hs);
  const Vec v = ref::linear(x, p.at(pre + "v.weight"), nullptr, C, K * hs);
  rope(q, T, H, hs, cfg.rope_theta);
  rope(k, T, K, hs, cfg.rope_theta);
  Vec y(static_cast<size_t>(B * T * C), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t g = h / rep;
        std::vector<double> s(static_cast<size_t>(i + 1));
        double mx = -1e300, z = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double d = 0;
          for (int64_t e = 0; e < hs; ++e) d += q[(b * T + i) * C + h * hs + e] * k[(b * T + j) * K * hs + g * hs + e];
          s[j] = d / std::sqrt(static_cast<double>(hs));
          mx = std::max(mx, s[j]);
        }
        for (auto& w : s) z += (w = std::exp(w - mx));
        for (int64_t e = 0; e < hs; ++e) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += s[j] / z * v[(b * T + j) * K * hs + g * hs + e];
          y[(b * T + i) * C + h * hs + e] = acc;
        }
      }
  return ref::linear(y, p.at(pre + "proj.weight"), nullptr, C, C);
}

Vec mlp(const Vec& x, const ParamMap& p, const std::string& pre, int64_t C, int64_t F) {
  Vec g = ref::linear(x, p.at(pre + "gate.weight"), nullptr, C, F);
  const Vec u = ref::linear(x, p.at(pre + "up.weight"), nullptr, C, F);
  for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
  return ref::linear(g, p.at(pre + "proj.weight"), nullptr, F, C);
}

double reference_loss(const ParamMap& p, const LlamaConfig& cfg, const Batch& batch) {
  const int64_t B = batch.inputs.size(0), T = batch.inputs.size(1), C = cfg.d_model, V = cfg.vocab_size;
  const int32_t* ids = batch.inputs.data<int32_t>();
  Vec x(static_cast<size_t>(B * T * C));
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t j = 0; j < C; ++j) x[r * C + j] = p.at("wte")[ids[r] * C + j];
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    const std::string pre = "blocks." + std::to_string(l) + ".";
    x = ref::add(x, attention(rms_norm(x, p.at(pre + "ln1.weight"), C, cfg.norm_eps), p, pre + "attn.", B, T, cfg));
    x = ref::add(x, mlp(rms_norm(x, p.at(pre + "ln2.weight"), C, cfg.norm_eps), p, pre + "mlp.", C, cfg.d_ff));
  }
  x = rms_norm(x, p.at("ln_f.weight"), C, cfg.norm_eps);
  const Vec logits = ref::linear(x, p.at("lm_head.weight"), nullptr, C, V);
  const int32_t* t = batch.targets.data<int32_t>();
  return ref::cross_entropy(logits, std::vector<int32_t>(t, t + B * T), V);
}

void check_gradients(int64_t n_kv_head, bool recompute) {
  const LlamaConfig cfg = fd_config(n_kv_head);
  LlamaModel model(cfg);
  materialize(model, 5);
  // RMSNorm weights away from one, so a wrong weight path shows.
  model.visit_params([](Parameter& p) {
    if (p.full_name().find("ln") != std::string::npos) {
      for (float& w : p.data().f32()) w += 0.1f * static_cast<float>(&w - p.data().f32().data()) / static_cast<float>(p.numel());
    }
  });
  if (recompute) model.set_recompute({.blocks = {true, false}, .selective = true});
  Batch batch = make_batch(2, 7, cfg.vocab_size, 9);  // T < max_seq_len
  HostContext ctx;
  const float loss = ctx.forward_loss(model, batch);
  ParamMap p = ref::params_of(model);
  EXPECT_NEAR(loss, reference_loss(p, cfg, batch), 1e-5 * std::abs(loss) + 1e-6);
  ctx.backward_loss(model, 1.0f);
  model.visit_params([&](Parameter& prm) {
    Vec& values = p.at(prm.full_name());
    ref::expect_grad_matches(prm.full_name(), values, ref::sample_indices(values.size(), 40),
                             [&] { return reference_loss(p, cfg, batch); }, ref::grad_values(prm));
  });
  EXPECT_EQ(ctx.live_bytes(MemoryUse::kActivation), 0u);
  EXPECT_EQ(ctx.live_bytes(MemoryUse::kGradient), 0u);
  EXPECT_EQ(ctx.live_bytes(MemoryUse::kScratch), 0u);
}

TEST(LlamaTest, GroupedQueryGradientsMatchFiniteDifferences) { check_gradients(2, false); }
TEST(LlamaTest, MultiHeadGradientsMatchFiniteDifferences) { check_gradients(4, false); }
TEST(LlamaTest, MultiQueryGradientsWithRecomputeMatchFiniteDifferences) { check_gradients(1, true); }

TEST(LlamaTest, ParameterNamesAndShapes) {
  // The names other tools map onto (docs/models.md): a change here breaks weight files.
  LlamaModel model(fd_config(2));
  std::vector<std::string> got;
  model.visit_params([&](Parameter& p) { got.push_back(p.full_name() + " " + memory::shape_string(p.shape())); });
  const std::vector<std::string> want_head = {
      "wte (32, 16)",
      "blocks.0.ln1.weight (16,)",
      "blocks.0.attn.q.weight (16, 16)",
      "blocks.0.attn.k.weight (8, 16)",
      "blocks.0.attn.v.weight (8, 16)",
      "blocks.0.attn.proj.weight (16, 16)",
      "blocks.0.ln2.weight (16,)",
      "blocks.0.mlp.gate.weight (24, 16)",
      "blocks.0.mlp.up.weight (24, 16)",
      "blocks.0.mlp.proj.weight (16, 24)",
  };
  ASSERT_EQ(got.size(), 1 + 2 * 9 + 2u);
  for (size_t i = 0; i < want_head.size(); ++i) EXPECT_EQ(got[i], want_head[i]);
  EXPECT_EQ(got[got.size() - 2], "ln_f.weight (16,)");
  EXPECT_EQ(got.back(), "lm_head.weight (32, 16)");
  EXPECT_EQ(model.param_count(), llama_param_count(fd_config(2)));
  for (Parameter* p : model.all_params()) {
    EXPECT_EQ(p->has_tag(kTagNoWeightDecay), p->full_name().find("ln") != std::string::npos) << p->full_name();
  }
}

TEST(LlamaTest, DefaultMlpWidthIsMetasRule) {
  EXPECT_EQ(llama_default_d_ff(4096), 11008);
  EXPECT_EQ(llama_default_d_ff(5120), 13824);
  EXPECT_EQ(llama_d_ff(LlamaConfig{.d_model = 64}), 256);
  EXPECT_EQ(llama_d_ff(LlamaConfig{.d_model = 64, .d_ff = 100}), 100);
}

TEST(LlamaTest, TrainFlopsPerTokenEqualTheKernelsCountWhereAttentionIsOnePanel) {
  // At T = 64 the fused attention computes its whole T x T in one causal panel, so the kernels' count
  // (nn/flops.h, recomputation apart) is the analytic one exactly; grouped-query keys and values included.
  const LlamaConfig cfg{.n_layer = 2, .d_model = 32, .n_head = 4, .n_kv_head = 2, .d_ff = 48, .max_seq_len = 64,
                        .vocab_size = 96};
  LlamaModel model(cfg);
  materialize(model, 2);
  Batch batch = make_batch(2, 64, cfg.vocab_size, 3);
  HostContext ctx;
  const uint64_t performed = flops_performed(), recomputed = flops_recomputed();
  ctx.forward_loss(model, batch);
  ctx.backward_loss(model, 1.0f);
  const double model_flops = static_cast<double>((flops_performed() - performed) - (flops_recomputed() - recomputed));
  EXPECT_EQ(model_flops, llama_train_flops_per_token(cfg, 64) * 2 * 64);
  // Written out: per layer q and proj (C x C each), k and v (kv x C, kv = 2 heads of 8), gate, up and proj
  // (3 C x F); then the head (V x C).
  const double n_matmul = 2 * (32 * 32 + 2 * 16 * 32 + 32 * 32 + 3 * 32 * 48) + 96 * 32;
  EXPECT_EQ(llama_train_flops_per_token(cfg, 64), 6 * n_matmul + 12.0 * 2 * 64 * 32);
}

TEST(LlamaTest, InvalidConfigNamesTheKey) {
  auto message = [](const LlamaConfig& c) {
    try {
      validate(c);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message(LlamaConfig{.n_head = 3}).find("model.d_model"), std::string::npos);
  EXPECT_NE(message(LlamaConfig{.d_model = 12, .n_head = 4}).find("even size"), std::string::npos);
  EXPECT_NE(message(LlamaConfig{.n_head = 4, .n_kv_head = 3}).find("model.n_kv_head"), std::string::npos);
  EXPECT_NE(message(LlamaConfig{.rope_theta = 0.5}).find("model.rope_theta"), std::string::npos);
  EXPECT_NE(message(LlamaConfig{.norm_eps = 0.0f}).find("model.norm_eps"), std::string::npos);
  EXPECT_NE(message(LlamaConfig{.max_seq_len = 0}).find("model.max_seq_len"), std::string::npos);
  EXPECT_EQ(message(LlamaConfig{}), "(accepted)");
}

TEST(LlamaTest, TooLongBatchIsRejected) {
  LlamaConfig cfg = fd_config(2);
  LlamaModel model(cfg);
  materialize(model, 1);
  HostContext ctx;
  Batch batch = make_batch(1, cfg.max_seq_len + 1, cfg.vocab_size, 1);
  EXPECT_THROW(ctx.forward_loss(model, batch), ConfigError);
}

TEST(LlamaTest, SgdOnAFixedTextLowersTheLoss) {
  const LlamaConfig cfg{.n_layer = 2, .d_model = 32, .n_head = 4, .n_kv_head = 2, .max_seq_len = 16, .vocab_size = 256};
  LlamaModel model(cfg);
  materialize(model, 3);
  Dataset data = Dataset::builtin(cfg.max_seq_len);
  Batch batch;
  data.fill_batch(batch, 1, 0, 0, 4);
  HostContext ctx;
  float first = 0.0f, last = 0.0f;
  for (int step = 0; step < 30; ++step) {
    zero_grads(model);
    const float loss = ctx.forward_loss(model, batch);
    ctx.backward_loss(model, 1.0f);
    model.visit_params([](Parameter& p) {
      auto w = p.data().f32();
      auto g = p.grad().f32();
      for (size_t i = 0; i < w.size(); ++i) w[i] -= 0.5f * g[i];
    });
    (step == 0 ? first : last) = loss;
  }
  EXPECT_NEAR(first, std::log(256.0f), 0.3f);
  EXPECT_LT(last, 0.6f * first);
}

}  // namespace
}  // namespace zs::nn
