// The AVX512-BF16 product of nn/detail/gemm.h (Note [bf16 products]); compiled with -mavx512bf16
// (zs_isa_sources) and only called where cpu_has_avx512_bf16().
//
// Note [bf16 kernel blocking]: the GotoBLAS/BLIS loop nest, with op(B) packed once per product. k is
// cut into kKc slices; op(B) is packed slice by slice into panels of kNr = 32 columns; C is cut into
// tiles (Note [bf16 kernel scheduling]), and a tile packs its kMc-row block of op(A) once per k slice
// into strips of kMr = 12 rows and multiplies it by every panel of its columns: the micro-kernel
// multiplies a strip by a panel into a 12 x 32 fp32 tile held in 24 zmm registers. vdpbf16ps
// multiplies bf16 pairs along k, so both packings store k in pairs: a 32-bit word
// (op(X)[2q][j], op(X)[2q+1][j]) (an odd k is padded with a zero), B words 32 per pair (two zmm
// loads), A words 12 per pair (broadcast to all lanes from memory). Rounding to bf16 happens while
// packing (memory::simd::bf16_round, the library's one rounding rule); an operand stored with k along
// its rows is packed 16 rows x 32 k at a time, loaded along k and transposed in registers; one stored
// with k across its rows (dW's two operands, attention's P^T and V) a pair of stored rows at a time,
// each read whole across the block (all strips or panels at once) with the pair 4 ahead prefetched:
// such rows lie ld apart (2-8 KiB in the GPTs, often the same L1 set), which the hardware prefetcher
// does not follow, and packing them one 12-column strip at a time re-fetched every line per strip
// (one-thread dW shapes 1.1-1.5x faster with this order and the prefetch, docs/benchmarks.md).
// Sizes: a B panel is kKc/2 x 32 words (16 KiB, in L1 while the strips of the A block stream past
// it), an A block kMc x kKc bf16 (48 KiB, in L2), the packed op(B) k x n bf16 (8 MiB at k = n = 2048,
// the calling thread's buffer, kept). Packing each operand once keeps packing at one pass over A and
// one over B per product; packing B per thread and A per n block (the first version) took a fifth of
// the large GPT's bf16 step (docs/benchmarks.md, "gemm_bench").
//
// Note [bf16 kernel scheduling]: a product is one parallel region whose threads claim tasks: first
// the packing of op(B), one task per (column block, k slice), then C's tiles, column block after
// column block. The previous version ran two regions per product (pack B, then a fixed half of C per
// thread), and on a loaded 2-core machine the second thread often woke after the caller had finished
// its half (gemm_bench, instrumented: 0.1-2.4 ms late on 0.3-10 ms products), so the caller then
// waited for, or did, the other half too. Now a late thread only takes fewer tasks.
// Both task lists are cut into one contiguous segment per chunk of the region (SegmentedClaims):
// chunk c takes its own segment's tasks from the front, then the others' from their backs. So with
// 2 threads (and tiles spanning n, as in all the GPTs' products but attention's, which run inside a
// region on one thread) the thread running chunk 0 computes C's first rows and the other its last
// rows, as chunks 0 and 1 of every elementwise pass (core/parallel.h: range c of n is
// [n c / chunks, ...)) read and write them: a product's input and output rows stay in the cache of
// the core that wrote or will read them. A single counter, as before, dealt row blocks to the
// threads in turn, and half of every operand and result crossed between the cores: on the 2-vCPU
// VM measured, the bf16 step lost 15% of its CPU efficiency in the hours its vCPUs' cache-line round
// trip was 0.44 us rather than 0.12, and by the bytes counted most of what crossed was this
// (docs/benchmarks.md, "bf16 step: rows kept on their core"). B's pack
// tasks are cut the same way, so for dW (k: the tokens) each thread packs the token rows it wrote.
// Tiles span all of n where 4 per thread fit in the rows, so each A block is packed once; otherwise
// they get shorter (to kMinMc rows) and only then narrower. A tile reads a B slice only after its
// pack task has finished (a flag per task; the wait is for another thread's packing in progress).
// Every element of C is computed by one tile in k-slice order, so results do not depend on the
// thread count or on which thread took which tile (bit for bit).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
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
constexpr int64_t kMc = 96;     // rows per tile at most; kMc / 2 and kMc / 4 are multiples of kMr
constexpr int64_t kMinMc = 24;  // rows per tile at least (but m), multiple of kMr
constexpr int64_t kPrefetchPairs = 4;  // strided packing: k pairs read ahead

