// Block-sparse attention (nn/sparse_attention.h): DeepSpeed's fixed, bigbird and bslongformer layouts
// checked block by block on small cases worked out by hand from sparsity_config.py's rules; the fused
// kernel with a layout against a double-precision attention with the explicit dense T x T mask built
// from the same layout (forward and backward, fp32 within 1e-5), for layout blocks below, at and above
// the kernel's 64, lengths not multiples of 64, grouped-query attention and a layout per head; the
// dense layout giving the dense kernel's results bit for bit; and the refusals naming their key.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/errors.h"
#include "nn/fused_attention.h"
#include "nn/host_context.h"
#include "nn/sparse_attention.h"

namespace zs::nn {
namespace {

using memory::DType;
using memory::Tensor;
using Vec = std::vector<double>;

// Head h's block rows as strings of 0/1 ("1100" ...).
std::vector<std::string> rows_of(const SparseLayout& l, int64_t h) {
  std::vector<std::string> out;
  for (int64_t r = 0; r < l.num_blocks(); ++r) {
    std::string s;
    for (int64_t c = 0; c < l.num_blocks(); ++c) s += l.block_allowed(h, r, c) ? '1' : '0';
    out.push_back(s);
  }
  return out;
}

TEST(SparseLayout, FixedBidirectionalWithHorizontalGlobals) {
  // nb 6, windows [0,4) and [4,6); global block 3 (the window's last), the short window's at 4+3 -> 5.
  SparseAttentionConfig c{.mode = SparsityMode::kFixed, .block = 16, .horizontal_global_attention = true};
  SparseLayout l(c, 2, 6 * 16);
  EXPECT_EQ(rows_of(l, 0), (std::vector<std::string>{"111101", "111101", "111101", "111111", "000111", "111111"}));
  EXPECT_EQ(rows_of(l, 1), rows_of(l, 0));  // one layout for every head
}

TEST(SparseLayout, FixedUnidirectionalPatternsPerHead) {
  SparseAttentionConfig c{.mode = SparsityMode::kFixed, .block = 16, .different_layout_per_head = true,
                          .num_local_blocks = 2, .unidirectional = true, .num_different_global_patterns = 2};
  SparseLayout l(c, 2, 5 * 16);
  // Head 0: globals at the window's last block (1, 3; the short window [4,5) clamps 4+1 to 4).
  EXPECT_EQ(rows_of(l, 0), (std::vector<std::string>{"10000", "11000", "01100", "01110", "01011"}));
  // Head 1: globals at the window's first block (0, 2, 4).
  EXPECT_EQ(rows_of(l, 1), (std::vector<std::string>{"10000", "11000", "10100", "10110", "10101"}));
}

TEST(SparseLayout, BsLongformerWindowsAndGlobalRanges) {
  SparseAttentionConfig c{.mode = SparsityMode::kBsLongformer, .block = 64, .unidirectional = true,
                          .global_block_indices = {2}, .global_block_end_indices = {4}};
  SparseLayout l(c, 1, 6 * 64 - 10);  // 6 blocks, the last one short
  EXPECT_EQ(rows_of(l, 0), (std::vector<std::string>{"100000", "110000", "111000", "111100", "001110", "001111"}));
}

TEST(SparseLayout, BigBirdRandomBlocksAreKeyedBySeedAndHead) {
  SparseAttentionConfig c{.mode = SparsityMode::kBigBird, .block = 32, .different_layout_per_head = true,
                          .num_global_blocks = 1, .num_random_blocks = 2, .num_sliding_window_blocks = 3};
  c.seed = 7;
  SparseLayout a(c, 2, 16 * 32), b(c, 2, 16 * 32);
  c.seed = 8;
  SparseLayout other(c, 2, 16 * 32);
  EXPECT_EQ(rows_of(a, 0), rows_of(b, 0));
  EXPECT_EQ(rows_of(a, 1), rows_of(b, 1));
  EXPECT_NE(rows_of(a, 0), rows_of(a, 1));
  EXPECT_NE(rows_of(a, 0), rows_of(other, 0));
  for (int64_t r = 0; r < 16; ++r) {
    int64_t on = 0;
    for (int64_t col = 0; col < 16; ++col) {
      const bool window = col >= r - 1 && col <= r + 1, global = r == 0 || col == 0;
      if (!window && !global) on += a.block_allowed(0, r, col) ? 1 : 0;
      else EXPECT_TRUE(a.block_allowed(0, r, col)) << r << "," << col;
    }
    EXPECT_LE(on, 2) << "row " << r;  // the random ones (some may fall on the window or the global column)
  }
}

TEST(SparseLayout, RefusalsNameTheKey) {
  auto message = [](const SparseAttentionConfig& c) {
    try {
      SparseLayout l(c, 4, 256);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({.block = 48}).find("sparse_attention.block: 48 does not line up"), std::string::npos);
  EXPECT_NE(message({.num_local_blocks = 4, .num_global_blocks = 3}).find("sparse_attention.num_global_blocks"),
            std::string::npos);
  EXPECT_NE(message({.num_different_global_patterns = 2}).find("sparse_attention.num_different_global_patterns"),
            std::string::npos);
  EXPECT_NE(message({.unidirectional = true, .horizontal_global_attention = true})
                .find("sparse_attention.horizontal_global_attention"),
            std::string::npos);
  EXPECT_NE(message({.mode = SparsityMode::kBigBird, .num_sliding_window_blocks = 40})
                .find("sparse_attention.num_sliding_window_blocks: 40 is more than the 16 blocks"),
            std::string::npos);
  EXPECT_NE(message({.mode = SparsityMode::kBsLongformer, .global_block_indices = {0, 3},
                     .global_block_end_indices = {2}})
                .find("sparse_attention.global_block_end_indices"),
            std::string::npos);
}

struct Dims {
  int64_t B, T, Hq, Hkv, hd;
};

Vec random_vec(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  Vec x(n);
  for (double& e : x) e = dist(gen);
  return x;
}

Tensor to_tensor(const Vec& x, memory::Shape shape) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  for (size_t i = 0; i < x.size(); ++i) t.data<float>()[i] = static_cast<float>(x[i]);
  return t;
}

// Attention in double with an explicit (T, T) mask per head: mask(h, i, j). Forward output and the
// gradients of sum(out * w) (analytic: dP = dO v, dS = P (dP - rowsum(P dP)), as any softmax).
struct Reference {
  Vec out, dq, dk, dv;
};
template <typename Mask>
Reference masked_attention(const Vec& q, const Vec& k, const Vec& v, const Vec& w, const Dims& d, Mask mask) {
  Reference r{Vec(q.size()), Vec(q.size()), Vec(k.size()), Vec(v.size())};
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.hd));
  const int64_t G = d.Hq / d.Hkv;
  auto at = [&](int64_t b, int64_t t, int64_t h, int64_t heads) { return static_cast<size_t>(((b * d.T + t) * heads + h) * d.hd); };
  std::vector<double> p(static_cast<size_t>(d.T)), dp(static_cast<size_t>(d.T));
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.Hq; ++h)
      for (int64_t i = 0; i < d.T; ++i) {
        double mx = -1e300;
        for (int64_t j = 0; j < d.T; ++j) {
          if (!mask(h, i, j)) continue;
          double dot = 0;
          for (int64_t e = 0; e < d.hd; ++e) dot += q[at(b, i, h, d.Hq) + e] * k[at(b, j, h / G, d.Hkv) + e];
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        double z = 0;
        for (int64_t j = 0; j < d.T; ++j) z += mask(h, i, j) ? (p[j] = std::exp(p[j] - mx)) : (p[j] = 0.0);
        double dsum = 0;
        for (int64_t j = 0; j < d.T; ++j) {
          p[j] /= z;
          double g = 0;
          for (int64_t e = 0; e < d.hd; ++e) {
            r.out[at(b, i, h, d.Hq) + e] += p[j] * v[at(b, j, h / G, d.Hkv) + e];
            g += w[at(b, i, h, d.Hq) + e] * v[at(b, j, h / G, d.Hkv) + e];
          }
          dp[j] = g;
          dsum += p[j] * g;
        }
        for (int64_t j = 0; j < d.T; ++j) {
          if (p[j] == 0.0) continue;
          const double ds = p[j] * (dp[j] - dsum) * scale;
          for (int64_t e = 0; e < d.hd; ++e) {
            r.dq[at(b, i, h, d.Hq) + e] += ds * k[at(b, j, h / G, d.Hkv) + e];
            r.dk[at(b, j, h / G, d.Hkv) + e] += ds * q[at(b, i, h, d.Hq) + e];
            r.dv[at(b, j, h / G, d.Hkv) + e] += p[j] * w[at(b, i, h, d.Hq) + e];
          }
        }
      }
  return r;
}

