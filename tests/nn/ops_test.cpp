// nn's internal kernels against plain references: fast_exp against double exp, the laned row
// reductions against simple loops, parallel_for's ranges, and the banded multi-threaded sgemm
// against one whole single-threaded sgemm.
#include <gtest/gtest.h>

#include <cblas.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <vector>

#include "memory/cpu_features.h"
#include "nn/detail/gelu.h"
#include "nn/detail/ops.h"
#include "nn/detail/parallel.h"

namespace zs::nn::detail {
namespace {

TEST(OpsTest, FastExpIsWithinTwoUlpOfExp) {
  double worst = 0.0;
  for (float x = -87.0f; x <= 88.0f; x += 0.001f) {
    const double want = std::exp(static_cast<double>(x));
    const double got = fast_exp(x);
    worst = std::max(worst, std::abs(got - want) / want);
  }
  EXPECT_LT(worst, 2.5e-7) << "relative error (fp32 ulp is 1.2e-7 relative)";
  EXPECT_EQ(fast_exp(0.0f), 1.0f);
}

TEST(OpsTest, FastExpEdgeCases) {
  EXPECT_TRUE(std::isnan(fast_exp(std::numeric_limits<float>::quiet_NaN())));
  const float tiny = fast_exp(-std::numeric_limits<float>::infinity());
  EXPECT_GE(tiny, 0.0f);
  EXPECT_LT(tiny, 1e-37f);
  EXPECT_LT(fast_exp(-1000.0f), 1e-37f);
  EXPECT_TRUE(std::isfinite(fast_exp(1000.0f)));
  EXPECT_GT(fast_exp(88.0f), 1e38f);
}

TEST(OpsTest, RowReductionsMatchPlainLoops) {
  std::mt19937 gen(3);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (int64_t n = 1; n <= 40; ++n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = dist(gen);
    float mx = x[0];
    double sum = 0.0, sum_exp = 0.0;
    for (float v : x) {
      mx = std::max(mx, v);
      sum += v;
    }
    for (float v : x) sum_exp += std::exp(static_cast<double>(v) - mx);
    EXPECT_EQ(max_of(x.data(), n), mx) << "n = " << n;
    EXPECT_NEAR(sum_of(x.data(), n), sum, 1e-5 * (1.0 + std::abs(sum)) * static_cast<double>(n)) << "n = " << n;
    EXPECT_NEAR(sum_exp_shifted(x.data(), n, mx), sum_exp, 1e-6 * sum_exp * static_cast<double>(n)) << "n = " << n;
  }
  EXPECT_EQ(sum_of(nullptr, 0), 0.0f);
}

TEST(OpsTest, SumRowsIntoAddsPerPeriod) {
  const int64_t rows = 10, cols = 130, period = 4;
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) - 8.0f;
  std::vector<float> out(static_cast<size_t>(period * cols), 1.0f), want = out;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) want[static_cast<size_t>((r % period) * cols + j)] += x[static_cast<size_t>(r * cols + j)];
  sum_rows_into(x.data(), rows, cols, period, out.data());
  EXPECT_EQ(out, want);
}

TEST(OpsTest, ParallelForTilesTheRangeOnce) {
  for (int threads : {1, 2, 3, 8}) {
    for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{100}, int64_t{1001}}) {
      std::vector<int> hits(static_cast<size_t>(n), 0);
      std::vector<int> chunk_seen(static_cast<size_t>(threads), 0);
      std::mutex mu;
      parallel_for_threads(threads, n, 7, [&](int64_t b, int64_t e, int chunk) {
        std::lock_guard<std::mutex> lock(mu);
        ASSERT_LT(chunk, parallel_chunks(threads, n, 7));
        ++chunk_seen[static_cast<size_t>(chunk)];
        for (int64_t i = b; i < e; ++i) ++hits[static_cast<size_t>(i)];
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)], 1) << "threads " << threads << " n " << n;
      for (int c = 0; c < parallel_chunks(threads, n, 7); ++c) EXPECT_EQ(chunk_seen[static_cast<size_t>(c)], 1);
    }
  }
}