struct FreeDeleter {
  void operator()(uint32_t* p) const { std::free(p); }
};

// A thread's packing buffers, 64-byte aligned, allocated on first use and kept for the thread's life.
struct PackBuffers {
  std::unique_ptr<uint32_t[], FreeDeleter> a{static_cast<uint32_t*>(std::aligned_alloc(64, kMc * kKc / 2 * 4))};
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

// Transposes a 16 x 16 matrix of 32-bit words held one row per register.
inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  __m512i u[16];  // u[4g + c]: rows 4g..4g+3, column c of each 128-bit lane
  for (int g = 0; g < 16; g += 4) {
    u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
    u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
    u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
    u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88), v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xDD);
    const __m512i x0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88);
    const __m512i x1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xDD);
    r[c] = _mm512_shuffle_i32x4(v0, x0, 0x88);
    r[c + 4] = _mm512_shuffle_i32x4(v1, x1, 0x88);
    r[c + 8] = _mm512_shuffle_i32x4(v0, x0, 0xDD);
    r[c + 12] = _mm512_shuffle_i32x4(v1, x1, 0xDD);
  }
}

// Up to 32 consecutive elements from p (fp32 or bf16) rounded to bf16, as 16 words of consecutive
// pairs (element 2q in the low half of word q); elements past `count` are zero.
inline __m512i load_bf16_pairs(const char* p, bool bf16, int64_t count) {
  if (bf16) {
    const __mmask32 mask = count >= 32 ? ~__mmask32(0) : (__mmask32(1) << count) - 1;
    return _mm512_maskz_loadu_epi16(mask, p);
  }
  const int n0 = static_cast<int>(std::min<int64_t>(16, count));
  const int n1 = static_cast<int>(std::max<int64_t>(0, count - 16));
  const __m512i lo = load_bf16_lanes(p, false, n0);
  const __m512i hi = n1 > 0 ? load_bf16_lanes(p + 64, false, n1) : _mm512_setzero_si512();
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(lo)), _mm512_cvtepi32_epi16(hi), 1);
}

// Packs rows [r0, r0 + rows) x k [p0, p0 + kc) of op(X), whose k runs along the stored rows' length
// (A not transposed, B transposed), as words out[q * stride + r - r0]: 16 rows x 16 pairs at a time,
// loaded along k and transposed in registers.
void pack_k_contiguous(const Matrix& x, int64_t r0, int64_t rows, int64_t p0, int64_t kc, uint32_t* out,
                       int64_t stride) {
  const bool bf16 = x.dtype == memory::DType::kBF16;
  const int64_t esize = bf16 ? 2 : 4;
  const int64_t kcp = (kc + 1) / 2;
  for (int64_t rg = 0; rg < rows; rg += 16) {
    const int nr = static_cast<int>(std::min<int64_t>(16, rows - rg));
    const __mmask16 store_mask = nr >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << nr) - 1);
    const char* src = static_cast<const char*>(x.data) + ((r0 + rg) * x.ld + p0) * esize;
    for (int64_t p = 0; p < kc; p += 32) {
      __m512i w[16];
      for (int i = 0; i < 16; ++i) {
        w[i] = i < nr ? load_bf16_pairs(src + (i * x.ld + p) * esize, bf16, kc - p) : _mm512_setzero_si512();
      }
      transpose16(w);
      const int64_t q0 = p / 2;
      const int64_t nq = std::min<int64_t>(16, kcp - q0);
      for (int64_t q = 0; q < nq; ++q) _mm512_mask_storeu_epi32(out + (q0 + q) * stride + rg, store_mask, w[q]);
    }
  }
}

