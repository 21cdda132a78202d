#include "nn/detail/ops.h"

#include <cblas.h>

#include <algorithm>
#include <string>

#include "core/errors.h"
#include "nn/flops.h"
#include "nn/detail/parallel.h"

extern "C" char* openblas_get_corename(void);  // OpenBLAS's, not declared by Debian's cblas.h

namespace zs::nn::detail {

namespace {

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

// Note [sgemm on the pool]: a multi-threaded product used to run on OpenBLAS's own threads, so the
// step switched between two thread pools at every product: our pool's polling worker was parked
// before each sgemm, OpenBLAS's threads woke for it (and polled with sched_yield after it), and the
// elementwise pass after it woke our worker again; inside the product OpenBLAS's threads wait on
// each other's packed panels, so one thread starting late or preempted holds the other up. The
// large GPT's fp32 step (train_bench, 6 layers, d 512) took 3.13-3.28 CPU seconds on two threads
// against 2.67 on one, and one-thread ranks at np 2 reached 76% MFU where one two-thread rank reached
// 61% (docs/benchmarks.md, "Model FLOPs utilisation"). Now a product large enough to split is cut
// into bands of rows of C, one per thread, each an independent single-threaded sgemm on our worker
// pool: one pool, no waiting inside a product (a worker that starts late finds its band taken by the
// caller), OpenBLAS's threads never wake. The same step: 2.96-2.98 CPU seconds. Each band packs
// the other operand (the weight) itself, once per band instead of once per product.
//
// Bit for bit: OpenBLAS computes each element of C as the same chain of FMAs over k (k is cut into
// the same blocks whatever the rows), so a band's elements equal the whole product's, provided the
// band takes the same kernel: OpenBLAS runs products of at most kSmallProduct multiply-adds through
// separate small-matrix and direct kernels, so every band must stay above it; band edges fall on
// multiples of band_rows() rows, a multiple of the row tile of the kernel OpenBLAS chose for this CPU:
// a band that ends inside a tile of the whole product computes that tile's last rows with the
// remainder kernel, whose bits differ (tests/nn/ops_test.cpp compares the bands with one whole product;
// OpenBLAS's own threads split inside Zen's tiles, so its two-thread product is not the reference).
// Measured (OPENBLAS_CORETYPE on an AMD EPYC showing AVX2 only, 2026-11-30): Haswell's and Zen's sgemm
// tiles are 12 rows (bands of 64 gave other bits from row 60 of each band; 12, 24, 36, 48, 96, 192 the
// same bits), Sandybridge, Nehalem, Penryn, Core2, Atom, Dunnington, Prescott and Barcelona the same bits
// at 48; the AVX-512 kernels' (SkylakeX, Cooperlake, SapphireRapids) tiles are 16 rows, 64 measured
// there. A core not listed takes 192, a multiple of both.
int64_t band_rows() {
  static const int64_t rows = [] {
    const char* name = openblas_get_corename();
    const std::string core = name != nullptr ? name : "";
    if (core == "SkylakeX" || core == "Cooperlake" || core == "SapphireRapids") return int64_t{64};
    for (const char* c : {"Haswell", "Zen", "Sandybridge", "Nehalem", "Penryn", "Core2", "Atom", "Dunnington", "Prescott",
                          "Barcelona"}) {
      if (core == c) return int64_t{48};
    }
    return int64_t{192};
  }();
  return rows;
}
constexpr double kSmallProduct = 256.0 * 256.0 * 256.0;  // OpenBLAS's direct sgemm's limit; its small kernels' is 100^3

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0 || !kernels_enabled()) return;
  add_flops(2 * static_cast<uint64_t>(m) * static_cast<uint64_t>(n) * static_cast<uint64_t>(k));
  const int threads = openblas_get_num_threads();  // 1 inside a parallel region (SingleThreadedBlas)
  const int64_t band = band_rows();
  const int64_t blocks = (m + band - 1) / band;
  const int64_t bands = std::min<int64_t>(threads, blocks);
  // The shortest band: the fewest whole blocks any band gets, its last one possibly C's partial one.
  const int64_t shortest = (blocks / std::max<int64_t>(bands, 1) - 1) * band + (m - (blocks - 1) * band);
  if (bands <= 1 || static_cast<double>(shortest) * static_cast<double>(n) * static_cast<double>(k) <= kSmallProduct) {
    // OpenBLAS's threads (if it uses more than one here) need the cores our pool's workers may be
    // polling on (core/parallel.h).
    if (threads > 1) zs::park_pool_workers();
    sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  SingleThreadedBlas blas;  // Note [sgemm on the pool]
  parallel_for_threads(blas.threads(), blocks, 1, [&](int64_t b0, int64_t b1, int) {
    const int64_t r0 = b0 * band, r1 = std::min(m, b1 * band);
    const float* ap = trans_a ? a + r0 : a + r0 * lda;
    sgemm(trans_a, trans_b, r1 - r0, n, k, alpha, ap, lda, b, ldb, beta, c + r0 * ldc, ldc);
  });
}

namespace {
constexpr int64_t kLanes = 8;
}  // namespace

float max_of(const float* x, int64_t n) {
  float lane[kLanes];
  for (int64_t k = 0; k < kLanes; ++k) lane[k] = x[0];
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int64_t k = 0; k < kLanes; ++k) lane[k] = x[j + k] > lane[k] ? x[j + k] : lane[k];
  }
  float m = lane[0];
  for (int64_t k = 1; k < kLanes; ++k) m = lane[k] > m ? lane[k] : m;
  for (; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

float sum_of(const float* x, int64_t n) {
  float lane[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int64_t k = 0; k < kLanes; ++k) lane[k] += x[j + k];
  }
  float s = 0.0f;
  for (int64_t k = 0; k < kLanes; ++k) s += lane[k];
  for (; j < n; ++j) s += x[j];
  return s;
}

