// Every layer's forward against a double-precision reference, and its backward (input and every
// parameter gradient) against central finite differences of that reference.
#include <cblas.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "memory/dtype.h"
#include "nn/attention.h"
#include "nn/cross_entropy.h"
#include "nn/detail/gemm.h"
#include "nn/host_context.h"
#include "nn/layers.h"
#include "nn/transformer.h"
#include "reference.h"

namespace zs::nn {
namespace {

using memory::DType;
using memory::Tensor;
using ref::ParamMap;
using ref::Vec;

using RefFn = std::function<Vec(const Vec& x, const ParamMap& p)>;

// Gives every parameter random values (zero biases and unit norm weights would hide bugs).
void randomize_params(Module& m, uint64_t seed, float scale) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  m.visit_params([&](Parameter& p) {
    Tensor f = Tensor::empty(p.shape(), DType::kF32);
    for (float& v : f.f32()) v = dist(gen);
    p.data().copy_from(f);
  });
}

// Forward vs reference, then backward vs finite differences of L = sum(ref(x, p) * dy).
void check_layer(Module& m, const memory::Shape& x_shape, const RefFn& ref_fn, float x_scale = 1.0f,
                 size_t limit = 400) {
  materialize(m, 11);
  randomize_params(m, 12, 0.5f);
  HostContext ctx;
  Tensor x = ref::random_tensor(x_shape, 13, x_scale);
  Tensor y = ctx.forward(m, x);
  Vec xd = ref::to_double(x);
  ParamMap p = ref::params_of(m);
  const Vec y_ref = ref_fn(xd, p);
  ASSERT_EQ(static_cast<size_t>(y.numel()), y_ref.size());
  double y_max = 1e-12;
  for (double v : y_ref) y_max = std::max(y_max, std::abs(v));
  for (size_t i = 0; i < y_ref.size(); ++i)
    ASSERT_NEAR(y.data<float>()[i], y_ref[i], 1e-5 * y_max + 1e-4 * std::abs(y_ref[i])) << "y[" << i << "]";

  Tensor dy = ref::random_tensor(y.shape(), 14);
  Tensor dx = ctx.backward(m, dy);
  const Vec dyd = ref::to_double(dy);
  auto loss = [&] {
    const Vec out = ref_fn(xd, p);
    double s = 0;
    for (size_t i = 0; i < out.size(); ++i) s += out[i] * dyd[i];
    return s;
  };
  ASSERT_TRUE(dx.raw() != nullptr);
  ASSERT_EQ(dx.shape(), x.shape());
  std::vector<float> dxv(dx.f32().begin(), dx.f32().end());
  ref::expect_grad_matches("dx", xd, ref::sample_indices(xd.size(), limit), loss, dxv);
  m.visit_params([&](Parameter& prm) {
    Vec& values = p.at(prm.full_name());
    ref::expect_grad_matches(prm.full_name(), values, ref::sample_indices(values.size(), limit), loss,
                             ref::grad_values(prm));
  });
  // All saved state is dropped by backward and all scratch is freed.
  EXPECT_EQ(ctx.live_bytes(MemoryUse::kScratch), 0u);
  y = {};
  dx = {};
  EXPECT_EQ(ctx.live_bytes(MemoryUse::kActivation), 0u) << "a saved activation outlived backward";
}

TEST(LayersTest, LinearWithBias) {
  Linear m(5, 7);
  check_layer(m, {2, 3, 5}, [](const Vec& x, const ParamMap& p) {
    return ref::linear(x, p.at("weight"), &p.at("bias"), 5, 7);
  });
}

TEST(LayersTest, LinearWithoutBias) {
  Linear m(6, 4, /*bias=*/false);
  EXPECT_EQ(m.bias(), nullptr);
  check_layer(m, {5, 6}, [](const Vec& x, const ParamMap& p) { return ref::linear(x, p.at("weight"), nullptr, 6, 4); });
}

TEST(LayersTest, LayerNorm) {
  LayerNorm m(6);
  EXPECT_TRUE(m.weight().has_tag(kTagNoWeightDecay));
  EXPECT_TRUE(m.bias().has_tag(kTagNoWeightDecay));
  check_layer(m, {4, 6}, [](const Vec& x, const ParamMap& p) {
    return ref::layer_norm(x, p.at("weight"), p.at("bias"), 6);
  }, 3.0f);
}

TEST(LayersTest, Gelu) {
  Gelu m;
  check_layer(m, {3, 7}, [](const Vec& x, const ParamMap&) { return ref::gelu(x); }, 2.0f);
}

TEST(LayersTest, CausalSelfAttention) {
  CausalSelfAttention m(8, 2);
  check_layer(m, {2, 5, 8}, [](const Vec& x, const ParamMap& p) { return ref::attention(x, p, "", 2, 5, 8, 2); });
}

TEST(LayersTest, CausalSelfAttentionSeveralPanels) {
  // T = 130: two full causal panels of 64 rows and a partial one (Note [causal panels]).
  CausalSelfAttention m(8, 2);
  check_layer(m, {2, 130, 8}, [](const Vec& x, const ParamMap& p) { return ref::attention(x, p, "", 2, 130, 8, 2); });
}

// Note [compute threads]: the elementwise passes split work so that results are bitwise the same on
// one thread and on several. Layers without matmuls, so OpenBLAS's own sums play no part.
TEST(LayersTest, ElementwiseResultsDoNotDependOnThreadCount) {
  const int saved = openblas_get_num_threads();
  auto run = [](int threads) {
    openblas_set_num_threads(threads);
    LayerNorm ln(192);
    Gelu gelu;
    materialize(ln, 3);
    randomize_params(ln, 4, 0.5f);
    HostContext ctx;
    Tensor x = ref::random_tensor({3, 50, 192}, 5, 2.0f);
    Tensor y = ctx.forward(gelu, ctx.forward(ln, x));
    Tensor dx = ctx.backward(ln, ctx.backward(gelu, ref::random_tensor({3, 50, 192}, 6)));
    std::vector<float> out(y.data<float>(), y.data<float>() + y.numel());
    out.insert(out.end(), dx.data<float>(), dx.data<float>() + dx.numel());
    for (Parameter* p : {&ln.weight(), &ln.bias()}) {
      out.insert(out.end(), p->grad().data<float>(), p->grad().data<float>() + p->numel());
    }
    SoftmaxCrossEntropy ce;
    Tensor logits = ref::random_tensor({150, 97}, 7, 3.0f);
    Tensor targets = Tensor::empty({150}, DType::kI32);
    for (int i = 0; i < 150; ++i) targets.data<int32_t>()[i] = (i * 37) % 97;
    out.push_back(ce.forward(ctx, logits, targets));
    Tensor dl = ce.backward(ctx, 1.0f);
    out.insert(out.end(), dl.data<float>(), dl.data<float>() + dl.numel());
    return out;
  };
  const std::vector<float> one = run(1);
  const std::vector<float> two = run(2);
  const std::vector<float> three = run(3);
  openblas_set_num_threads(saved);
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) {
    ASSERT_EQ(one[i], two[i]) << "element " << i;
    ASSERT_EQ(one[i], three[i]) << "element " << i;
  }
}