// Packs columns [c0, c0 + cols) x k [p0, p0 + kc) of op(X), whose columns run along the stored rows
// (A transposed, B not transposed), into groups of `width` columns (A's strips, B's panels): pair q,
// column c at out[(c / width) * kcp * width + q * width + c % width]. Each pair of stored rows is read
// once, whole, left to right (Note [bf16 kernel blocking]); a row's 16-column chunk lands in one group
// or, where width is not a multiple of 16, is split between groups by masked stores.
template <int64_t Width>
void pack_k_strided(const Matrix& x, int64_t c0, int64_t cols, int64_t p0, int64_t kc, uint32_t* out) {
  constexpr int64_t width = Width;  // a compile-time constant: no division per chunk
  const bool bf16 = x.dtype == memory::DType::kBF16;
  const int64_t esize = bf16 ? 2 : 4;
  const int64_t kcp = (kc + 1) / 2;
  const int64_t group = kcp * width;  // words per group
  const char* base = static_cast<const char*>(x.data);
  for (int64_t q = 0; q < kcp; ++q) {
    const int64_t p = p0 + 2 * q;
    const bool has_hi = 2 * q + 1 < kc;
    const char* row0 = base + (p * x.ld + c0) * esize;
    const char* row1 = row0 + x.ld * esize;
    uint32_t* out_q = out + q * width;
    // The pair kPrefetchPairs ahead: stored rows lie ld apart, too far for the hardware prefetcher.
    if (q + kPrefetchPairs < kcp) {
      const char* ahead = row0 + 2 * kPrefetchPairs * x.ld * esize;
      for (int64_t off = 0; off < cols * esize; off += 64) {
        _mm_prefetch(ahead + off, _MM_HINT_T0);
        _mm_prefetch(ahead + x.ld * esize + off, _MM_HINT_T0);
      }
    }
    for (int64_t c = 0; c < cols; c += 16) {
      const int n = static_cast<int>(std::min<int64_t>(16, cols - c));
      const __m512i lo = load_bf16_lanes(row0 + c * esize, bf16, n);
      const __m512i hi = has_hi ? load_bf16_lanes(row1 + c * esize, bf16, n) : _mm512_setzero_si512();
      const __m512i w = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
      // Lanes [l, l + take) go to group g from offset o; the store's base is moved back by l lanes.
      for (int l = 0; l < n;) {
        const int64_t col = c + l, g = col / width, o = col % width;
        const int take = static_cast<int>(std::min<int64_t>(n - l, width - o));
        const __mmask16 mask = static_cast<__mmask16>(((1u << take) - 1) << l);
        _mm512_mask_storeu_epi32(out_q + g * group + o - l, mask, w);
        l += take;
      }
    }
  }
}

// op(A) rows [i0, i0 + rows) x k slice into strips of kMr rows: strip s, pair q, row r at
// out[(s * kcp + q) * kMr + r]; rows past the end are zero.
void pack_a(const Matrix& a, int64_t i0, int64_t rows, int64_t p0, int64_t kc, uint32_t* out) {
  const int64_t kcp = (kc + 1) / 2;
  if (rows % kMr != 0) std::fill_n(out + rows / kMr * kcp * kMr, kcp * kMr, 0u);  // the last strip's padding
  if (a.trans) {
    pack_k_strided<kMr>(a, i0, rows, p0, kc, out);
    return;
  }
  for (int64_t s = 0; s * kMr < rows; ++s) {
    pack_k_contiguous(a, i0 + s * kMr, std::min<int64_t>(kMr, rows - s * kMr), p0, kc, out + s * kcp * kMr, kMr);
  }
}

