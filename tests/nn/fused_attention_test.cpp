// The fused attention (nn/fused_attention.h) against a double-precision reference (forward, lse, and
// the backward against central finite differences), against the plain kernel it replaces (forward and
// backward, fp32 and bf16), its per-ISA row kernels against the scalar ones, and its input checks.
// Sequence lengths are not multiples of the 64-row block; grouped-query attention and batch > 1.
#include <cblas.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/errors.h"
#include "memory/cpu_features.h"
#include "memory/dtype.h"
#include "nn/attention.h"
#include "nn/detail/attention.h"
#include "nn/detail/attention_rows.h"
#include "nn/fused_attention.h"
#include "nn/host_context.h"
#include "reference.h"

namespace zs::nn {
namespace {

using memory::DType;
using memory::Tensor;
using ref::Vec;

struct Dims {
  int64_t B, T, Hq, Hkv, hd;
};

// Causal attention in double on q (B, T, Hq, hd), k and v (B, T, Hkv, hd): out (B, T, Hq, hd), and
// each row's log-sum-exp (B, Hq, T) when lse != nullptr.
Vec attention_ref(const Vec& q, const Vec& k, const Vec& v, const Dims& d, Vec* lse = nullptr) {
  Vec out(static_cast<size_t>(d.B * d.T * d.Hq * d.hd), 0.0);
  if (lse) lse->assign(static_cast<size_t>(d.B * d.Hq * d.T), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.hd));
  const int64_t G = d.Hq / d.Hkv;
  std::vector<double> s(static_cast<size_t>(d.T));
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.Hq; ++h)
      for (int64_t i = 0; i < d.T; ++i) {
        const double* qi = &q[static_cast<size_t>(((b * d.T + i) * d.Hq + h) * d.hd)];
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          const double* kj = &k[static_cast<size_t>(((b * d.T + j) * d.Hkv + h / G) * d.hd)];
          double dot = 0;
          for (int64_t e = 0; e < d.hd; ++e) dot += qi[e] * kj[e];
          s[j] = dot * scale;
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (int64_t j = 0; j <= i; ++j) z += (s[j] = std::exp(s[j] - mx));
        if (lse) (*lse)[static_cast<size_t>((b * d.Hq + h) * d.T + i)] = mx + std::log(z);
        double* o = &out[static_cast<size_t>(((b * d.T + i) * d.Hq + h) * d.hd)];
        for (int64_t j = 0; j <= i; ++j) {
          const double* vj = &v[static_cast<size_t>(((b * d.T + j) * d.Hkv + h / G) * d.hd)];
          for (int64_t e = 0; e < d.hd; ++e) o[e] += s[j] / z * vj[e];
        }
      }
  return out;
}

Tensor from_double(const Vec& x, memory::Shape shape, DType dtype) {
  Tensor f = Tensor::empty(shape, DType::kF32);
  for (size_t i = 0; i < x.size(); ++i) f.data<float>()[i] = static_cast<float>(x[i]);
  if (dtype == DType::kF32) return f;
  Tensor t = Tensor::empty(shape, dtype);
  t.copy_from(f);
  return t;
}

Vec random_vec(size_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.0, scale);
  Vec x(n);
  for (double& e : x) e = dist(gen);
  return x;
}

double max_abs(const Vec& x) {
  double m = 1e-30;
  for (double e : x) m = std::max(m, std::abs(e));
  return m;
}

