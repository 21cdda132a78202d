// nn::detail::gemm on every path this CPU runs (the sgemm fallback everywhere, the AVX512-BF16 kernel
// where the CPU has it) against a double-precision reference on shapes that hit every edge of the
// kernel's blocking: row and column tails (12-row strips, 32-column panels), odd k, k across several
// 256-deep slices, n across several 768-wide blocks, all four transpose combinations, padded row
// strides, fp32 and bf16 operands, alpha, and beta zero (C not read: it holds NaN) or not.
//
// Bound (Note [bf16 products]): the bf16 path rounds each operand to bf16 (relative error <= u =
// 2^-8 per element, 8 significant bits), so a product a_r b_r is within (2u + u^2) |a b| of a b, and is exact in fp32
// (8 x 8 significant bits); the fp32 accumulation of k terms adds at most gamma_k = k 2^-24 / (1 -
// k 2^-24) of sum |a b|, the alpha and beta steps one rounding each. Hence per element
//   |C - C_ref| <= |alpha| (2u + u^2 + gamma_k + 2^-23) sum_p |a_ip b_pj| + 2^-23 |beta c_ij|.
// The sgemm path rounds nothing on input (a bf16 operand widens exactly), so its bound drops 2u + u^2.
#include <cblas.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/parallel.h"
#include "memory/cpu_features.h"
#include "memory/dtype.h"
#include "nn/detail/gemm.h"
#include "nn/detail/parallel.h"

namespace zs::nn::detail {
namespace {

using memory::DType;

std::vector<GemmPath> paths_here() {
  std::vector<GemmPath> out{GemmPath::kSgemm};
  if (gemm_path_supported(GemmPath::kAvx512Bf16)) out.push_back(GemmPath::kAvx512Bf16);
  return out;
}

// A stored operand: values as fp32 (exactly the bf16 values when dtype is bf16) and its bits.
struct Stored {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  DType dtype;
  int64_t ld;
  bool trans;

  Stored(int64_t rows, int64_t cols, int64_t pad, DType dt, bool tr, std::mt19937& rng) : dtype(dt), ld(cols + pad), trans(tr) {
    std::normal_distribution<float> dist(0.0f, 1.0f);
    f32.assign(static_cast<size_t>(rows * ld), std::numeric_limits<float>::quiet_NaN());  // padding is never read
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) f32[r * ld + c] = dist(rng);
    }
    if (dtype == DType::kBF16) {
      bf16.resize(f32.size());
      memory::convert_f32_to_bf16(f32, bf16);
      memory::convert_bf16_to_f32(bf16, f32);
    }
  }
  Matrix matrix() const {
    return {dtype == DType::kBF16 ? static_cast<const void*>(bf16.data()) : f32.data(), dtype, ld, trans};
  }
  // op(X)(r, c)
  double at(int64_t r, int64_t c) const { return trans ? f32[c * ld + r] : f32[r * ld + c]; }
};

struct Case {
  int64_t m, n, k;
};

void check(GemmPath path, const Case& s, bool ta, bool tb, DType da, DType db, float alpha, float beta, uint32_t seed) {
  std::mt19937 rng(seed);
  const Stored a(ta ? s.k : s.m, ta ? s.m : s.k, 3, da, ta, rng);
  const Stored b(tb ? s.n : s.k, tb ? s.k : s.n, 5, db, tb, rng);
  const int64_t ldc = s.n + 2;
  std::vector<float> c0(static_cast<size_t>(s.m * ldc));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& v : c0) v = beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : dist(rng);
  std::vector<float> c = c0;
  gemm(path, s.m, s.n, s.k, alpha, a.matrix(), b.matrix(), beta, c.data(), ldc);

  const double u = path == GemmPath::kAvx512Bf16 ? std::ldexp(1.0, -8) : 0.0;  // bf16: 8 significant bits
  const double gamma = s.k * std::ldexp(1.0, -24) / (1.0 - s.k * std::ldexp(1.0, -24));
  const double rel = 2 * u + u * u + gamma + std::ldexp(1.0, -23);
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      double ref = 0.0, mag = 0.0;
      for (int64_t p = 0; p < s.k; ++p) {
        ref += a.at(i, p) * b.at(p, j);
        mag += std::abs(a.at(i, p) * b.at(p, j));
      }
      const double old = beta == 0.0f ? 0.0 : static_cast<double>(c0[i * ldc + j]);
      const double want = alpha * ref + beta * old;
      const double bound = std::abs(alpha) * rel * mag + std::ldexp(1.0, -23) * std::abs(beta * old) + 1e-30;
      const double got = c[i * ldc + j];
      ASSERT_LE(std::abs(got - want), bound)
          << gemm_path_name(path) << " m " << s.m << " n " << s.n << " k " << s.k << " ta " << ta << " tb " << tb
          << " A " << memory::dtype_name(da) << " B " << memory::dtype_name(db) << " at (" << i << ", " << j
          << "): got " << got << " want " << want;
    }
    // Columns past n (the row padding of C) are untouched.
    for (int64_t j = s.n; j < ldc; ++j) {
      const float before = c0[i * ldc + j];
      ASSERT_TRUE(std::isnan(before) ? std::isnan(c[i * ldc + j]) : c[i * ldc + j] == before);
    }
  }
}