// op(B) columns [j0, j0 + cols) x k slice into panels of kNr columns: panel t, pair q, column c at
// out[(t * kcp + q) * kNr + c]; columns past the end are zero.
void pack_b(const Matrix& b, int64_t j0, int64_t cols, int64_t p0, int64_t kc, uint32_t* out) {
  const int64_t kcp = (kc + 1) / 2;
  if (cols % kNr != 0) std::fill_n(out + cols / kNr * kcp * kNr, kcp * kNr, 0u);  // the last panel's padding
  if (!b.trans) {
    pack_k_strided<kNr>(b, j0, cols, p0, kc, out);
    return;
  }
  for (int64_t t = 0; t * kNr < cols; ++t) {
    pack_k_contiguous(b, j0 + t * kNr, std::min<int64_t>(kNr, cols - t * kNr), p0, kc, out + t * kcp * kNr, kNr);
  }
}

// C tile (MR x cols, cols <= 32) = alpha * strip . panel + beta * C (beta == 0: C is not read), or
// + beta * bias in every row where bias is not null (the first k slice of a product with a bias).
template <int MR>
void micro_kernel(int64_t kcp, const uint32_t* a, const uint32_t* b, float* c, int64_t ldc, int cols, float alpha,
                  float beta, const float* bias) {
  __m512 acc0[MR], acc1[MR];
#pragma GCC unroll 12
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
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    float* row = c + i * ldc;
    __m512 r0 = _mm512_mul_ps(acc0[i], va);
    __m512 r1 = _mm512_mul_ps(acc1[i], va);
    if (beta != 0.0f) {
      const float* start = bias != nullptr ? bias : row;
      r0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m0, start), vb, r0);
      r1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m1, start + 16), vb, r1);
    }
    _mm512_mask_storeu_ps(row, m0, r0);
    _mm512_mask_storeu_ps(row + 16, m1, r1);
  }
}

using MicroKernel = void (*)(int64_t, const uint32_t*, const uint32_t*, float*, int64_t, int, float, float,
                             const float*);

template <int... R>
constexpr auto make_kernels(std::integer_sequence<int, R...>) {
  return std::array<MicroKernel, sizeof...(R)>{&micro_kernel<R + 1>...};
}
constexpr auto kKernels = make_kernels(std::make_integer_sequence<int, kMr>{});  // kKernels[r - 1]: r rows

// op(B) of the whole product, packed once and shared by the threads (Note [bf16 kernel blocking]):
// k slice after k slice, each slice its panels of kNr columns side by side, so slice pc's panel jr
// starts at data + (pc / 2) * npad + (jr / kNr) * kcp * kNr (kcp: the slice's k pairs).
struct PackedB {
  uint32_t* data;
  int64_t npad;  // n rounded up to whole panels
  uint32_t* panel(int64_t pc, int64_t kcp, int64_t jr) const { return data + (pc / 2) * npad + (jr / kNr) * kcp * kNr; }
};

// The calling thread's buffer for a packed op(B), grown to `words` and kept for the thread's life.
uint32_t* packed_b_buffer(size_t words) {
  static thread_local std::unique_ptr<uint32_t[], FreeDeleter> buffer;
  static thread_local size_t capacity = 0;
  if (words > capacity) {
    buffer.reset(static_cast<uint32_t*>(std::aligned_alloc(64, (words * 4 + 63) / 64 * 64)));
    capacity = words;
  }
  return buffer.get();
}

// Tasks [0, count) split into one contiguous segment per chunk of the region (Note [bf16 kernel
// scheduling]): chunk c claims its own segment from the front, then takes what is left of the others
// from their backs. A segment's next front and back are one atomic word, so each task is claimed once.
class SegmentedClaims {
 public:
  SegmentedClaims(int64_t count, int segments) : segments_(segments) {
    // Up to kInline segments in place: products are called tens of thousands of times a step
    // (attention's blocks), so no allocation for the usual thread counts.
    if (segments > kInline) heap_ = std::make_unique<Ends[]>(static_cast<size_t>(segments));
    ends_ = segments > kInline ? heap_.get() : inline_.data();
    for (int c = 0; c < segments; ++c) {
      ends_[c].v.store(pack(count * c / segments, count * (c + 1) / segments), std::memory_order_relaxed);
    }
  }

