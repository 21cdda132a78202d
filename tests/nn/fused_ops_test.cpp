// The fused LLaMA kernels (nn/detail/fused_ops.h) at every ISA this CPU runs: each forward against its
// plain composition in double precision, each backward against double-precision central finite
// differences of that composition (L = sum(y * r) for a fixed random r), lengths with vector tails.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "memory/cpu_features.h"
#include "nn/detail/fused_ops.h"

namespace zs::nn::detail {
namespace {

using memory::IsaLevel;
using Vec = std::vector<float>;
using VecD = std::vector<double>;

Vec random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  Vec v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

VecD to_double(const Vec& v) { return VecD(v.begin(), v.end()); }

// d/dx_i of f(x) . r by central differences in double (f is the plain composition).
VecD fd_grad(const std::function<VecD(const VecD&)>& f, VecD x, const VecD& r) {
  VecD g(x.size());
  const double h = 1e-6;
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    VecD up = f(x);
    x[i] = keep - h;
    VecD down = f(x);
    x[i] = keep;
    double s = 0.0;
    for (size_t j = 0; j < r.size(); ++j) s += (up[j] - down[j]) * r[j];
    g[i] = s / (2 * h);
  }
  return g;
}

void expect_close(const Vec& got, const VecD& want, double tol, const char* what, IsaLevel isa) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * (1.0 + std::abs(want[i]))) << what << "[" << i << "] at " << memory::isa_name(isa);
  }
}

// ---- RMSNorm ----

VecD rms_plain(const VecD& x, const VecD& w, int64_t rows, int64_t d, double eps) {
  VecD y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t j = 0; j < d; ++j) ss += x[r * d + j] * x[r * d + j];
    const double rs = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
    for (int64_t j = 0; j < d; ++j) y[r * d + j] = w[j] * (x[r * d + j] * rs);
  }
  return y;
}

TEST(FusedOps, RmsNormMatchesPlainCompositionAndFiniteDifferences) {
  const float eps = 1e-5f;
  for (IsaLevel isa : memory::supported_isas()) {
    for (int64_t d : {1, 7, 16, 37, 64}) {
      const int64_t rows = 3;
      const Vec x = random_vec(static_cast<size_t>(rows * d), 1, 2.0f);
      const Vec w = random_vec(static_cast<size_t>(d), 2);
      const Vec r = random_vec(x.size(), 3);
      Vec y(x.size()), rstd(rows);
      rms_norm_forward(x.data(), w.data(), 0, rows, d, eps, y.data(), rstd.data(), isa);
      expect_close(y, rms_plain(to_double(x), to_double(w), rows, d, eps), 2e-6, "y", isa);
      Vec dx(x.size()), dw(static_cast<size_t>(d), 0.5f);  // dw accumulates onto what it holds
      rms_norm_backward(r.data(), x.data(), w.data(), rstd.data(), 0, rows, d, dx.data(), isa);
      rms_norm_weight_grad(r.data(), x.data(), rstd.data(), rows, d, 0, d, dw.data(), isa);
      const VecD wd = to_double(w), xd = to_double(x), rd = to_double(r);
      expect_close(dx, fd_grad([&](const VecD& v) { return rms_plain(v, wd, rows, d, eps); }, xd, rd), 2e-5, "dx", isa);
      VecD want_dw = fd_grad([&](const VecD& v) { return rms_plain(xd, v, rows, d, eps); }, wd, rd);
      for (double& v : want_dw) v += 0.5;
      expect_close(dw, want_dw, 2e-5, "dw", isa);
    }
  }
}

TEST(FusedOps, RmsNormRowAndColumnRangesComposeToTheWhole) {
  const int64_t rows = 5, d = 21;
  const Vec x = random_vec(static_cast<size_t>(rows * d), 4), w = random_vec(static_cast<size_t>(d), 5);
  const Vec dy = random_vec(x.size(), 6);
  Vec y1(x.size()), y2(x.size()), r1(rows), r2(rows), dw1(static_cast<size_t>(d)), dw2(static_cast<size_t>(d));
  rms_norm_forward(x.data(), w.data(), 0, rows, d, 1e-6f, y1.data(), r1.data());
  rms_norm_forward(x.data(), w.data(), 0, 2, d, 1e-6f, y2.data(), r2.data());
  rms_norm_forward(x.data(), w.data(), 2, rows, d, 1e-6f, y2.data(), r2.data());
  EXPECT_EQ(y1, y2);
  EXPECT_EQ(r1, r2);
  rms_norm_weight_grad(dy.data(), x.data(), r1.data(), rows, d, 0, d, dw1.data());
  rms_norm_weight_grad(dy.data(), x.data(), r1.data(), rows, d, 0, 9, dw2.data());
  rms_norm_weight_grad(dy.data(), x.data(), r1.data(), rows, d, 9, d, dw2.data());
  EXPECT_EQ(dw1, dw2) << "a column's sum must not depend on how columns are split";
}

// ---- SwiGLU ----

