#include "nn/fused_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/errors.h"
#include "memory/cpu_features.h"
#include "nn/detail/attention_rows.h"
#include "nn/detail/gemm.h"
#include "nn/detail/parallel.h"
#include "nn/flops.h"

// Note [fused attention]
// FlashAttention (Dao et al. 2022; FlashAttention-2's loop order) on the CPU. The forward takes one
// query block of kBr rows of one head of one sequence per task, tasks spread over the compute threads.
// It walks the key blocks of kBc columns up to its last row (causal: later keys are never read):
//   S = scale Q_i K_j^T                  (kBr x kBc, detail::gemm into the thread's scratch)
//   online softmax (attention_rows.h):   m_new = max(m, rowmax S), P = exp(S - m_new),
//                                        l = l e^(m - m_new) + rowsum P, O *= e^(m - m_new)
//   O += P V_j                           (detail::gemm, accumulating in the output rows themselves)
// and finishes with O /= l and lse = m + log l. So the scores exist one block per thread at a time:
// activation memory is the output (which the projection after it saves anyway) plus T floats per
// head. The backward takes one (sequence, query head) per task - its dQ rows are its own - and walks
// the key blocks j and, inside, the query blocks i >= j, recomputing P from the saved lse:
//   S = scale Q_i K_j^T, dP = dO_i V_j^T, P = exp(S - lse_i), dS = P (dP - D_i)  (D = rowsum(dO O))
//   dV_j += P^T dO_i, dQ_i += scale dS K_j, dK_j += scale dS^T Q_i
// That is five products per block where the plain kernel's backward, which saved P, does four. Under
// grouped-query attention several query heads add into one kv head's dK, dV: each task writes its own
// (T, hd) partials and a last pass sums them in head order, so results never depend on the threads.
// Blocks: kBr = kBc = 64 keeps S, dP (16 KiB each) and the operands' rows in L1/L2 while a block's
// five products run; with hd = 64 the products are 64 x 64 x 64, large enough for sgemm's kernels.
// The products are detail::gemm (OpenBLAS's sgemm single-threaded per task, or the AVX512-BF16 kernel
// for bf16), so the fused and plain kernels share their products' arithmetic; the softmax rows run in
// per-ISA kernels. Masked (future) positions come out as exact zeros in P and dS.
//
// Note [sparse tiles]
// With a block-sparse layout (nn/sparse_attention.h) each 64 x 64 tile is classified before its
// products: a tile none of whose causal positions the layout allows is skipped in the forward and
// the backward (no products, no softmax); one whose causal positions are all allowed runs exactly the
// dense path (so the "dense" layout gives the dense kernel's results bit for bit); the rest (layout
// blocks smaller than 64 that only partly cover the tile) run the products and a masked row pass:
// the forward's online softmax over the allowed positions only (scalar, exp from <cmath>), and in the
// backward the dense P and dS with the masked positions set to exact zeros. A layout block that is a
// multiple of 64 never makes a partial tile; one that divides 64 makes partial tiles only where the
// layout's edges cross a tile. Other block sizes are refused (SparseAttentionConfig::block).

namespace zs::nn {

using detail::Matrix;
using memory::DType;
using memory::Tensor;

namespace {

constexpr int64_t kBr = 64;  // query rows per block
constexpr int64_t kBc = 64;  // key columns per block

// Element (b, t, head) of a (B, T, W) view: the head's first element; rows of one head are W apart.
struct HeadView {
  char* base = nullptr;
  DType dtype = DType::kF32;
  int64_t T = 0, W = 0, col = 0, hd = 0;