// Note [row-interleaved sums] (nn/layers.cpp): LayerNorm sums several rows side by side, each row in
// its own order, so y and dx equal the one-row-at-a-time loops below bit for bit; 21 rows on 1 and 2
// threads cover whole groups of rows and the rows left over. Changing any row's order of summation
// (e.g. summing a row in lanes) makes this fail.
TEST(LayersTest, LayerNormEqualsRowByRowLoopsBitForBit) {
  const int saved = openblas_get_num_threads();
  constexpr int64_t kRowsN = 21, kDim = 100;
  const float eps = 1e-5f;
  for (int threads : {1, 2}) {
    openblas_set_num_threads(threads);
    LayerNorm ln(kDim, eps);
    materialize(ln, 3);
    randomize_params(ln, 4, 0.5f);
    HostContext ctx;
    Tensor x = ref::random_tensor({kRowsN, kDim}, 5, 3.0f);
    Tensor dy = ref::random_tensor({kRowsN, kDim}, 6);
    Tensor y = ctx.forward(ln, x);
    Tensor dx = ctx.backward(ln, dy);
    const float* xp = x.data<float>();
    const float* dyp = dy.data<float>();
    const float* wp = ln.weight().data().data<float>();
    const float* bp = ln.bias().data().data<float>();
    const float inv_d = 1.0f / static_cast<float>(kDim);
    for (int64_t r = 0; r < kRowsN; ++r) {
      const float* xr = xp + r * kDim;
      const float* dr = dyp + r * kDim;
      float sum = 0.0f;
      for (int64_t j = 0; j < kDim; ++j) sum += xr[j];
      const float m = sum * inv_d;
      float var = 0.0f;
      for (int64_t j = 0; j < kDim; ++j) {
        const float c = xr[j] - m;
        var += c * c;
      }
      const float rs = 1.0f / std::sqrt(var * inv_d + eps);
      float sum_g = 0.0f, sum_gx = 0.0f;
      for (int64_t j = 0; j < kDim; ++j) {
        const float xhat = (xr[j] - m) * rs;
        const float g = dr[j] * wp[j];
        sum_g += g;
        sum_gx += g * xhat;
      }
      const float mg = sum_g * inv_d, mgx = sum_gx * inv_d;
      for (int64_t j = 0; j < kDim; ++j) {
        const float want_y = (xr[j] - m) * rs * wp[j] + bp[j];
        const float xhat = (xr[j] - m) * rs;
        const float want_dx = rs * (dr[j] * wp[j] - mg - xhat * mgx);
        ASSERT_EQ(y.data<float>()[r * kDim + j], want_y) << threads << " thread(s), row " << r << ", column " << j;
        ASSERT_EQ(dx.data<float>()[r * kDim + j], want_dx) << threads << " thread(s), row " << r << ", column " << j;
      }
    }
  }
  openblas_set_num_threads(saved);
}