VecD swiglu_plain(const VecD& g, const VecD& u) {
  VecD h(g.size());
  for (size_t i = 0; i < g.size(); ++i) h[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
  return h;
}

TEST(FusedOps, SwiGluMatchesPlainCompositionAndFiniteDifferences) {
  for (IsaLevel isa : memory::supported_isas()) {
    for (size_t n : {1u, 9u, 16u, 45u, 100u}) {
      Vec g = random_vec(n, 7, 3.0f);
      if (n > 2) {
        g[0] = 40.0f;  // saturated sigmoid at both ends
        g[1] = -40.0f;
      }
      const Vec u = random_vec(n, 8), r = random_vec(n, 9);
      Vec h(n);
      swiglu_forward(g.data(), u.data(), 0, static_cast<int64_t>(n), h.data(), isa);
      const VecD gd = to_double(g), ud = to_double(u), rd = to_double(r);
      expect_close(h, swiglu_plain(gd, ud), 1e-6, "h", isa);
      Vec dg(n), du(n);
      swiglu_backward(r.data(), g.data(), u.data(), 0, static_cast<int64_t>(n), dg.data(), du.data(), isa);
      expect_close(dg, fd_grad([&](const VecD& v) { return swiglu_plain(v, ud); }, gd, rd), 1e-5, "dg", isa);
      expect_close(du, fd_grad([&](const VecD& v) { return swiglu_plain(gd, v); }, ud, rd), 1e-5, "du", isa);
    }
  }
}

// ---- rotary embedding ----

// Hugging Face's composition: q * cos + rotate_half(q) * sin with cos/sin repeated over both halves.
VecD rope_plain(const VecD& x, int64_t rows, int64_t seq, int64_t heads, int64_t hs, double theta) {
  VecD y(x.size());
  const int64_t half = hs / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const double pos = static_cast<double>(r % seq);
    for (int64_t h = 0; h < heads; ++h) {
      const double* in = x.data() + r * heads * hs + h * hs;
      double* out = y.data() + r * heads * hs + h * hs;
      for (int64_t j = 0; j < hs; ++j) {
        const int64_t jj = j % half;
        const double angle = pos / std::pow(theta, static_cast<double>(2 * jj) / static_cast<double>(hs));
        const double rot = j < half ? -in[j + half] : in[j - half];
        out[j] = in[j] * std::cos(angle) + rot * std::sin(angle);
      }
    }
  }
  return y;
}

TEST(FusedOps, RopeMatchesPlainCompositionAndItsBackwardIsTheTranspose) {
  for (IsaLevel isa : memory::supported_isas()) {
    for (int64_t hs : {2, 6, 16, 40, 64}) {
      const int64_t seq = 5, rows = 2 * seq, heads = 3, half = hs / 2;
      const double theta = 10000.0;
      Vec cos(static_cast<size_t>(seq * half)), sin(cos.size());
      rope_tables(seq, hs, theta, cos.data(), sin.data());
      const Vec x = random_vec(static_cast<size_t>(rows * heads * hs), 10);
      Vec y = x;
      rope_apply(y.data(), 0, rows, heads * hs, seq, heads, hs, cos.data(), sin.data(), false, isa);
      const VecD xd = to_double(x);
      // The tables round the angle to fp32 as torch does: within a few fp32 ulps of the exact angle.
      expect_close(y, rope_plain(xd, rows, seq, heads, hs, theta), 4e-6, "y", isa);
      const Vec r = random_vec(x.size(), 11);
      Vec dx = r;
      rope_apply(dx.data(), 0, rows, heads * hs, seq, heads, hs, cos.data(), sin.data(), true, isa);
      expect_close(dx, fd_grad([&](const VecD& v) { return rope_plain(v, rows, seq, heads, hs, theta); }, xd, to_double(r)),
                   2e-5, "dx", isa);
      Vec back = y;  // the inverse undoes the forward
      rope_apply(back.data(), 0, rows, heads * hs, seq, heads, hs, cos.data(), sin.data(), true, isa);
      expect_close(back, xd, 2e-6, "inverse(forward(x))", isa);
    }
  }
}

TEST(FusedOps, RopeRowStrideLeavesOtherColumnsAlone) {
  // k heads inside a wider row (a packed layout): columns past heads * hs are not touched.
  const int64_t seq = 3, hs = 8, heads = 2, stride = heads * hs + 5;
  Vec cos(static_cast<size_t>(seq * hs / 2)), sin(cos.size());
  rope_tables(seq, hs, 500000.0, cos.data(), sin.data());
  Vec x = random_vec(static_cast<size_t>(seq * stride), 12);
  const Vec before = x;
  rope_apply(x.data(), 0, seq, stride, seq, heads, hs, cos.data(), sin.data(), false);
  for (int64_t r = 0; r < seq; ++r) {
    for (int64_t c = heads * hs; c < stride; ++c) EXPECT_EQ(x[r * stride + c], before[r * stride + c]);
  }
  for (int64_t c = 0; c < heads * hs; ++c) EXPECT_EQ(x[c], before[c]) << "position 0 is the identity";
}

}  // namespace
}  // namespace zs::nn::detail