// Forward against the reference, then every gradient against finite differences of
// L = sum(out * w) on sampled elements (all of them for small tensors).
void check_against_reference(const Dims& d, size_t limit) {
  const size_t nq = static_cast<size_t>(d.B * d.T * d.Hq * d.hd), nk = static_cast<size_t>(d.B * d.T * d.Hkv * d.hd);
  Vec q = random_vec(nq, 1), k = random_vec(nk, 2), v = random_vec(nk, 3);
  const Vec w = random_vec(nq, 4);
  HostContext ctx;
  const Tensor qt = from_double(q, {d.B, d.T, d.Hq * d.hd}, DType::kF32);
  const Tensor kt = from_double(k, {d.B, d.T, d.Hkv * d.hd}, DType::kF32);
  const Tensor vt = from_double(v, {d.B, d.T, d.Hkv * d.hd}, DType::kF32);
  FusedAttentionSaved s = fused_attention_forward(ctx, {qt, 0, d.Hq}, {kt, 0, d.Hkv}, {vt, 0, d.Hkv}, d.hd, DType::kF32);
  Vec lse_ref;
  const Vec out_ref = attention_ref(q, k, v, d, &lse_ref);
  const double out_max = max_abs(out_ref);
  for (size_t i = 0; i < nq; ++i) ASSERT_NEAR(s.out.data<float>()[i], out_ref[i], 1e-5 * out_max) << "out[" << i << "]";
  for (size_t i = 0; i < lse_ref.size(); ++i)
    ASSERT_NEAR(s.lse.data<float>()[i], lse_ref[i], 1e-5 * std::abs(lse_ref[i]) + 1e-6) << "lse[" << i << "]";

  const Tensor dout = from_double(w, s.out.shape(), DType::kF32);
  Tensor dq = Tensor::empty(qt.shape(), DType::kF32), dk = Tensor::empty(kt.shape(), DType::kF32),
         dv = Tensor::empty(vt.shape(), DType::kF32);
  fused_attention_backward(ctx, {qt, 0, d.Hq}, {kt, 0, d.Hkv}, {vt, 0, d.Hkv}, s, dout, d.hd, DType::kF32,
                           {dq, 0, d.Hq}, {dk, 0, d.Hkv}, {dv, 0, d.Hkv});
  EXPECT_EQ(ctx.live_bytes(MemoryUse::kScratch), 0u) << "the backward's scratch outlived it";
  auto loss = [&] {
    const Vec out = attention_ref(q, k, v, d);
    double total = 0;
    for (size_t i = 0; i < out.size(); ++i) total += out[i] * w[i];
    return total;
  };
  auto values = [](const Tensor& t) { return std::vector<float>(t.f32().begin(), t.f32().end()); };
  ref::expect_grad_matches("dq", q, ref::sample_indices(nq, limit), loss, values(dq));
  ref::expect_grad_matches("dk", k, ref::sample_indices(nk, limit), loss, values(dk));
  ref::expect_grad_matches("dv", v, ref::sample_indices(nk, limit), loss, values(dv));
}

TEST(FusedAttention, MatchesReferenceOneBlock) { check_against_reference({2, 5, 2, 2, 8}, 1000); }

TEST(FusedAttention, MatchesReferenceSeveralBlocksGqa) {
  // 130 rows: blocks of 64, 64 and 2; 4 query heads on 2 kv heads.
  check_against_reference({2, 130, 4, 2, 4}, 40);
}

TEST(FusedAttention, MatchesReferenceMultiQuery) { check_against_reference({1, 70, 3, 1, 4}, 120); }

// The packed qkv of CausalSelfAttention through both kernels: same numbers to fp32 (bf16) rounding.
void compare_with_plain(int64_t B, int64_t T, int64_t H, int64_t hs, DType compute, double rtol) {
  const int64_t C = H * hs;
  HostContext ctx;
  const Tensor qkv = from_double(random_vec(static_cast<size_t>(B * T * 3 * C), 5), {B, T, 3 * C}, DType::kF32);
  const Tensor dy = from_double(random_vec(static_cast<size_t>(B * T * C), 6), {B, T, C}, DType::kF32);
  const detail::GemmPath path = detail::gemm_path_for(compute);
  Tensor y_plain, dqkv_plain;
  {
    detail::SingleThreadedBlas blas;
    Tensor probs;
    y_plain = detail::causal_attention_forward(ctx, qkv, H, path, true, &probs, blas);
    detail::AttentionScratch scratch;
    dqkv_plain = detail::causal_attention_backward(ctx, qkv, probs, dy, H, path, &scratch, blas);
  }
  const AttentionHeads q{qkv, 0, H}, k{qkv, C, H}, v{qkv, 2 * C, H};
  FusedAttentionSaved s = fused_attention_forward(ctx, q, k, v, hs, compute);
  // dqkv starts as NaN: the backward must write every column of every head.
  Tensor dqkv = Tensor::empty(qkv.shape(), DType::kF32);
  for (float& e : dqkv.f32()) e = std::numeric_limits<float>::quiet_NaN();
  fused_attention_backward(ctx, q, k, v, s, dy, hs, compute, {dqkv, 0, H}, {dqkv, C, H}, {dqkv, 2 * C, H});
  auto expect_close = [&](const Tensor& got, const Tensor& want, const char* what) {
    const Vec w = ref::to_double(want);
    const double scale = max_abs(w);
    for (size_t i = 0; i < w.size(); ++i) {
      ASSERT_NEAR(got.data<float>()[i], w[i], rtol * scale) << what << "[" << i << "] " << memory::dtype_name(compute);
    }
  };
  expect_close(s.out, y_plain, "y");
  expect_close(dqkv, dqkv_plain, "dqkv");
}