struct Fused {
  Tensor out, dq, dk, dv;
};
Fused run_fused(const Vec& q, const Vec& k, const Vec& v, const Vec& w, const Dims& d, const BlockSparsity& sp) {
  HostContext ctx;
  const Tensor qt = to_tensor(q, {d.B, d.T, d.Hq * d.hd}), kt = to_tensor(k, {d.B, d.T, d.Hkv * d.hd}),
               vt = to_tensor(v, {d.B, d.T, d.Hkv * d.hd});
  FusedAttentionSaved s = fused_attention_forward(ctx, {qt, 0, d.Hq}, {kt, 0, d.Hkv}, {vt, 0, d.Hkv}, d.hd, DType::kF32, sp);
  Fused f{s.out, Tensor::empty(qt.shape(), DType::kF32), Tensor::empty(kt.shape(), DType::kF32),
          Tensor::empty(vt.shape(), DType::kF32)};
  fused_attention_backward(ctx, {qt, 0, d.Hq}, {kt, 0, d.Hkv}, {vt, 0, d.Hkv}, s, to_tensor(w, s.out.shape()), d.hd,
                           DType::kF32, {f.dq, 0, d.Hq}, {f.dk, 0, d.Hkv}, {f.dv, 0, d.Hkv}, sp);
  return f;
}