TEST(LayersTest, Mlp) {
  Mlp m(6);
  check_layer(m, {2, 3, 6}, [](const Vec& x, const ParamMap& p) { return ref::mlp(x, p, "", 6); });
}

TEST(LayersTest, Block) {
  Block m(8, 2);
  check_layer(m, {2, 4, 8}, [](const Vec& x, const ParamMap& p) { return ref::block(x, p, "", 2, 4, 8, 2); });
}

TEST(LayersTest, EmbeddingLookupAndGradient) {
  Embedding m(7, 4);
  materialize(m, 3);
  HostContext ctx;
  Tensor ids = Tensor::empty({2, 3}, DType::kI32);
  const int32_t id_values[] = {1, 6, 1, 0, 3, 1};
  std::copy(std::begin(id_values), std::end(id_values), ids.data<int32_t>());
  Tensor y = ctx.forward(m, ids);
  ASSERT_EQ(y.shape(), (memory::Shape{2, 3, 4}));
  const float* w = m.weight().data().data<float>();
  for (int r = 0; r < 6; ++r)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(y.data<float>()[r * 4 + j], w[id_values[r] * 4 + j]);
  Tensor dy = ref::random_tensor({2, 3, 4}, 5);
  Tensor dx = ctx.backward(m, dy);
  EXPECT_FALSE(dx.defined()) << "integer input has no gradient";
  // L = sum_r W[ids[r]] . dy[r]: finite differences over the whole table.
  Vec wd = ref::to_double(m.weight().data());
  const Vec dyd = ref::to_double(dy);
  auto loss = [&] {
    double s = 0;
    for (int r = 0; r < 6; ++r)
      for (int j = 0; j < 4; ++j) s += wd[id_values[r] * 4 + j] * dyd[r * 4 + j];
    return s;
  };
  ref::expect_grad_matches("weight", wd, ref::sample_indices(wd.size(), 100), loss, ref::grad_values(m.weight()));
}

TEST(LayersTest, EmbeddingRejectsOutOfRangeIds) {
  Embedding m(7, 4);
  materialize(m, 3);
  HostContext ctx;
  Tensor ids = Tensor::empty({1, 2}, DType::kI32);
  ids.data<int32_t>()[1] = 7;
  try {
    ctx.forward(m, ids);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size"), std::string::npos) << e.what();
  }
}