  // The next task for chunk c, or -1 when every task is claimed.
  int64_t claim(int chunk) {
    if (const int64_t t = take(chunk, true); t >= 0) return t;
    for (int i = 1; i < segments_; ++i) {
      if (const int64_t t = take((chunk + i) % segments_, false); t >= 0) return t;
    }
    return -1;
  }

 private:
  static uint64_t pack(int64_t front, int64_t back) {
    return static_cast<uint64_t>(front) << 32 | static_cast<uint64_t>(back);
  }

  int64_t take(int segment, bool front) {
    std::atomic<uint64_t>& e = ends_[segment].v;
    uint64_t v = e.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t f = static_cast<int64_t>(v >> 32), b = static_cast<int64_t>(v & 0xffffffffu);
      if (f >= b) return -1;
      if (e.compare_exchange_weak(v, front ? pack(f + 1, b) : pack(f, b - 1), std::memory_order_relaxed)) {
        return front ? f : b - 1;
      }
    }
  }

  // A cache line each: the threads claim from their own segments without moving each other's line.
  struct alignas(64) Ends {
    std::atomic<uint64_t> v;
  };
  static constexpr int kInline = 4;
  int segments_;
  std::array<Ends, kInline> inline_;
  std::unique_ptr<Ends[]> heap_;
  Ends* ends_;
};

// One product's work list (Note [bf16 kernel scheduling]). Each chunk of the region packs its share
// of op(B) first, then computes its share of C's tiles; a tile waits (rarely: only while another
// thread is still packing it) until the B slices it reads are packed.
class Schedule {
 public:
  Schedule(int64_t m, int64_t n, int64_t k, int threads, const PackedB& b)
      : m_(m), n_(n), k_(k), slices_((k + kKc - 1) / kKc), b_(b) {
    // Enough tiles (4 per thread) for dynamic claiming to balance the threads. Tiles span all of n
    // where they can, so each A block is packed once; they get shorter first (down to kMinMc rows:
    // the B panel then serves fewer strips from L1, which costs little), and only then narrower
    // (every column block packs the A block again).
    const int64_t want = 4 * static_cast<int64_t>(threads);
    mc_ = kMc;
    while (mc_ > kMinMc && (m + mc_ - 1) / mc_ < want) mc_ /= 2;
    const int64_t col_split = std::max<int64_t>(1, want / row_blocks());
    const int64_t panels = b.npad / kNr;
    nc_ = (panels + col_split - 1) / col_split * kNr;
    col_blocks_ = (n + nc_ - 1) / nc_;
    packs_ = col_blocks_ * slices_;
    packed_ = std::make_unique<std::atomic<uint8_t>[]>(static_cast<size_t>(packs_));
    pack_claims_.emplace(packs_, threads);
    tile_claims_.emplace(row_blocks() * col_blocks_, threads);
  }

  // Claims and runs chunk `chunk`'s tasks, then the others' left over; run by every chunk of the region.
  void run(int chunk, float alpha, const Matrix& a, const Matrix& b, float beta, float* c, int64_t ldc,
           const float* bias) {
    for (int64_t t = pack_claims_->claim(chunk); t >= 0; t = pack_claims_->claim(chunk)) pack(b, t);
    for (int64_t tile = tile_claims_->claim(chunk); tile >= 0; tile = tile_claims_->claim(chunk)) {
      const int64_t cb = tile / row_blocks(), rb = tile % row_blocks();
      const int64_t i0 = rb * mc_, j0 = cb * nc_;
      this->tile(cb, i0, std::min(m_, i0 + mc_), j0, std::min(n_, j0 + nc_), alpha, a, beta, c, ldc, bias);
    }
  }