  char* at(int64_t b, int64_t t, int64_t h) const {
    return base + static_cast<ptrdiff_t>(((b * T + t) * W + col + h * hd) * static_cast<int64_t>(memory::dtype_size(dtype)));
  }
  float* f32(int64_t b, int64_t t, int64_t h) const { return reinterpret_cast<float*>(at(b, t, h)); }
  Matrix rows(int64_t b, int64_t t, int64_t h, bool trans = false) const { return {at(b, t, h), dtype, W, trans}; }
};

struct Geometry {
  int64_t B = 0, T = 0, Hq = 0, Hkv = 0, hd = 0;
  int64_t group() const { return Hq / Hkv; }
};

HeadView view_of(const AttentionHeads& x, const Geometry& g, const char* what, bool gradient) {
  const Tensor& t = x.tensor;
  ZS_MODEL_CHECK(t.dim() == 3 && t.is_contiguous(), "fused attention: {} must be a contiguous (B, T, W) tensor, got {}",
                 what, memory::shape_string(t.shape()));
  ZS_MODEL_CHECK(t.size(0) == g.B && t.size(1) == g.T, "fused attention: {} is {}, expected (B, T) = ({}, {}) as q",
                 what, memory::shape_string(t.shape()), g.B, g.T);
  if (gradient) {
    ZS_MODEL_CHECK(t.dtype() == DType::kF32, "fused attention: gradient {} must be fp32, got {}", what,
                   memory::dtype_name(t.dtype()));
  } else {
    ZS_MODEL_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16, "fused attention: {} must be fp32 or bf16, got {}",
                   what, memory::dtype_name(t.dtype()));
  }
  ZS_MODEL_CHECK(x.col >= 0 && x.heads > 0 && x.col + x.heads * g.hd <= t.size(2),
                 "fused attention: {} heads {} x head_dim {} from column {} do not fit its width {}", what, x.heads, g.hd,
                 x.col, t.size(2));
  return {static_cast<char*>(t.raw()), t.dtype(), g.T, t.size(2), x.col, g.hd};
}

Geometry geometry_of(const AttentionHeads& q, const AttentionHeads& k, const AttentionHeads& v, int64_t head_dim) {
  ZS_MODEL_CHECK(q.tensor.dim() == 3, "fused attention: q must be (B, T, W), got {}",
                 memory::shape_string(q.tensor.shape()));
  ZS_MODEL_CHECK(head_dim > 0, "fused attention: head_dim must be > 0, got {}", head_dim);
  ZS_MODEL_CHECK(k.heads == v.heads, "fused attention: k has {} heads but v has {}", k.heads, v.heads);
  ZS_MODEL_CHECK(k.heads > 0 && q.heads > 0 && q.heads % k.heads == 0,
                 "fused attention: the {} kv heads must divide the {} query heads (grouped-query attention)", k.heads,
                 q.heads);
  return {q.tensor.size(0), q.tensor.size(1), q.heads, k.heads, head_dim};
}

// As nn::Linear: bf16 weights take the bf16 products, any other dtype (fp32, fp16) fp32 ones.
detail::GemmPath path_of(DType compute) { return detail::gemm_path_for(compute); }

int64_t blocks(int64_t n, int64_t b) { return (n + b - 1) / b; }

// The tile's kind under `sp` for query head h (kFull without a layout).
SparseLayout::Tile tile_of(const BlockSparsity& sp, int64_t h, int64_t q0, int64_t rows, int64_t k0, int64_t cols) {
  return sp.layout == nullptr ? SparseLayout::Tile::kFull : sp.layout->tile(sp.first_head + h, q0, rows, k0, cols);
}

// The forward's online softmax of a partial tile (Note [sparse tiles]): as the row kernel's, over the
// positions the layout allows (causal included); the others come out as exact zeros in P.
void masked_online_softmax(const BlockSparsity& sp, int64_t h, int64_t q0, int64_t k0, float* s, int64_t ld,
                           int64_t rows, int64_t cols, float* m, float* l, float* o, int64_t ldo, int64_t hd) {
  const SparseLayout& lay = *sp.layout;
  const int64_t head = sp.first_head + h;
  for (int64_t i = 0; i < rows; ++i) {
    float* row = s + i * ld;
    float mx = -std::numeric_limits<float>::infinity();
    bool any = false;
    for (int64_t j = 0; j < cols; ++j) {
      if (lay.allows(head, q0 + i, k0 + j)) {
        mx = std::max(mx, row[j]);
        any = true;
      }
    }
    if (!any) {
      std::fill_n(row, cols, 0.0f);
      continue;
    }
    const float m_new = std::max(m[i], mx);
    const float alpha = m[i] == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(m[i] - m_new);
    float sum = 0.0f;
    for (int64_t j = 0; j < cols; ++j) {
      const float p = lay.allows(head, q0 + i, k0 + j) ? std::exp(row[j] - m_new) : 0.0f;
      row[j] = p;
      sum += p;
    }
    l[i] = l[i] * alpha + sum;
    m[i] = m_new;
    if (alpha != 1.0f) {
      float* orow = o + i * ldo;
      for (int64_t d = 0; d < hd; ++d) orow[d] *= alpha;
    }
  }
}

// The backward of a partial tile: P and dS at the positions the layout masks set to zero.
void mask_tile(const BlockSparsity& sp, int64_t h, int64_t q0, int64_t k0, float* s, float* dp, int64_t ld, int64_t rows,
               int64_t cols) {
  const int64_t head = sp.first_head + h;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      if (!sp.layout->allows(head, q0 + i, k0 + j)) s[i * ld + j] = dp[i * ld + j] = 0.0f;
    }
  }
}