TEST(LayersTest, CrossEntropyForwardAndBackward) {
  const int64_t N = 5, V = 11;
  Tensor logits = ref::random_tensor({N, V}, 21, 3.0f);
  // A huge offset checks numerical stability: exp would overflow without the max shift.
  for (int64_t j = 0; j < V; ++j) logits.data<float>()[j] += 1000.0f;
  Tensor targets = Tensor::empty({N}, DType::kI32);
  std::vector<int32_t> tv = {0, 10, 3, 3, 7};
  std::copy(tv.begin(), tv.end(), targets.data<int32_t>());
  HostContext ctx;
  SoftmaxCrossEntropy ce;
  const float loss = ce.forward(ctx, logits, targets);
  Vec ld = ref::to_double(logits);
  EXPECT_NEAR(loss, ref::cross_entropy(ld, tv, V), 1e-5);
  const float scale = 0.7f;
  Tensor d = ce.backward(ctx, scale);
  std::vector<float> dv(d.f32().begin(), d.f32().end());
  ref::expect_grad_matches("dlogits", ld, ref::sample_indices(ld.size(), 100),
                           [&] { return scale * ref::cross_entropy(ld, tv, V); }, dv);
}

TEST(LayersTest, GradientsAccumulateAcrossPasses) {
  Linear m(4, 3);
  materialize(m, 5);
  HostContext ctx;
  Tensor x = ref::random_tensor({2, 4}, 1);
  Tensor dy = ref::random_tensor({2, 3}, 2);
  ctx.forward(m, x);
  ctx.backward(m, dy);
  const std::vector<float> once = ref::grad_values(m.weight());
  ctx.forward(m, x);
  ctx.backward(m, dy);
  const std::vector<float> twice = ref::grad_values(m.weight());
  for (size_t i = 0; i < once.size(); ++i) EXPECT_FLOAT_EQ(twice[i], 2 * once[i]);
}

TEST(LayersTest, Bf16StorageEqualsRoundedFp32) {
  // Forward/backward with bf16 weights equal the fp32 path on the bf16-rounded weights where bf16
  // products run as sgemm (no AVX512-BF16, or the --isa=avx2 variant). On the bf16 kernel the
  // activations are rounded to bf16 too (Note [bf16 products]): each result is then within a few bf16
  // roundings (u = 2^-8) of the fp32 one, bounded here in norm.
  const bool exact = detail::bf16_gemm_path() == detail::GemmPath::kSgemm;
  auto expect_close = [&](const float* got, const float* want, size_t n, double bound, const std::string& what) {
    double diff = 0.0, norm = 0.0;
    for (size_t i = 0; i < n; ++i) {
      if (exact) ASSERT_EQ(got[i], want[i]) << what << "[" << i << "]";
      diff += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
      norm += static_cast<double>(want[i]) * want[i];
    }
    EXPECT_LE(std::sqrt(diff), bound * std::sqrt(norm)) << what;
  };
  Mlp a(8), b(8);
  materialize(a, 9, DType::kBF16);
  materialize(b, 9, DType::kF32);
  b.visit_params([&](Parameter& p) { p.data().copy_from(a.find_param(p.full_name())->data()); });
  // bf16 grads on `a`: accumulation goes through the fp32 scratch and back.
  a.visit_params([](Parameter& p) { p.set_grad(Tensor::empty(p.shape(), DType::kBF16)); });
  HostContext ctx;
  Tensor x = ref::random_tensor({3, 8}, 4);
  Tensor dy = ref::random_tensor({3, 8}, 5);
  Tensor ya = ctx.forward(a, x);
  Tensor yb = ctx.forward(b, x);
  expect_close(ya.data<float>(), yb.data<float>(), static_cast<size_t>(ya.numel()), 0x1p-6, "y");
  Tensor dxa = ctx.backward(a, dy);
  Tensor dxb = ctx.backward(b, dy);
  expect_close(dxa.data<float>(), dxb.data<float>(), static_cast<size_t>(dxa.numel()), 0x1p-6, "dx");
  b.visit_params([&](Parameter& p) {
    std::vector<float> gb = ref::grad_values(p);
    const std::vector<float> ga = ref::grad_values(*a.find_param(p.full_name()));
    for (float& v : gb) v = memory::bf16_to_f32(memory::f32_to_bf16(v));  // a's grads are stored in bf16
    expect_close(ga.data(), gb.data(), gb.size(), 0x1p-5, p.full_name());
  });
}

}  // namespace
}  // namespace zs::nn