float sum_exp_shifted(const float* x, int64_t n, float shift) {
  float lane[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int64_t k = 0; k < kLanes; ++k) lane[k] += fast_exp(x[j + k] - shift);
  }
  float s = 0.0f;
  for (int64_t k = 0; k < kLanes; ++k) s += lane[k];
  for (; j < n; ++j) s += fast_exp(x[j] - shift);
  return s;
}

int64_t rows_of(const memory::Tensor& x, int64_t features, const char* who) {
  ZS_MODEL_CHECK(x.raw() != nullptr && x.dtype() == memory::DType::kF32 && x.is_contiguous(),
            "{}: expected a contiguous fp32 activation, got a {} tensor {}", who, memory::dtype_name(x.dtype()),
            memory::shape_string(x.shape()));
  ZS_MODEL_CHECK(x.dim() >= 1 && x.size(-1) == features, "{}: expected last dimension {}, got shape {}", who, features,
            memory::shape_string(x.shape()));
  return x.numel() / features;
}

memory::Shape with_last_dim(const memory::Shape& shape, int64_t features) {
  memory::Shape s = shape;
  s.back() = features;
  return s;
}

void add(const float* a, const float* b, float* out, int64_t n) {
  if (!kernels_enabled()) return;
  parallel_for(n, int64_t{1} << 14, [=](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) out[i] = a[i] + b[i];
  });
}

void check_ids(const int32_t* ids, int64_t n, int64_t vocab, std::string_view kind) {
  for (int64_t r = 0; r < n; ++r) {
    const int32_t id = ids[r];
    if (id < 0 || id >= vocab) [[unlikely]] {
      throw ConfigError(fmt::format("{} id {} at position {} is outside the vocabulary [0, {}): make "
                                    "model.vocab_size cover every id in the data",
                                    kind, id, r, vocab));
    }
  }
}

void embedding_lookup(const int32_t* ids, int64_t n, const float* table, int64_t vocab, int64_t dim, const float* pos,
                      int64_t period, float* out) {
  if (!kernels_enabled()) return;
  check_ids(ids, n, vocab, "token");
  parallel_for(n, 64, [=](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = table + static_cast<int64_t>(ids[r]) * dim;
      float* o = out + r * dim;
      if (pos != nullptr) {
        const float* p = pos + (r % period) * dim;
        for (int64_t j = 0; j < dim; ++j) o[j] = row[j] + p[j];
      } else {
        for (int64_t j = 0; j < dim; ++j) o[j] = row[j];
      }
    }
  });
}

void embedding_accumulate(const int32_t* ids, int64_t n, const float* dout, int64_t dim, float* grad_table) {
  if (!kernels_enabled()) return;
  // Rows may repeat ids, so threads split the columns: each sums its columns over every row in
  // order, the serial order (Note [compute threads]).
  parallel_for(dim, 64, [=](int64_t c0, int64_t c1, int) {
    for (int64_t r = 0; r < n; ++r) {
      float* g = grad_table + static_cast<int64_t>(ids[r]) * dim;
      const float* d = dout + r * dim;
      for (int64_t j = c0; j < c1; ++j) g[j] += d[j];
    }
  });
}

void sum_rows_into(const float* x, int64_t rows, int64_t cols, int64_t period, float* out) {
  if (!kernels_enabled()) return;
  parallel_for(cols, 64, [=](int64_t c0, int64_t c1, int) {
    for (int64_t r = 0; r < rows; ++r) {
      float* o = out + (r % period) * cols;
      const float* xr = x + r * cols;
      for (int64_t j = c0; j < c1; ++j) o[j] += xr[j];
    }
  });
}

}  // namespace zs::nn::detail
