// The AVX512-BF16 product of nn/detail/gemm.h (Note [bf16 products]); compiled with -mavx512bf16
// (zs_isa_sources) and only called where cpu_has_avx512_bf16().
//
// Note [bf16 kernel blocking]: the GotoBLAS/BLIS loop nest. C is cut into kMc x kNc blocks and k into
// kKc slices; per (n block, k slice) a thread packs op(B) into panels of kNr = 32 columns, per m block
// it packs op(A) into strips of kMr = 12 rows, and the micro-kernel multiplies a strip by a panel into
// a 12 x 32 fp32 tile held in 24 zmm registers. vdpbf16ps multiplies bf16 pairs along k, so both
// packings store k in pairs: a 32-bit word (op(X)[2q][j], op(X)[2q+1][j]) (an odd k is padded with a
// zero), B words 32 per pair (two zmm loads), A words 12 per pair (broadcast to all lanes from memory).
// Rounding to bf16 happens while packing (memory::simd::bf16_round, the library's one rounding rule).
// Sizes: a B block is kKc/2 x kNc words (384 KiB, in L2 beside the A block), a B panel kKc/2 x 32
// words (16 KiB, in L1 while the strips of the A block stream past it), an A block kMc x kKc bf16
// (48 KiB). Threads split C's rows (or its columns when there are few rows), and each packs the
// blocks it uses: a thread packs all of B for its rows, the cost of one pass over B per thread, small
// against the product's m/threads multiplications per element of B.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <utility>

#include "memory/simd_bf16.h"
#include "nn/detail/gemm_kernels.h"
#include "nn/detail/parallel.h"

// GCC 12 reports the undefined upper halves inside its own AVX-512 intrinsics (_mm512_castsi256_si512,
// the masked loads) as maybe-uninitialized: a false positive of the headers, not of this file.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace zs::nn::detail {
namespace {

constexpr int kMr = 12;
constexpr int kNr = 32;
constexpr int64_t kKc = 256;  // k per slice (even)
constexpr int64_t kMc = 96;   // multiple of kMr
constexpr int64_t kNc = 768;  // multiple of kNr

struct FreeDeleter {
  void operator()(uint32_t* p) const { std::free(p); }
};

// A thread's packing buffers, 64-byte aligned, allocated on first use and kept for the thread's life.
struct PackBuffers {
  std::unique_ptr<uint32_t[], FreeDeleter> a{static_cast<uint32_t*>(std::aligned_alloc(64, kMc * kKc / 2 * 4))};
  std::unique_ptr<uint32_t[], FreeDeleter> b{static_cast<uint32_t*>(std::aligned_alloc(64, kKc / 2 * kNc * 4))};
};

PackBuffers& pack_buffers() {
  static thread_local PackBuffers buffers;
  return buffers;
}

// Up to 16 consecutive elements from p (fp32 or bf16) as bf16 bits in the low halves of 32-bit
// lanes; lanes past `count` are zero.
inline __m512i load_bf16_lanes(const void* p, bool bf16, int count) {
  const __mmask16 mask = count >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << count) - 1);
  if (bf16) return _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p));
  return memory::simd::bf16_round(_mm512_maskz_loadu_ps(mask, p));
}

// Packs rows [r0, r0 + rows) x k [p0, p0 + kc) of op(X), whose k runs along the stored rows' length
// (A not transposed, B transposed), as words out[q * stride + r - r0].
void pack_k_contiguous(const Matrix& x, int64_t r0, int64_t rows, int64_t p0, int64_t kc, uint32_t* out,
                       int64_t stride) {
  const bool bf16 = x.dtype == memory::DType::kBF16;
  const int64_t esize = bf16 ? 2 : 4;
  const int64_t kcp = (kc + 1) / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const char* src = static_cast<const char*>(x.data) + ((r0 + r) * x.ld + p0) * esize;
    uint32_t* dst = out + r;
    for (int64_t p = 0; p < kc; p += 32) {
      const int n0 = static_cast<int>(std::min<int64_t>(16, kc - p));
      const int n1 = static_cast<int>(std::min<int64_t>(16, std::max<int64_t>(0, kc - p - 16)));
      const __m512i lo = load_bf16_lanes(src + p * esize, bf16, n0);
      const __m512i hi = n1 > 0 ? load_bf16_lanes(src + (p + 16) * esize, bf16, n1) : _mm512_setzero_si512();
      // 32 bf16 in order = 16 words of consecutive pairs.
      alignas(64) uint32_t words[16];
      const __m512i packed = _mm512_castsi256_si512(_mm512_cvtepi32_epi16(lo));
      _mm512_store_si512(words, _mm512_inserti64x4(packed, _mm512_cvtepi32_epi16(hi), 1));
      const int64_t q0 = p / 2;
      const int64_t nq = std::min<int64_t>(16, kcp - q0);
      for (int64_t q = 0; q < nq; ++q) dst[(q0 + q) * stride] = words[q];
    }
  }
}