 private:
  int64_t row_blocks() const { return (m_ + mc_ - 1) / mc_; }

  // Pack task t: column block t / slices_, k slice t % slices_.
  void pack(const Matrix& b, int64_t t) {
    const int64_t cb = t / slices_, pc = (t % slices_) * kKc;
    const int64_t j0 = cb * nc_, kc = std::min(kKc, k_ - pc);
    pack_b(b, j0, std::min(n_, j0 + nc_) - j0, pc, kc, b_.panel(pc, (kc + 1) / 2, j0));
    packed_[t].store(1, std::memory_order_release);
  }

  void wait_packed(int64_t t) const {
    while (packed_[t].load(std::memory_order_acquire) == 0) [[unlikely]] {
      _mm_pause();
    }
  }

  // C rows [i0, i1) x columns [j0, j1) of column block cb: each k slice's A block is packed once and
  // multiplied by every panel of the block.
  void tile(int64_t cb, int64_t i0, int64_t i1, int64_t j0, int64_t j1, float alpha, const Matrix& a, float beta,
            float* c, int64_t ldc, const float* bias) const {
    PackBuffers& buf = pack_buffers();
    for (int64_t pc = 0; pc < k_; pc += kKc) {
      const int64_t kc = std::min(kKc, k_ - pc);
      const int64_t kcp = (kc + 1) / 2;
      const float beta_here = pc == 0 ? beta : 1.0f;  // later k slices add to the first one's result
      const float* bias_here = pc == 0 ? bias : nullptr;
      pack_a(a, i0, i1 - i0, pc, kc, buf.a.get());
      wait_packed(cb * slices_ + pc / kKc);
      for (int64_t jr = j0; jr < j1; jr += kNr) {
        const uint32_t* panel = b_.panel(pc, kcp, jr);
        const int cols = static_cast<int>(std::min<int64_t>(kNr, j1 - jr));
        for (int64_t ir = 0; ir < i1 - i0; ir += kMr) {
          const int rows = static_cast<int>(std::min<int64_t>(kMr, i1 - i0 - ir));
          kKernels[rows - 1](kcp, buf.a.get() + (ir / kMr) * kcp * kMr, panel, c + (i0 + ir) * ldc + jr, ldc, cols,
                             alpha, beta_here, bias_here != nullptr ? bias_here + jr : nullptr);
        }
      }
    }
  }

  int64_t m_, n_, k_, slices_;
  PackedB b_;
  int64_t nc_ = 0, col_blocks_ = 0, mc_ = 0, packs_ = 0;
  std::unique_ptr<std::atomic<uint8_t>[]> packed_;  // per pack task: 1 once its panels are written
  std::optional<SegmentedClaims> pack_claims_, tile_claims_;
};

}  // namespace

void gemm_avx512bf16(int64_t m, int64_t n, int64_t k, float alpha, const Matrix& a, const Matrix& b, float beta,
                     float* c, int64_t ldc, const float* bias) {
  if (k == 0) {  // no products: C = beta * C (or beta * bias)
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * (bias != nullptr ? bias[j] : c[i * ldc + j]);
      }
    }
    return;
  }
  const int64_t npad = (n + kNr - 1) / kNr * kNr;
  const PackedB pb{packed_b_buffer(static_cast<size_t>((k + 1) / 2 * npad)), npad};
  const int threads = compute_threads();
  Schedule schedule(m, n, k, threads, pb);
  // One region; every thread (the caller first) claims tasks until none is left, so a worker that
  // wakes late only takes fewer tiles (Note [bf16 kernel scheduling]).
  parallel_for(threads, 1, [&](int64_t, int64_t, int chunk) { schedule.run(chunk, alpha, a, b, beta, c, ldc, bias); });
}

}  // namespace zs::nn::detail