// Note [gelu kernels] (nn/detail/gelu.h): the AVX-512 GELU gives the scalar loop's bits, forward
// and backward, over a sweep through and beyond tanh's clamp, the special values, and a length
// that leaves a scalar tail.
TEST(OpsTest, GeluAvx512EqualsScalarBitForBit) {
  if (!memory::isa_supported(memory::IsaLevel::kAvx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::vector<float> x;
  for (float v = -12.0f; v <= 12.0f; v += 0.000731f) x.push_back(v);
  std::mt19937 gen(5);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (int i = 0; i < 20000; ++i) x.push_back(dist(gen));
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 7.90531110763549805f, -7.90531110763549805f, 1e30f, -1e30f,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min()}) {
    x.push_back(v);
  }
  x.push_back(0.5f);  // a length that is not a multiple of 16
  const int64_t n = static_cast<int64_t>(x.size());
  ASSERT_NE(n % 16, 0);
  std::vector<float> dy(x.size());
  for (float& v : dy) v = dist(gen);
  std::vector<float> y_vec(x.size()), y_ref(x.size()), dx_vec(x.size()), dx_ref(x.size());
  gelu_forward(x.data(), 0, n, y_vec.data(), memory::IsaLevel::kAvx512);
  gelu_forward(x.data(), 0, n, y_ref.data(), memory::IsaLevel::kScalar);
  gelu_backward(x.data(), dy.data(), 0, n, dx_vec.data(), memory::IsaLevel::kAvx512);
  gelu_backward(x.data(), dy.data(), 0, n, dx_ref.data(), memory::IsaLevel::kScalar);
  for (int64_t i = 0; i < n; ++i) {
    const size_t k = static_cast<size_t>(i);
    ASSERT_EQ(std::memcmp(&y_vec[k], &y_ref[k], 4), 0)
        << "forward at x = " << x[k] << ": " << y_vec[k] << " vs " << y_ref[k];
    ASSERT_EQ(std::memcmp(&dx_vec[k], &dx_ref[k], 4), 0)
        << "backward at x = " << x[k] << ": " << dx_vec[k] << " vs " << dx_ref[k];
  }
}

// Note [sgemm on the pool] (nn/detail/ops.cpp): a product split into bands of rows, each a
// single-threaded sgemm on the worker pool, gives the bits of the whole product on one thread. (Not
// always those of OpenBLAS's own two-thread product, the path before: on Zen its threads split the rows
// inside its 12-row tiles, and its bits differ from its one-thread product's.) The unit environment
// sets one BLAS thread; the test asks for two, which OpenBLAS grants on any machine.
TEST(OpsTest, BandedSgemmEqualsOneWholeProduct) {
  const int saved = openblas_get_num_threads();
  struct Shape {
    int64_t m, n, k;
  };
  // Bands of 266-1024 rows, each above the 256^3 multiply-adds below which ops.cpp does not split;
  // C's rows a multiple of the band blocks and not (650: a partial last block).
  for (const Shape& s : {Shape{650, 300, 300}, Shape{1024, 256, 160}, Shape{2048, 96, 256}}) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = (t & 1) != 0, tb = (t & 2) != 0;
      std::mt19937 gen(static_cast<unsigned>(s.m + t));
      std::normal_distribution<float> dist(0.0f, 1.0f);
      std::vector<float> a(static_cast<size_t>(s.m * s.k)), b(static_cast<size_t>(s.k * s.n));
      std::vector<float> c0(static_cast<size_t>(s.m * s.n));
      for (float& v : a) v = dist(gen);
      for (float& v : b) v = dist(gen);
      for (float& v : c0) v = dist(gen);
      const int64_t lda = ta ? s.m : s.k, ldb = tb ? s.k : s.n;
      for (const float beta : {0.0f, 1.0f}) {
        std::vector<float> banded = c0, whole = c0;
        openblas_set_num_threads(2);
        ASSERT_EQ(openblas_get_num_threads(), 2);
        gemm(ta, tb, s.m, s.n, s.k, 0.5f, a.data(), lda, b.data(), ldb, beta, banded.data(), s.n);
        openblas_set_num_threads(1);
        gemm(ta, tb, s.m, s.n, s.k, 0.5f, a.data(), lda, b.data(), ldb, beta, whole.data(), s.n);
        EXPECT_EQ(banded, whole) << s.m << "x" << s.n << "x" << s.k << " ta " << ta << " tb " << tb << " beta " << beta;
      }
    }
  }
  openblas_set_num_threads(saved);
}

}  // namespace
}  // namespace zs::nn::detail