void check_sparsity(const BlockSparsity& sp, const Geometry& g) {
  if (sp.layout == nullptr) return;
  ZS_MODEL_CHECK(sp.first_head >= 0 && sp.first_head + g.Hq <= sp.layout->n_head(),
                 "fused attention: query heads {}..{} are outside the sparse layout's {} heads", sp.first_head,
                 sp.first_head + g.Hq - 1, sp.layout->n_head());
  ZS_MODEL_CHECK(g.T <= sp.layout->num_blocks() * sp.layout->block(),
                 "fused attention: sequence length {} is longer than the sparse layout's {} positions (the model's "
                 "longest sequence)",
                 g.T, sp.layout->num_blocks() * sp.layout->block());
}

}  // namespace

FusedAttentionSaved fused_attention_forward(Context& ctx, const AttentionHeads& q, const AttentionHeads& k,
                                            const AttentionHeads& v, int64_t head_dim, DType compute,
                                            const BlockSparsity& sparsity) {
  const Geometry g = geometry_of(q, k, v, head_dim);
  check_sparsity(sparsity, g);
  const HeadView qv = view_of(q, g, "q", false), kv = view_of(k, g, "k", false), vv = view_of(v, g, "v", false);
  const detail::GemmPath path = path_of(compute);
  const detail::AttentionRowKernels& rk = detail::attention_row_kernels(memory::best_isa());
  const int64_t B = g.B, T = g.T, Hq = g.Hq, hd = g.hd, G = g.group(), nqb = blocks(T, kBr);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  FusedAttentionSaved saved{ctx.allocate({B, T, Hq * hd}, DType::kF32, MemoryUse::kActivation),
                            ctx.allocate({B, Hq, T}, DType::kF32, MemoryUse::kActivation)};
  detail::SingleThreadedBlas blas;  // one product per thread (Note [compute threads])
  const int chunks = detail::parallel_chunks(blas.threads(), B * Hq * nqb, 1);
  const Tensor scratch = ctx.allocate({chunks, kBr * kBc + 2 * kBr}, DType::kF32, MemoryUse::kScratch);
  const HeadView ov{static_cast<char*>(saved.out.raw()), DType::kF32, T, Hq * hd, 0, hd};
  float* lse = saved.lse.data<float>();
  float* scratch_p = scratch.data<float>();
  detail::parallel_for_threads(blas.threads(), B * Hq * nqb, 1, [=, &rk](int64_t t0, int64_t t1, int chunk) {
    float* s = scratch_p + chunk * (kBr * kBc + 2 * kBr);
    float* m = s + kBr * kBc;
    float* l = m + kBr;
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t b = task / (Hq * nqb), h = task / nqb % Hq, q0 = task % nqb * kBr;
      const int64_t rows = std::min(kBr, T - q0), kvh = h / G, end = q0 + rows;
      float* o = ov.f32(b, q0, h);
      for (int64_t i = 0; i < rows; ++i) std::fill_n(o + i * ov.W, hd, 0.0f);
      std::fill_n(m, rows, -std::numeric_limits<float>::infinity());
      std::fill_n(l, rows, 0.0f);
      for (int64_t k0 = 0; k0 < end; k0 += kBc) {
        const int64_t cols = std::min(kBc, end - k0);
        const SparseLayout::Tile tile = tile_of(sparsity, h, q0, rows, k0, cols);
        if (tile == SparseLayout::Tile::kEmpty) continue;  // Note [sparse tiles]
        detail::gemm(path, rows, cols, hd, scale, qv.rows(b, q0, h), kv.rows(b, k0, kvh, true), 0.0f, s, kBc);
        if (tile == SparseLayout::Tile::kFull) {
          rk.online_softmax(s, kBc, rows, cols, q0 - k0 + 1, m, l, o, ov.W, hd);
        } else {
          masked_online_softmax(sparsity, h, q0, k0, s, kBc, rows, cols, m, l, o, ov.W, hd);
        }
        detail::gemm(path, rows, hd, cols, 1.0f, Matrix::f32(s, kBc), vv.rows(b, k0, kvh), 1.0f, o, ov.W);
      }
      float* lse_row = lse + (b * Hq + h) * T + q0;
      for (int64_t i = 0; i < rows; ++i) {
        const float inv = 1.0f / l[i];
        float* orow = o + i * ov.W;
        for (int64_t d = 0; d < hd; ++d) orow[d] *= inv;
        lse_row[i] = m[i] + std::log(l[i]);
      }
    }
  });
  return saved;
}