void expect_close(const char* what, const Tensor& got, const Vec& want) {
  double mx = 1e-30;
  for (double e : want) mx = std::max(mx, std::abs(e));
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got.data<float>()[i], want[i], 1e-5 * mx) << what << "[" << i << "]";
  }
}

void check_layout(const SparseAttentionConfig& c, const Dims& d) {
  const SparseLayout layout(c, d.Hq, d.T + 5);
  const size_t nq = static_cast<size_t>(d.B * d.T * d.Hq * d.hd), nk = static_cast<size_t>(d.B * d.T * d.Hkv * d.hd);
  const Vec q = random_vec(nq, 1), k = random_vec(nk, 2), v = random_vec(nk, 3), w = random_vec(nq, 4);
  const Fused f = run_fused(q, k, v, w, d, {&layout, 0});
  const Reference r = masked_attention(q, k, v, w, d, [&](int64_t h, int64_t i, int64_t j) { return layout.allows(h, i, j); });
  expect_close("out", f.out, r.out);
  expect_close("dq", f.dq, r.dq);
  expect_close("dk", f.dk, r.dk);
  expect_close("dv", f.dv, r.dv);
  // The layout masks something here: the sparse result is not the dense one.
  const Reference dense = masked_attention(q, k, v, w, d, [](int64_t, int64_t i, int64_t j) { return j <= i; });
  double diff = 0;
  for (size_t i = 0; i < nq; ++i) diff = std::max(diff, std::abs(dense.out[i] - r.out[i]));
  EXPECT_GT(diff, 1e-3) << "the layout masks nothing at this length: the test would not see a kernel ignoring it";
}

TEST(SparseFusedAttention, FixedBlock16MatchesTheMaskedReference) {
  // Partial 64 x 64 tiles everywhere (16-position layout blocks), a layout per head, GQA, T % 64 != 0.
  check_layout({.mode = SparsityMode::kFixed, .block = 16, .different_layout_per_head = true, .num_local_blocks = 2,
                .horizontal_global_attention = true, .num_different_global_patterns = 2},
               {.B = 2, .T = 150, .Hq = 4, .Hkv = 2, .hd = 8});
}