TEST(FusedAttention, MatchesPlainFp32) {
  compare_with_plain(2, 130, 4, 16, DType::kF32, 1e-5);
  compare_with_plain(1, 200, 2, 64, DType::kF32, 1e-5);
}

TEST(FusedAttention, MatchesPlainBf16) {
  // Both round the products' operands to bf16 (8 bits): P and dS differ by a rounding between the two.
  compare_with_plain(2, 130, 4, 16, DType::kBF16, 2e-2);
}

TEST(FusedAttention, Bf16InputsMatchReferenceOnRoundedValues) {
  const Dims d{2, 100, 4, 2, 16};
  const size_t nq = static_cast<size_t>(d.B * d.T * d.Hq * d.hd), nk = static_cast<size_t>(d.B * d.T * d.Hkv * d.hd);
  HostContext ctx;
  const Tensor q = from_double(random_vec(nq, 7), {d.B, d.T, d.Hq * d.hd}, DType::kBF16);
  const Tensor k = from_double(random_vec(nk, 8), {d.B, d.T, d.Hkv * d.hd}, DType::kBF16);
  const Tensor v = from_double(random_vec(nk, 9), {d.B, d.T, d.Hkv * d.hd}, DType::kBF16);
  for (DType compute : {DType::kF32, DType::kBF16}) {
    FusedAttentionSaved s = fused_attention_forward(ctx, {q, 0, d.Hq}, {k, 0, d.Hkv}, {v, 0, d.Hkv}, d.hd, compute);
    const Vec want = attention_ref(ref::to_double(q), ref::to_double(k), ref::to_double(v), d);
    // fp32 products of bf16 values are exact up to fp32 rounding; bf16 products also round P.
    const double tol = (compute == DType::kF32 || detail::gemm_path_for(compute) == detail::GemmPath::kSgemm ? 1e-5 : 2e-2) *
                       max_abs(want);
    for (size_t i = 0; i < nq; ++i) ASSERT_NEAR(s.out.data<float>()[i], want[i], tol) << "out[" << i << "]";
  }
}

TEST(FusedAttention, SameResultsForAnyThreadCount) {
  const Dims d{2, 90, 4, 2, 8};
  const size_t nq = static_cast<size_t>(d.B * d.T * d.Hq * d.hd), nk = static_cast<size_t>(d.B * d.T * d.Hkv * d.hd);
  const Tensor q = from_double(random_vec(nq, 1), {d.B, d.T, d.Hq * d.hd}, DType::kF32);
  const Tensor k = from_double(random_vec(nk, 2), {d.B, d.T, d.Hkv * d.hd}, DType::kF32);
  const Tensor v = from_double(random_vec(nk, 3), {d.B, d.T, d.Hkv * d.hd}, DType::kF32);
  const Tensor dout = from_double(random_vec(nq, 4), {d.B, d.T, d.Hq * d.hd}, DType::kF32);
  auto run = [&](int threads) {
    const int saved = openblas_get_num_threads();
    openblas_set_num_threads(threads);
    HostContext ctx;
    FusedAttentionSaved s = fused_attention_forward(ctx, {q, 0, d.Hq}, {k, 0, d.Hkv}, {v, 0, d.Hkv}, d.hd, DType::kF32);
    Tensor dq = Tensor::empty(q.shape(), DType::kF32), dk = Tensor::empty(k.shape(), DType::kF32),
           dv = Tensor::empty(v.shape(), DType::kF32);
    fused_attention_backward(ctx, {q, 0, d.Hq}, {k, 0, d.Hkv}, {v, 0, d.Hkv}, s, dout, d.hd, DType::kF32,
                             {dq, 0, d.Hq}, {dk, 0, d.Hkv}, {dv, 0, d.Hkv});
    openblas_set_num_threads(saved);
    std::vector<float> all(s.out.f32().begin(), s.out.f32().end());
    for (const Tensor* t : {&dq, &dk, &dv}) all.insert(all.end(), t->f32().begin(), t->f32().end());
    return all;
  };
  EXPECT_EQ(run(1), run(3));
}