void fused_attention_backward(Context& ctx, const AttentionHeads& q, const AttentionHeads& k, const AttentionHeads& v,
                              const FusedAttentionSaved& saved, const Tensor& dout, int64_t head_dim, DType compute,
                              const AttentionHeads& dq, const AttentionHeads& dk, const AttentionHeads& dv,
                              const BlockSparsity& sparsity) {
  const Geometry g = geometry_of(q, k, v, head_dim);
  check_sparsity(sparsity, g);
  const HeadView qv = view_of(q, g, "q", false), kv = view_of(k, g, "k", false), vv = view_of(v, g, "v", false);
  const HeadView dqv = view_of(dq, g, "dq", true), dkv = view_of(dk, g, "dk", true), dvv = view_of(dv, g, "dv", true);
  ZS_MODEL_CHECK(dq.heads == g.Hq && dk.heads == g.Hkv && dv.heads == g.Hkv,
                 "fused attention: gradients have {}/{}/{} heads, expected {}/{}/{} as q/k/v", dq.heads, dk.heads,
                 dv.heads, g.Hq, g.Hkv, g.Hkv);
  const int64_t B = g.B, T = g.T, Hq = g.Hq, Hkv = g.Hkv, hd = g.hd, G = g.group();
  for (const Tensor* t : {&dout, &saved.out}) {
    ZS_MODEL_CHECK(t->dtype() == DType::kF32 && t->is_contiguous() && t->shape() == (memory::Shape{B, T, Hq * hd}),
                   "fused attention: dout and the saved output must be contiguous fp32 ({}, {}, {}), got {}", B, T,
                   Hq * hd, memory::shape_string(t->shape()));
  }
  ZS_MODEL_CHECK(saved.lse.dtype() == DType::kF32 && saved.lse.shape() == (memory::Shape{B, Hq, T}),
                 "fused attention: the saved lse must be fp32 ({}, {}, {}), got {}", B, Hq, T,
                 memory::shape_string(saved.lse.shape()));
  const detail::GemmPath path = path_of(compute);
  const detail::AttentionRowKernels& rk = detail::attention_row_kernels(memory::best_isa());
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  detail::SingleThreadedBlas blas;
  const int chunks = detail::parallel_chunks(blas.threads(), B * Hq, 1);
  const int64_t per_chunk = 2 * kBr * kBc + T;
  const Tensor scratch = ctx.allocate({chunks, per_chunk}, DType::kF32, MemoryUse::kScratch);
  // Grouped-query attention: each query head's dK, dV partials, (2, B, Hq, T, hd), summed below.
  const Tensor parts = G > 1 ? ctx.allocate({2, B, Hq, T, hd}, DType::kF32, MemoryUse::kScratch) : Tensor();
  const HeadView ov{static_cast<char*>(saved.out.raw()), DType::kF32, T, Hq * hd, 0, hd};
  const HeadView dov{static_cast<char*>(dout.raw()), DType::kF32, T, Hq * hd, 0, hd};
  // Partials as (B*Hq, T, hd) views: "batch" b * Hq + h, one head.
  const HeadView dk_part{G > 1 ? static_cast<char*>(parts.raw()) : nullptr, DType::kF32, T, hd, 0, hd};
  const HeadView dv_part{G > 1 ? static_cast<char*>(parts.raw()) + B * Hq * T * hd * 4 : nullptr, DType::kF32, T, hd, 0,
                         hd};
  const float* lse_p = saved.lse.data<float>();
  float* scratch_p = scratch.data<float>();
  detail::parallel_for_threads(blas.threads(), B * Hq, 1, [=, &rk](int64_t t0, int64_t t1, int chunk) {
    float* s = scratch_p + chunk * per_chunk;
    float* dp = s + kBr * kBc;
    float* dsum = dp + kBr * kBc;
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t b = task / Hq, h = task % Hq, kvh = h / G;
      const float* lse = lse_p + task * T;
      for (int64_t t = 0; t < T; ++t) {
        const float* o = ov.f32(b, t, h);
        const float* d = dov.f32(b, t, h);
        float acc = 0.0f;
        for (int64_t c = 0; c < hd; ++c) acc += o[c] * d[c];
        dsum[t] = acc;
      }
      // This task's dK, dV rows: the kv head's own (one query head per kv head) or its partials.
      const HeadView& dkt = G > 1 ? dk_part : dkv;
      const HeadView& dvt = G > 1 ? dv_part : dvv;
      const int64_t tb = G > 1 ? task : b, th = G > 1 ? 0 : kvh;
      for (int64_t t = 0; t < T; ++t) {
        std::fill_n(dqv.f32(b, t, h), hd, 0.0f);
        std::fill_n(dkt.f32(tb, t, th), hd, 0.0f);
        std::fill_n(dvt.f32(tb, t, th), hd, 0.0f);
      }
      for (int64_t k0 = 0; k0 < T; k0 += kBc) {
        const int64_t cols = std::min(kBc, T - k0);
        float* dkj = dkt.f32(tb, k0, th);
        float* dvj = dvt.f32(tb, k0, th);
        for (int64_t q0 = k0 / kBr * kBr; q0 < T; q0 += kBr) {
          const int64_t rows = std::min(kBr, T - q0);
          const SparseLayout::Tile tile = tile_of(sparsity, h, q0, rows, k0, cols);
          if (tile == SparseLayout::Tile::kEmpty) continue;  // Note [sparse tiles]
          const Matrix doi = Matrix::f32(dov.f32(b, q0, h), dov.W);
          detail::gemm(path, rows, cols, hd, scale, qv.rows(b, q0, h), kv.rows(b, k0, kvh, true), 0.0f, s, kBc);
          add_flops_recomputed(2 * static_cast<uint64_t>(rows * cols * hd));  // nn/flops.h
          detail::gemm(path, rows, cols, hd, 1.0f, doi, vv.rows(b, k0, kvh, true), 0.0f, dp, kBc);
          rk.softmax_grad(s, dp, kBc, rows, cols, q0 - k0 + 1, lse + q0, dsum + q0);
          if (tile == SparseLayout::Tile::kPartial) mask_tile(sparsity, h, q0, k0, s, dp, kBc, rows, cols);
          detail::gemm(path, cols, hd, rows, 1.0f, Matrix::f32(s, kBc, true), doi, 1.0f, dvj, dvt.W);
          detail::gemm(path, rows, hd, cols, scale, Matrix::f32(dp, kBc), kv.rows(b, k0, kvh), 1.0f, dqv.f32(b, q0, h),
                       dqv.W);
          detail::gemm(path, cols, hd, rows, scale, Matrix::f32(dp, kBc, true), qv.rows(b, q0, h), 1.0f, dkj, dkt.W);
        }
      }
    }
  });
  if (G > 1) {
    // dK, dV of kv head j: the sum of its G query heads' partials, in head order.
    detail::parallel_for_threads(blas.threads(), B * Hkv * T, 64, [=](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t b = r / (Hkv * T), j = r / T % Hkv, t = r % T;
        for (int which = 0; which < 2; ++which) {
          const HeadView& part = which == 0 ? dk_part : dv_part;
          float* out = (which == 0 ? dkv : dvv).f32(b, t, j);
          const float* first = part.f32(b * Hq + j * G, t, 0);
          std::copy_n(first, hd, out);
          for (int64_t gi = 1; gi < G; ++gi) {
            const float* p = part.f32(b * Hq + j * G + gi, t, 0);
            for (int64_t c = 0; c < hd; ++c) out[c] += p[c];
          }
        }
      }
    });
  }
}

}  // namespace zs::nn