TEST(Gemm, MatchesDoubleReferenceOnEveryPathShapeAndLayout) {
  const Case cases[] = {{1, 1, 1}, {13, 33, 17}, {37, 65, 3}, {12, 32, 256}, {25, 70, 257}, {100, 97, 513}, {5, 800, 40}};
  uint32_t seed = 1;
  for (GemmPath path : paths_here()) {
    for (const Case& s : cases) {
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, tb = t & 2;
        check(path, s, ta, tb, DType::kF32, DType::kBF16, 1.0f, 0.0f, seed++);
        check(path, s, ta, tb, DType::kBF16, DType::kF32, 0.75f, 1.0f, seed++);
      }
      check(path, s, false, false, DType::kF32, DType::kF32, -1.5f, 0.5f, seed++);
      check(path, s, true, true, DType::kBF16, DType::kBF16, 1.0f, 0.0f, seed++);
    }
  }
}

TEST(Gemm, LargeBlocksAcrossThreadsAndSlices) {
  // m over several row tiles, k over three slices; the third has too few rows for 4 tiles per thread,
  // so its tiles also split n (Note [bf16 kernel scheduling]).
  for (GemmPath path : paths_here()) {
    check(path, {203, 1000, 600}, false, true, DType::kF32, DType::kBF16, 1.0f, 0.0f, 7);
    check(path, {300, 130, 515}, true, false, DType::kF32, DType::kF32, 1.0f, 1.0f, 8);
    check(path, {30, 700, 300}, true, true, DType::kF32, DType::kBF16, 1.0f, 0.0f, 9);
  }
}

TEST(Gemm, ResultDoesNotDependOnTheThreadCount) {
  // Tiles are claimed dynamically, but each element is computed by one tile in k-slice order: the
  // product on the pool equals the one run serially inside a region, bit for bit.
  for (GemmPath path : paths_here()) {
    std::mt19937 rng(4);
    const Stored a(650, 30, 0, DType::kF32, true, rng);  // op(A): 30 x 650, transposed
    const Stored b(650, 900, 0, DType::kBF16, false, rng);
    std::vector<float> pooled(30 * 900), serial(30 * 900);
    gemm(path, 30, 900, 650, 1.0f, a.matrix(), b.matrix(), 0.0f, pooled.data(), 900);
    zs::parallel_for_threads(2, 2, 1, [&](int64_t b0, int64_t, int) {
      if (b0 == 0) gemm(path, 30, 900, 650, 1.0f, a.matrix(), b.matrix(), 0.0f, serial.data(), 900);
    });
    EXPECT_EQ(pooled, serial) << gemm_path_name(path);
  }
}

TEST(Gemm, SameResultOnOneToSixThreads) {
  // Each thread claims the tiles of its own segment, then steals the rest (Note [bf16 kernel
  // scheduling]); more segments than the claims keep in place (4) and more threads than cores (2
  // here) still compute every tile once, in k-slice order. (OpenBLAS's sgemm splits k by its own
  // thread count: not compared.)
  const int saved = openblas_get_num_threads();
  for (GemmPath path : paths_here()) {
    if (path == GemmPath::kSgemm) continue;
    std::mt19937 rng(5);
    const Stored a(300, 517, 0, DType::kF32, false, rng);  // op(A): 300 x 517: 4 row blocks, 3 k slices
    const Stored b(517, 200, 0, DType::kBF16, false, rng);
    std::vector<float> want;
    for (int threads : {1, 2, 3, 6}) {
      openblas_set_num_threads(threads);
      ASSERT_EQ(compute_threads(), threads);
      std::vector<float> got(300 * 200, 7.0f);
      gemm(path, 300, 200, 517, 1.0f, a.matrix(), b.matrix(), 0.5f, got.data(), 200);
      if (want.empty()) want = got;
      EXPECT_EQ(got, want) << gemm_path_name(path) << " on " << threads << " threads";
    }
  }
  openblas_set_num_threads(saved);
}