// Every row kernel this CPU runs against the scalar one, on a block with masked rows and a ragged tail.
TEST(FusedAttention, RowKernelsAgreeAcrossIsas) {
  const int64_t rows = 20, cols = 37, ld = 40, hd = 19, diag = -3;  // rows 0..3 see no column
  const Vec s0 = random_vec(static_cast<size_t>(rows * ld), 10, 3.0), o0 = random_vec(static_cast<size_t>(rows * hd), 11);
  const Vec dp0 = random_vec(static_cast<size_t>(rows * ld), 12), lse0 = random_vec(static_cast<size_t>(rows), 13);
  auto run = [&](memory::IsaLevel isa) {
    const detail::AttentionRowKernels& rk = detail::attention_row_kernels(isa);
    std::vector<float> s(s0.begin(), s0.end()), o(o0.begin(), o0.end()), dp(dp0.begin(), dp0.end());
    std::vector<float> m(rows, -std::numeric_limits<float>::infinity()), l(rows, 0.0f);
    for (int64_t i = 0; i < rows; i += 2) m[i] = 0.5f, l[i] = 2.0f;  // rows carried over from an earlier block
    rk.online_softmax(s.data(), ld, rows, cols, diag, m.data(), l.data(), o.data(), hd, hd);
    std::vector<float> s2(s0.begin(), s0.end()), lse(lse0.begin(), lse0.end()), dsum(rows, 0.25f);
    rk.softmax_grad(s2.data(), dp.data(), ld, rows, cols, diag, lse.data(), dsum.data());
    std::vector<float> all;
    for (const auto* x : {&s, &o, &m, &l, &s2, &dp}) all.insert(all.end(), x->begin(), x->end());
    return all;
  };
  const std::vector<float> want = run(memory::IsaLevel::kScalar);
  // The masked entries (j >= i + diag, inside cols) are exact zeros.
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = std::max<int64_t>(0, i + diag); j < cols; ++j) ASSERT_EQ(want[i * ld + j], 0.0f) << i << "," << j;
  for (memory::IsaLevel isa : memory::supported_isas()) {
    const std::vector<float> got = run(isa);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::isinf(want[i])) {
        ASSERT_EQ(got[i], want[i]) << memory::isa_name(isa) << " [" << i << "]";  // m of a row that saw nothing
        continue;
      }
      ASSERT_NEAR(got[i], want[i], 2e-6 * std::max(1.0f, std::abs(want[i]))) << memory::isa_name(isa) << " [" << i << "]";
    }
  }
}

TEST(FusedAttention, RejectsMismatchedViews) {
  HostContext ctx;
  const Tensor q = Tensor::empty({1, 8, 32}, DType::kF32), kv = Tensor::empty({1, 8, 24}, DType::kF32);
  try {
    fused_attention_forward(ctx, {q, 0, 4}, {kv, 0, 3}, {kv, 0, 3}, 8, DType::kF32);
    FAIL() << "3 kv heads for 4 query heads accepted";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("3 kv heads must divide the 4 query heads"), std::string::npos) << e.what();
  }
  try {
    fused_attention_forward(ctx, {q, 0, 4}, {kv, 16, 2}, {kv, 0, 2}, 8, DType::kF32);
    FAIL() << "k's heads past its width accepted";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("k heads 2 x head_dim 8 from column 16 do not fit its width 24"),
              std::string::npos)
        << e.what();
  }
  const Tensor short_kv = Tensor::empty({1, 7, 16}, DType::kF32);
  EXPECT_THROW(fused_attention_forward(ctx, {q, 0, 4}, {short_kv, 0, 2}, {short_kv, 0, 2}, 8, DType::kF32), ModelError);
}

}  // namespace
}  // namespace zs::nn