TEST(SparseFusedAttention, BigBirdBlock32MatchesTheMaskedReference) {
  check_layout({.mode = SparsityMode::kBigBird, .block = 32, .different_layout_per_head = true, .unidirectional = true,
                .num_random_blocks = 1, .num_sliding_window_blocks = 3},
               {.B = 1, .T = 300, .Hq = 2, .Hkv = 2, .hd = 16});
}

TEST(SparseFusedAttention, BsLongformerBlock64AndBlock128MatchTheMaskedReference) {
  // Whole tiles only: the kernel skips or runs the dense path.
  check_layout({.mode = SparsityMode::kBsLongformer, .block = 64, .num_sliding_window_blocks = 1,
                .global_block_indices = {1}},
               {.B = 1, .T = 330, .Hq = 2, .Hkv = 1, .hd = 8});
  check_layout({.mode = SparsityMode::kBsLongformer, .block = 128, .num_sliding_window_blocks = 1,
                .global_block_indices = {0}},
               {.B = 1, .T = 400, .Hq = 1, .Hkv = 1, .hd = 8});
}

TEST(SparseFusedAttention, DenseLayoutIsTheDenseKernelBitForBit) {
  const Dims d{.B = 1, .T = 130, .Hq = 2, .Hkv = 2, .hd = 8};
  const SparseLayout layout({.mode = SparsityMode::kDense, .block = 16}, d.Hq, d.T);
  const size_t nq = static_cast<size_t>(d.B * d.T * d.Hq * d.hd);
  const Vec q = random_vec(nq, 5), k = random_vec(nq, 6), v = random_vec(nq, 7), w = random_vec(nq, 8);
  const Fused a = run_fused(q, k, v, w, d, {&layout, 0}), b = run_fused(q, k, v, w, d, {});
  const std::vector<std::pair<Tensor, Tensor>> pairs = {{a.out, b.out}, {a.dq, b.dq}, {a.dk, b.dk}, {a.dv, b.dv}};
  for (const auto& [x, y] : pairs) {
    for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(x.data<float>()[i], y.data<float>()[i]) << i;
  }
}

TEST(SparseFusedAttention, TensorParallelHeadsReadTheirOwnLayouts) {
  // Heads 2..3 of a 4-head layout (first_head 2, as tensor-parallel rank 1 of 2) equal heads 2..3 of
  // the whole attention.
  const Dims whole{.B = 1, .T = 96, .Hq = 4, .Hkv = 4, .hd = 8}, half{.B = 1, .T = 96, .Hq = 2, .Hkv = 2, .hd = 8};
  const SparseLayout layout({.mode = SparsityMode::kFixed, .block = 16, .different_layout_per_head = true,
                             .num_different_global_patterns = 4},
                            4, 96);
  const Vec q = random_vec(96 * 4 * 8, 1), k = random_vec(96 * 4 * 8, 2), v = random_vec(96 * 4 * 8, 3),
            w = random_vec(96 * 4 * 8, 4);
  auto heads23 = [](const Vec& x) {
    Vec out;
    for (int64_t t = 0; t < 96; ++t) out.insert(out.end(), x.begin() + (t * 4 + 2) * 8, x.begin() + (t * 4 + 4) * 8);
    return out;
  };
  const Fused a = run_fused(q, k, v, w, whole, {&layout, 0});
  const Fused b = run_fused(heads23(q), heads23(k), heads23(v), heads23(w), half, {&layout, 2});
  for (int64_t t = 0; t < 96; ++t) {
    for (int64_t e = 0; e < 16; ++e) {
      ASSERT_NEAR(a.out.data<float>()[(t * 4 + 2) * 8 + e], b.out.data<float>()[t * 16 + e], 1e-5) << t << "," << e;
      ASSERT_NEAR(a.dq.data<float>()[(t * 4 + 2) * 8 + e], b.dq.data<float>()[t * 16 + e], 1e-5) << t << "," << e;
    }
  }
}

}  // namespace
}  // namespace zs::nn