TEST(Gemm, BiasStartsEveryRowAsACopyWould) {
  // gemm(..., bias) equals copying bias into each row of C and passing beta, bit for bit, on every
  // path: row and column tails, k over several slices, k = 0, beta 1 and 0.5 (a layer's bias); the
  // row padding of C (ldc > n) is left as it was.
  const Case cases[] = {{13, 33, 17}, {100, 97, 513}, {203, 70, 300}, {5, 40, 0}};
  for (GemmPath path : paths_here()) {
    std::mt19937 rng(6);
    for (const Case& s : cases) {
      const Stored a(s.m, s.k, 0, DType::kF32, false, rng);
      const Stored b(s.n, s.k, 0, DType::kBF16, true, rng);
      std::normal_distribution<float> dist;
      std::vector<float> bias(static_cast<size_t>(s.n));
      for (float& v : bias) v = dist(rng);
      const int64_t ldc = s.n + 3;
      for (float beta : {1.0f, 0.5f}) {
        std::vector<float> copied(static_cast<size_t>(s.m * ldc), 9.0f), fused = copied;
        for (int64_t i = 0; i < s.m; ++i) std::copy(bias.begin(), bias.end(), copied.begin() + i * ldc);
        gemm(path, s.m, s.n, s.k, 1.0f, a.matrix(), b.matrix(), beta, copied.data(), ldc);
        gemm(path, s.m, s.n, s.k, 1.0f, a.matrix(), b.matrix(), beta, fused.data(), ldc, bias.data());
        EXPECT_EQ(fused, copied) << gemm_path_name(path) << " " << s.m << "x" << s.n << "x" << s.k << " beta " << beta;
      }
    }
  }
}

TEST(Gemm, ZeroDepthScalesC) {
  for (GemmPath path : paths_here()) {
    std::vector<float> c = {1.0f, 2.0f, 3.0f, 4.0f};
    const std::vector<float> a(1), b(1);
    gemm(path, 2, 2, 0, 1.0f, Matrix::f32(a.data(), 1), Matrix::f32(b.data(), 2), 0.5f, c.data(), 2);
    EXPECT_EQ(c, (std::vector<float>{0.5f, 1.0f, 1.5f, 2.0f})) << gemm_path_name(path);
  }
}

TEST(Gemm, NestedInsideAParallelRegionGivesTheSameResult) {
  // Attention calls gemm from inside its own parallel loop (one head per thread): the kernel then runs
  // on the calling thread, with that thread's buffers.
  for (GemmPath path : paths_here()) {
    std::mt19937 rng(3);
    const Stored a(40, 70, 0, DType::kF32, false, rng);
    const Stored b(70, 50, 0, DType::kBF16, false, rng);
    std::vector<float> want(40 * 50);
    gemm(path, 40, 50, 70, 1.0f, a.matrix(), b.matrix(), 0.0f, want.data(), 50);
    std::vector<float> got(4 * 40 * 50);
    zs::parallel_for_threads(4, 4, 1, [&](int64_t b0, int64_t b1, int) {
      for (int64_t i = b0; i < b1; ++i) gemm(path, 40, 50, 70, 1.0f, a.matrix(), b.matrix(), 0.0f, got.data() + i * 2000, 50);
    });
    for (int i = 0; i < 4; ++i) {
      EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + i * 2000)) << gemm_path_name(path) << " copy " << i;
    }
  }
}

TEST(Gemm, Bf16PathFollowsTheCpuTheIsaCapAndTheMeasuredRate) {
  // The choice this process made (the avx2 kernel variant of the model tests runs with the cap at
  // avx2 and must take the fallback; the avx512 variant sets ZS_BF16_GEMM=native).
  const bool native = memory::cpu_has_avx512_bf16() && memory::best_isa() >= memory::IsaLevel::kAvx512;
  const char* env = std::getenv("ZS_BF16_GEMM");
  const std::string want = env == nullptr || *env == '\0' ? "auto" : env;
  if (want != "auto" && want != "native" && want != "sgemm") {
    // nn_gemm_test.bad_bf16_env sets a value that means nothing: the error names the variable and the
    // values it takes, on every CPU.
    try {
      bf16_gemm_choice();
      ADD_FAILURE() << "ZS_BF16_GEMM=" << want << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("ZS_BF16_GEMM=" + want + ": unknown value; use auto"), std::string::npos)
          << e.what();
    }
    return;
  }
  const Bf16GemmChoice& choice = bf16_gemm_choice();
  if (!native) {
    EXPECT_EQ(choice.path, GemmPath::kSgemm);
  } else if (want == "native") {
    EXPECT_EQ(choice.path, GemmPath::kAvx512Bf16);
  } else if (want == "sgemm") {
    EXPECT_EQ(choice.path, GemmPath::kSgemm);
  } else {
    // Measured: a real rate (vdpbf16ps does 0.25x-4x an FMA's flops on any core), and the rule.
    EXPECT_GT(choice.rate_over_fma, 0.1);
    EXPECT_LT(choice.rate_over_fma, 10.0);
    EXPECT_EQ(choice.path, choice.rate_over_fma >= kMinBf16RateOverFma ? GemmPath::kAvx512Bf16 : GemmPath::kSgemm)
        << choice.why << ", rate " << choice.rate_over_fma;
  }
  EXPECT_EQ(bf16_gemm_path(), choice.path);
  EXPECT_EQ(gemm_path_for(DType::kF32), GemmPath::kSgemm);
  EXPECT_EQ(gemm_path_for(DType::kF16), GemmPath::kSgemm);
  EXPECT_EQ(gemm_path_for(DType::kBF16), bf16_gemm_path());
}

}  // namespace
}  // namespace zs::nn::detail