// Packs columns [c0, c0 + cols) x k [p0, p0 + kc) of op(X), whose columns run along the stored rows
// (A transposed, B not transposed), as words out[q * stride + c - c0]; cols <= stride.
void pack_k_strided(const Matrix& x, int64_t c0, int64_t cols, int64_t p0, int64_t kc, uint32_t* out,
                    int64_t stride) {
  const bool bf16 = x.dtype == memory::DType::kBF16;
  const int64_t esize = bf16 ? 2 : 4;
  const char* base = static_cast<const char*>(x.data);
  for (int64_t q = 0; q < (kc + 1) / 2; ++q) {
    const int64_t p = p0 + 2 * q;
    const bool has_hi = 2 * q + 1 < kc;
    const char* row0 = base + (p * x.ld + c0) * esize;
    const char* row1 = row0 + x.ld * esize;
    for (int64_t c = 0; c < cols; c += 16) {
      const int n = static_cast<int>(std::min<int64_t>(16, cols - c));
      const __m512i lo = load_bf16_lanes(row0 + c * esize, bf16, n);
      const __m512i hi = has_hi ? load_bf16_lanes(row1 + c * esize, bf16, n) : _mm512_setzero_si512();
      const __m512i w = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
      _mm512_mask_storeu_epi32(out + q * stride + c, n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1), w);
    }
  }
}

// op(A) rows [i0, i0 + rows) x k slice into strips of kMr rows: strip s, pair q, row r at
// out[(s * kcp + q) * kMr + r]; rows past the end are zero.
void pack_a(const Matrix& a, int64_t i0, int64_t rows, int64_t p0, int64_t kc, uint32_t* out) {
  const int64_t kcp = (kc + 1) / 2;
  for (int64_t s = 0; s * kMr < rows; ++s) {
    const int64_t r = std::min<int64_t>(kMr, rows - s * kMr);
    uint32_t* strip = out + s * kcp * kMr;
    if (r < kMr) std::fill_n(strip, kcp * kMr, 0u);
    if (a.trans) {
      pack_k_strided(a, i0 + s * kMr, r, p0, kc, strip, kMr);
    } else {
      pack_k_contiguous(a, i0 + s * kMr, r, p0, kc, strip, kMr);
    }
  }
}

// op(B) columns [j0, j0 + cols) x k slice into panels of kNr columns: panel t, pair q, column c at
// out[(t * kcp + q) * kNr + c]; columns past the end are zero.
void pack_b(const Matrix& b, int64_t j0, int64_t cols, int64_t p0, int64_t kc, uint32_t* out) {
  const int64_t kcp = (kc + 1) / 2;
  for (int64_t t = 0; t * kNr < cols; ++t) {
    const int64_t c = std::min<int64_t>(kNr, cols - t * kNr);
    uint32_t* panel = out + t * kcp * kNr;
    if (c < kNr) std::fill_n(panel, kcp * kNr, 0u);
    if (b.trans) {
      pack_k_contiguous(b, j0 + t * kNr, c, p0, kc, panel, kNr);
    } else {
      pack_k_strided(b, j0 + t * kNr, c, p0, kc, panel, kNr);
    }
  }
}

// C tile (MR x cols, cols <= 32) = alpha * strip . panel + beta * C (beta == 0: C is not read).
template <int MR>
void micro_kernel(int64_t kcp, const uint32_t* a, const uint32_t* b, float* c, int64_t ldc, int cols, float alpha,
                  float beta) {
  __m512 acc0[MR], acc1[MR];
  for (int i = 0; i < MR; ++i) acc0[i] = acc1[i] = _mm512_setzero_ps();
  for (int64_t q = 0; q < kcp; ++q) {
    const __m512bh b0 = (__m512bh)_mm512_load_si512(b + q * kNr);
    const __m512bh b1 = (__m512bh)_mm512_load_si512(b + q * kNr + 16);
    const uint32_t* aq = a + q * kMr;
    for (int i = 0; i < MR; ++i) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(aq[i]));
      acc0[i] = _mm512_dpbf16_ps(acc0[i], av, b0);
      acc1[i] = _mm512_dpbf16_ps(acc1[i], av, b1);
    }
  }
  const __mmask16 m0 = cols >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << cols) - 1);
  const __mmask16 m1 = cols >= 32 ? __mmask16(0xFFFF) : cols > 16 ? __mmask16((1u << (cols - 16)) - 1) : __mmask16(0);
  const __m512 va = _mm512_set1_ps(alpha);
  const __m512 vb = _mm512_set1_ps(beta);
  for (int i = 0; i < MR; ++i) {
    float* row = c + i * ldc;
    __m512 r0 = _mm512_mul_ps(acc0[i], va);
    __m512 r1 = _mm512_mul_ps(acc1[i], va);
    if (beta != 0.0f) {
      r0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m0, row), vb, r0);
      r1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m1, row + 16), vb, r1);
    }
    _mm512_mask_storeu_ps(row, m0, r0);
    _mm512_mask_storeu_ps(row + 16, m1, r1);
  }
}

using MicroKernel = void (*)(int64_t, const uint32_t*, const uint32_t*, float*, int64_t, int, float, float);

template <int... R>
constexpr auto make_kernels(std::integer_sequence<int, R...>) {
  return std::array<MicroKernel, sizeof...(R)>{&micro_kernel<R + 1>...};
}
constexpr auto kKernels = make_kernels(std::make_integer_sequence<int, kMr>{});  // kKernels[r - 1]: r rows

// C rows [i0, i1) x columns [j0, j1) on this thread.
void gemm_block(int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k, float alpha, const Matrix& a,
                const Matrix& b, float beta, float* c, int64_t ldc) {
  PackBuffers& buf = pack_buffers();
  for (int64_t jc = j0; jc < j1; jc += kNc) {
    const int64_t nc = std::min(kNc, j1 - jc);
    for (int64_t pc = 0; pc < k; pc += kKc) {
      const int64_t kc = std::min(kKc, k - pc);
      const int64_t kcp = (kc + 1) / 2;
      const float beta_here = pc == 0 ? beta : 1.0f;  // later k slices add to the first one's result
      pack_b(b, jc, nc, pc, kc, buf.b.get());
      for (int64_t ic = i0; ic < i1; ic += kMc) {
        const int64_t mc = std::min(kMc, i1 - ic);
        pack_a(a, ic, mc, pc, kc, buf.a.get());
        for (int64_t jr = 0; jr < nc; jr += kNr) {
          const uint32_t* panel = buf.b.get() + (jr / kNr) * kcp * kNr;
          const int cols = static_cast<int>(std::min<int64_t>(kNr, nc - jr));
          for (int64_t ir = 0; ir < mc; ir += kMr) {
            const int rows = static_cast<int>(std::min<int64_t>(kMr, mc - ir));
            kKernels[rows - 1](kcp, buf.a.get() + (ir / kMr) * kcp * kMr, panel, c + (ic + ir) * ldc + jc + jr, ldc,
                               cols, alpha, beta_here);
          }
        }
      }
    }
  }
}

}  // namespace

void gemm_avx512bf16(int64_t m, int64_t n, int64_t k, float alpha, const Matrix& a, const Matrix& b, float beta,
                     float* c, int64_t ldc) {
  if (k == 0) {  // no products: C = beta * C
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    }
    return;
  }
  // Split C's rows in whole strips while every thread gets a few; else its columns in whole panels.
  const int64_t strips = (m + kMr - 1) / kMr;
  const int64_t panels = (n + kNr - 1) / kNr;
  const int threads = compute_threads();
  if (strips >= 4 * threads || strips >= panels) {
    parallel_for(strips, 4, [&](int64_t s0, int64_t s1, int) {
      gemm_block(s0 * kMr, std::min(m, s1 * kMr), 0, n, k, alpha, a, b, beta, c, ldc);
    });
  } else {
    parallel_for(panels, 2, [&](int64_t t0, int64_t t1, int) {
      gemm_block(0, m, t0 * kNr, std::min(n, t1 * kNr), k, alpha, a, b, beta, c, ldc);
    });
  }
}

}  // namespace zs::nn::detail
