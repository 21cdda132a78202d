// Question: which bf16 matrix product should nn use (docs/design.md, "bf16 matrix products")? On the
// products one training step of the example GPTs issues, GFLOP/s of
//   sgemm          today's path: OpenBLAS sgemm on fp32 operands (the fp32 step; the bf16 step added a
//                  widening of the weight on top) - the baseline
//   avx512bf16     nn::detail::gemm's own AVX512-BF16 kernel, as the layers call it, on the layers'
//                  operands: fp32 activations and gradients, bf16 weights (only forward and dX have a
//                  weight operand: dW = dY^T X and attention's products are fp32 x fp32), rounded to
//                  bf16 while packing, fp32 C
//   onednn         oneDNN's matmul primitive (Debian's libdnnl, when the build found it), bf16 x bf16 ->
//                  fp32, primitives created before timing, kernel only: operands already bf16
//   onednn_layer   the same matmul on the layers' operands: each fp32 operand first goes through a
//                  oneDNN reorder to bf16 (timed; oneDNN 2.6's CPU matmul has no f32 x bf16 source
//                  combination), as a layer calling oneDNN would have to
//   libxsmm        libxsmm's JIT bf16 kernels (Debian's libxsmm-dev, when the build found it), bf16 x
//                  bf16 -> fp32, one kernel per 64 x 64 block of C over all of k, dispatched before
//                  timing, called from the worker pool's threads (as a library would call them), kernel
//                  only: op(B) already in libxsmm's VNNI pair layout and op(A) already bf16
//   libxsmm_layer  the same kernels on the layers' operands: the conversion of fp32 operands to bf16
//                  (memory::convert_f32_to_bf16, AVX-512; libxsmm 1.17's own converter is a scalar loop),
//                  the transposes libxsmm_otrans does and the VNNI interleave of op(B), all timed and
//                  split over the same threads
// all in one run on the same threads. Linear shapes per block (tokens x d) x (d x 3d, d, 4d) and
// (tokens x 4d) x (4d x d): forward Y = X W^T, dX = dY W, dW = dY^T X. Attention: one causal panel
// of 64 query rows per (batch, head), every head on its own thread (as nn/attention.cpp runs them):
// S = Q K^T (64 x T x hs), Y = P V (64 x hs x T), dP = dY V^T, dV = P^T dY.
//
//   gemm_bench [--models small,large] [--threads N] [--reps 5]
//              [--paths sgemm,avx512bf16,onednn,onednn_layer,libxsmm,libxsmm_layer] [--shapes qkv.dw,...]
//              [--verbose 0|1 (every repetition's time)] [--json FILE]
//
// small: 4 layers d 256 seq 128 micro-batch 8 (1,024 tokens); large: 6 layers d 512 seq 256 mb 8
// (2,048 tokens); head size 64. Each figure is the median over --reps timed repetitions after a warm-up.
// Per shape: "best_bf16_vs_sgemm"; "avx512bf16_vs_best_layer" compares ours with the best of ours,
// onednn_layer and libxsmm_layer (the target, >= 0.8: the layers hold fp32 activations, so any
// path must round them), "avx512bf16_vs_best_kernel" with the best of ours, onednn and libxsmm (the
// peers' kernels alone). Every peer path's C is checked against sgemm's (bf16 input rounding bound).
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "benchmarks/support/bench_json.h"
#include "core/errors.h"
#include "core/parallel.h"
#include "launch/launch.h"
#include "memory/cpu_features.h"
#include "memory/dtype.h"
#include "nn/detail/gemm.h"
#include "nn/detail/parallel.h"
#include "nn/layers.h"

#ifdef ZS_HAVE_DNNL
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#endif

#ifdef ZS_HAVE_XSMM
#include <libxsmm.h>
#endif

namespace {

using zs::nn::detail::GemmPath;
using zs::nn::detail::Matrix;

struct Shape {
  std::string name;
  int64_t m, n, k;
  bool ta, tb;
  bool b_weight;      // op(B) is a bf16 weight in the layer (forward, dX); otherwise both operands are fp32
  int64_t batch = 1;  // independent products, one per thread (attention heads)
};

std::vector<Shape> shapes_for(const std::string& model) {
  int64_t tokens, d, T;
  if (model == "small") {
    tokens = 8 * 128, d = 256, T = 128;
  } else if (model == "large") {
    tokens = 8 * 256, d = 512, T = 256;
  } else {
    throw zs::ConfigError("--models: unknown model '" + model + "'; use small and/or large");
  }
  std::vector<Shape> out;
  const std::pair<const char*, std::pair<int64_t, int64_t>> linears[] = {
      {"qkv", {d, 3 * d}}, {"proj", {d, d}}, {"fc", {d, 4 * d}}, {"fc2", {4 * d, d}}};
  for (const auto& [name, io] : linears) {
    const auto [in, o] = io;
    out.push_back({std::string(name) + ".fwd", tokens, o, in, false, true, true});
    out.push_back({std::string(name) + ".dx", tokens, in, o, false, false, true});
    out.push_back({std::string(name) + ".dw", o, in, tokens, true, false, false});
  }
  const int64_t heads = 8 * d / 64;  // micro-batch x heads
  out.push_back({"attn.qk", 64, T, 64, false, true, false, heads});
  out.push_back({"attn.pv", 64, 64, T, false, false, false, heads});
  out.push_back({"attn.dp", 64, T, 64, false, true, false, heads});
  out.push_back({"attn.dv", T, 64, 64, true, false, false, heads});
  return out;
}

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t comma = list.find(',', start);
    std::string item = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// The median of `reps` timed calls after an untimed one; verbose: every time printed, in order (the
// two-thread runs are bimodal, docs/benchmarks.md "gemm_bench").
double median_seconds(int reps, bool verbose, const std::string& label, const std::function<void()>& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const double t0 = zs::bench::now_seconds();
    f();
    t.push_back(zs::bench::now_seconds() - t0);
  }
  if (verbose) {
    std::printf("  %-24s ms:", label.c_str());
    for (double x : t) std::printf(" %.3f", x * 1e3);
    std::printf("\n");
  }
  return zs::bench::median(std::move(t));
}

// Operands of one shape: fp32 and bf16 copies of A and B (stored as op() needs), fp32 C per batch item.
struct Operands {
  int64_t a_rows, a_cols, b_rows, b_cols;
  std::vector<float> a32, b32;
  std::vector<uint16_t> a16, b16;
  std::vector<float> c;

  explicit Operands(const Shape& s)
      : a_rows(s.ta ? s.k : s.m), a_cols(s.ta ? s.m : s.k), b_rows(s.tb ? s.n : s.k), b_cols(s.tb ? s.k : s.n) {
    a32.resize(static_cast<size_t>(a_rows * a_cols));
    b32.resize(static_cast<size_t>(b_rows * b_cols));
    for (size_t i = 0; i < a32.size(); ++i) a32[i] = static_cast<float>((i * 7919) % 1000) * 1e-3f - 0.5f;
    for (size_t i = 0; i < b32.size(); ++i) b32[i] = static_cast<float>((i * 104729) % 1000) * 1e-3f - 0.5f;
    a16.resize(a32.size());
    b16.resize(b32.size());
    zs::memory::convert_f32_to_bf16(a32, a16);
    zs::memory::convert_f32_to_bf16(b32, b16);
    c.resize(static_cast<size_t>(s.m * s.n * s.batch));
  }
};

// Throws unless C (the first batch item) matches sgemm's within the bf16 input rounding: each term's
// relative error is at most 2^-8, so |C - ref| <= 2^-7 * sum |a||b| <= 2^-7 * k * 0.25 bounds it
// (operands in [-0.5, 0.5]); a wrong layout or transpose misses by far more.
void check_result(const Shape& s, const std::string& path, const float* c, const std::vector<float>& ref) {
  const double bound = 0.25 * static_cast<double>(s.k) / 128.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!(std::abs(static_cast<double>(c[i]) - ref[i]) <= bound)) {
      throw std::runtime_error(path + " on " + s.name + ": C[" + std::to_string(i) + "] = " + std::to_string(c[i]) +
                               ", sgemm " + std::to_string(ref[i]));
    }
  }
}

// Runs one product per batch item: a single product on all threads, a batch one per thread.
void run_batched(const Shape& s, int threads, const std::function<void(int64_t)>& one) {
  if (s.batch == 1) {
    one(0);
    return;
  }
  zs::parallel_for_threads(threads, s.batch, 1, [&](int64_t b0, int64_t b1, int) {
    for (int64_t b = b0; b < b1; ++b) one(b);
  });
}

#ifdef ZS_HAVE_DNNL
struct DnnlRunner {
  int threads;
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};

  // Returns a callable that runs the product once (primitives built here, outside the timing). layer:
  // start from the layer's operands (fp32 where the layer holds fp32), reordering them to bf16 first.
  std::function<void(int64_t)> prepare(const Shape& s, Operands& o, bool layer) {
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    // op(A) (m, k) with strides for the stored layout; likewise op(B) (k, n).
    const dims a_strides = s.ta ? dims{1, s.m} : dims{s.k, 1}, b_strides = s.tb ? dims{1, s.k} : dims{s.n, 1};
    dnnl::memory::desc a_md(dims{s.m, s.k}, dt::bf16, a_strides), b_md(dims{s.k, s.n}, dt::bf16, b_strides);
    dnnl::memory::desc c_md(dims{s.m, s.n}, dt::f32, dims{s.n, 1});
    // Scratchpads are the caller's, one per thread: the heads of a batch run the same primitives on the
    // pool's threads concurrently, and the library's own scratchpad is shared (wrong C seen).
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    auto pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, eng);
    auto prim = std::make_shared<dnnl::matmul>(pd);
    const int omp_threads = s.batch > 1 ? 1 : threads;  // a batch runs one product per pool thread
    // The layer's fp32 operands: reordered into bf16 buffers of their own per batch item (heads run
    // concurrently), with oneDNN's reorder primitive.
    const bool convert_a = layer, convert_b = layer && !s.b_weight;
    dnnl::memory::desc a32_md(dims{s.m, s.k}, dt::f32, a_strides), b32_md(dims{s.k, s.n}, dt::f32, b_strides);
    const auto a_pd = dnnl::reorder::primitive_desc(eng, a32_md, eng, a_md, attr);
    const auto b_pd = dnnl::reorder::primitive_desc(eng, b32_md, eng, b_md, attr);
    auto a_reorder = std::make_shared<dnnl::reorder>(a_pd);
    auto b_reorder = std::make_shared<dnnl::reorder>(b_pd);
    const dnnl::memory::desc sp_mm = pd.scratchpad_desc(), sp_a = a_pd.scratchpad_desc(), sp_b = b_pd.scratchpad_desc();
    auto a_buf = std::make_shared<std::vector<uint16_t>>(convert_a ? o.a16.size() * s.batch : 0);
    auto b_buf = std::make_shared<std::vector<uint16_t>>(convert_b ? o.b16.size() * s.batch : 0);
    return [=, this, &o](int64_t b) {
      omp_set_num_threads(omp_threads);  // this thread's OpenMP team size
      // A stream per thread: the heads of a batch run on the pool's threads concurrently, and a
      // oneDNN stream is not to be shared between threads.
      static thread_local dnnl::stream strm(eng);
      static thread_local std::vector<uint8_t> scratch;
      scratch.resize(std::max({scratch.size(), sp_mm.get_size(), sp_a.get_size(), sp_b.get_size(), size_t{1}}));
      void* a16 = o.a16.data();
      void* b16 = o.b16.data();
      if (convert_a) {
        a16 = a_buf->data() + b * o.a16.size();
        dnnl::memory src(a32_md, eng, o.a32.data()), dst(a_md, eng, a16);
        a_reorder->execute(strm, {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst},
                                  {DNNL_ARG_SCRATCHPAD, dnnl::memory(sp_a, eng, scratch.data())}});
      }
      if (convert_b) {
        b16 = b_buf->data() + b * o.b16.size();
        dnnl::memory src(b32_md, eng, o.b32.data()), dst(b_md, eng, b16);
        b_reorder->execute(strm, {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst},
                                  {DNNL_ARG_SCRATCHPAD, dnnl::memory(sp_b, eng, scratch.data())}});
      }
      dnnl::memory a(a_md, eng, a16), bm(b_md, eng, b16), c(c_md, eng, o.c.data() + b * s.m * s.n);
      prim->execute(strm, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, c},
                           {DNNL_ARG_SCRATCHPAD, dnnl::memory(sp_mm, eng, scratch.data())}});
      strm.wait();
    };
  }
};
#endif

#ifdef ZS_HAVE_XSMM
// libxsmm's kernels compute column-major C = A B; row-major C = op(A) op(B) is column-major
// C^T = op(B)^T op(A)^T, so libxsmm's A is op(B) (in its VNNI layout: k pairs interleaved, the layout
// its bf16 kernels need) and its B is op(A) stored row-major (m x k). C is cut into 64 x 64 blocks,
// each one kernel call over all of k; the pool's threads take whole rows of blocks.
struct XsmmRunner {
  int threads;
  static constexpr int64_t kBlock = 64;

  // The operands libxsmm needs, per batch item: op(A) row-major m x k bf16 and op(B) as VNNI words
  // (k / 2 x n, word (q, j) = op(B)[2q][j] | op(B)[2q + 1][j] << 16), plus scratch for conversions.
  struct Buffers {
    std::vector<uint16_t> a_rows, vnni, scratch_a, scratch_b;
  };

  // Builds op(A) rows and op(B) VNNI words from the layer's operands (fp32, or the bf16 weight) on
  // `pool_threads` threads: fp32 converted by memory::convert_f32_to_bf16, transposes by
  // libxsmm_otrans, the pair interleave of a row-major op(B) by a plain loop.
  static void pack_layer(const Shape& s, const Operands& o, int pool_threads, Buffers& buf) {
    const int64_t kp = s.k / 2;
    const uint16_t* b16 = s.b_weight ? o.b16.data() : buf.scratch_b.data();
    auto part = [&](int64_t n, int64_t t) {  // thread t's share [lo, hi) of n items
      return std::pair<int64_t, int64_t>{n * t / pool_threads, n * (t + 1) / pool_threads};
    };
    // Stage 1, each thread its own rows: op(A) stored (m, k): convert rows; stored (k, m): convert
    // rows, then transpose them; an fp32 op(B): convert its stored rows.
    auto stage1 = [&](int64_t t) {
      if (!s.ta) {
        const auto [i0, i1] = part(s.m, t);
        zs::memory::convert_f32_to_bf16({o.a32.data() + i0 * s.k, size_t((i1 - i0) * s.k)},
                                        {buf.a_rows.data() + i0 * s.k, size_t((i1 - i0) * s.k)});
      } else {
        const auto [p0, p1] = part(s.k, t);
        zs::memory::convert_f32_to_bf16({o.a32.data() + p0 * s.m, size_t((p1 - p0) * s.m)},
                                        {buf.scratch_a.data() + p0 * s.m, size_t((p1 - p0) * s.m)});
        // in: column-major m x (p1 - p0) (ldi m); out: (p1 - p0) x m (ldo k), out[i * k + p].
        libxsmm_otrans(buf.a_rows.data() + p0, buf.scratch_a.data() + p0 * s.m, 2, s.m, p1 - p0, s.m, s.k);
      }
      if (!s.b_weight) {
        const auto [r0, r1] = part(o.b_rows, t);
        zs::memory::convert_f32_to_bf16({o.b32.data() + r0 * o.b_cols, size_t((r1 - r0) * o.b_cols)},
                                        {buf.scratch_b.data() + r0 * o.b_cols, size_t((r1 - r0) * o.b_cols)});
      }
    };
    // Stage 2: op(B) stored (n, k): the VNNI words are the stored (n, k / 2) words transposed; stored
    // (k, n): interleave rows 2q and 2q + 1.
    auto stage2 = [&](int64_t t) {
      if (s.tb) {
        const auto [j0, j1] = part(s.n, t);
        libxsmm_otrans(reinterpret_cast<uint32_t*>(buf.vnni.data()) + j0, b16 + j0 * s.k, 4, kp, j1 - j0, kp, s.n);
      } else {
        const auto [q0, q1] = part(kp, t);
        for (int64_t q = q0; q < q1; ++q) {
          const uint16_t* r0 = b16 + 2 * q * s.n;
          const uint16_t* r1 = r0 + s.n;
          uint16_t* out = buf.vnni.data() + 2 * q * s.n;
          for (int64_t j = 0; j < s.n; ++j) {
            out[2 * j] = r0[j];
            out[2 * j + 1] = r1[j];
          }
        }
      }
    };
    // One region where op(B) is the weight (no dependency between the stages), two otherwise.
    zs::parallel_for_threads(pool_threads, pool_threads, 1, [&](int64_t t0, int64_t t1, int) {
      for (int64_t t = t0; t < t1; ++t) {
        stage1(t);
        if (s.b_weight) stage2(t);
      }
    });
    if (!s.b_weight) {
      zs::parallel_for_threads(pool_threads, pool_threads, 1, [&](int64_t t0, int64_t t1, int) {
        for (int64_t t = t0; t < t1; ++t) stage2(t);
      });
    }
  }

  std::function<void(int64_t)> prepare(const Shape& s, Operands& o, bool layer) {
    if (s.k % 2 != 0) throw zs::ConfigError("libxsmm path: odd k " + std::to_string(s.k));
    auto bufs = std::make_shared<std::vector<Buffers>>(static_cast<size_t>(s.batch));
    for (Buffers& b : *bufs) {
      b.a_rows.resize(static_cast<size_t>(s.m * s.k));
      b.vnni.resize(static_cast<size_t>(s.k * s.n));
      if (layer) {
        b.scratch_a.resize(b.a_rows.size());
        b.scratch_b.resize(b.vnni.size());
      }
    }
    if (!layer) {  // kernel only: both operands packed here, untimed, shared by the batch
      Buffers& b0 = (*bufs)[0];
      for (int64_t p = 0; p < s.k; ++p) {
        for (int64_t j = 0; j < s.n; ++j) {
          b0.vnni[((p / 2) * s.n + j) * 2 + p % 2] = o.b16[s.tb ? j * o.b_cols + p : p * o.b_cols + j];
        }
      }
      for (int64_t i = 0; i < s.m; ++i) {
        for (int64_t p = 0; p < s.k; ++p) b0.a_rows[i * s.k + p] = o.a16[s.ta ? p * o.a_cols + i : i * o.a_cols + p];
      }
    }
    // One kernel per block shape (full blocks and the edges), dispatched here, outside the timing.
    auto kernels = std::make_shared<std::map<std::pair<int64_t, int64_t>, libxsmm_bsmmfunction>>();
    for (int64_t bm : {kBlock, s.n % kBlock}) {
      for (int64_t bn : {kBlock, s.m % kBlock}) {
        if (bm == 0 || bn == 0 || kernels->count({bm, bn})) continue;
        const libxsmm_blasint lda = s.n, ldb = s.k, ldc = s.n;
        const float alpha = 1.0f, beta = 0.0f;
        const int flags = LIBXSMM_GEMM_FLAG_VNNI_A, prefetch = LIBXSMM_GEMM_PREFETCH_NONE;
        libxsmm_bsmmfunction f = libxsmm_bsmmdispatch(bm, bn, s.k, &lda, &ldb, &ldc, &alpha, &beta, &flags, &prefetch);
        if (f == nullptr) throw zs::ConfigError("libxsmm path: no bf16 kernel for this CPU or shape");
        (*kernels)[{bm, bn}] = f;
      }
    }
    const int pool_threads = s.batch > 1 ? 1 : threads;  // a batch runs one product per pool thread
    return [bufs, kernels, &o, s, pool_threads, layer](int64_t b) {
      Buffers& buf = (*bufs)[layer ? b : 0];
      if (layer) pack_layer(s, o, pool_threads, buf);
      float* c = o.c.data() + b * s.m * s.n;
      const int64_t row_blocks = (s.m + kBlock - 1) / kBlock;
      zs::parallel_for_threads(pool_threads, row_blocks, 1, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t i0 = r * kBlock, bn = std::min(kBlock, s.m - i0);
          for (int64_t j0 = 0; j0 < s.n; j0 += kBlock) {
            const int64_t bm = std::min(kBlock, s.n - j0);
            kernels->at({bm, bn})(reinterpret_cast<const libxsmm_bfloat16*>(buf.vnni.data()) + j0 * 2,
                                  reinterpret_cast<const libxsmm_bfloat16*>(buf.a_rows.data()) + i0 * s.k,
                                  c + i0 * s.n + j0);
          }
        }
      });
    };
  }
};
#endif

}  // namespace

int main(int argc, char** argv) try {
  // OpenBLAS's idle-thread polling as the library's programs set it (Note [OpenBLAS idle threads]).
  zs::launch::select_blas_kernels(argv);
  const std::vector<std::string> models = split(zs::bench::arg_value(argc, argv, "--models", "small,large"));
  const int reps = std::stoi(zs::bench::arg_value(argc, argv, "--reps", "5"));
  const bool verbose = zs::bench::arg_value(argc, argv, "--verbose", "0") != "0";
  const std::vector<std::string> only = split(zs::bench::arg_value(argc, argv, "--shapes", ""));  // empty: all
  const int threads = std::stoi(zs::bench::arg_value(argc, argv, "--threads", std::to_string(zs::nn::compute_threads())));
  std::vector<std::string> paths = split(zs::bench::arg_value(argc, argv, "--paths", "sgemm,avx512bf16,onednn,onednn_layer,libxsmm,libxsmm_layer"));
  if (!zs::nn::detail::gemm_path_supported(GemmPath::kAvx512Bf16)) {
    std::erase(paths, "avx512bf16");
    std::printf("note: no AVX512-BF16 on this CPU: the avx512bf16 path is skipped\n");
  } else {
    // What the layers take here (Note [bf16 product rate]); this benchmark times both paths anyway.
    std::printf("note: the layers' bf16 products run on %s\n", zs::nn::bf16_products_description().c_str());
  }
#ifndef ZS_HAVE_DNNL
  if (std::erase(paths, "onednn") + std::erase(paths, "onednn_layer") > 0) {
    std::printf("note: built without oneDNN (libdnnl-dev): onednn skipped\n");
  }
#else
  DnnlRunner dnnl_runner{threads};
#endif
#ifndef ZS_HAVE_XSMM
  if (std::erase(paths, "libxsmm") + std::erase(paths, "libxsmm_layer") > 0) {
    std::printf("note: built without libxsmm (libxsmm-dev): libxsmm skipped\n");
  }
#else
  // Compared where our kernel runs (libxsmm would emulate bf16 elsewhere, or find no kernel).
  if (!zs::memory::cpu_has_avx512_bf16() && std::erase(paths, "libxsmm") + std::erase(paths, "libxsmm_layer") > 0) {
    std::printf("note: no AVX512-BF16 on this CPU: the libxsmm path is skipped\n");
  }
  XsmmRunner xsmm_runner{threads};
#endif
  openblas_set_num_threads(threads);

  zs::bench::Report report;
  report.benchmark = "gemm_bench";
  report.config["threads"] = threads;
  report.config["repetitions"] = reps;
  report.config["avx512_bf16"] = zs::memory::cpu_has_avx512_bf16();
  boost::json::array path_list;
  for (const auto& p : paths) path_list.push_back(boost::json::string(p));
  report.config["paths"] = path_list;

  boost::json::object ratios, baseline;
  std::printf("%-7s %-9s %5s %5s %5s %4s | %s\n", "model", "shape", "m", "n", "k", "bat", "GFLOP/s per path");
  for (const auto& model : models) {
    double flops_total = 0;
    std::map<std::string, double> seconds_total;
    for (const Shape& s : shapes_for(model)) {
      if (!only.empty() && std::find(only.begin(), only.end(), s.name) == only.end()) continue;
      Operands o(s);
      const double flops = 2.0 * static_cast<double>(s.m * s.n * s.k * s.batch);
      std::map<std::string, double> gflops;
      // sgemm's C for the first batch item: every bf16 path's result is checked against it.
      std::vector<float> ref(static_cast<size_t>(s.m * s.n));
      cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, s.m, s.n, s.k,
                  1.0f, o.a32.data(), o.a_cols, o.b32.data(), o.b_cols, 0.0f, ref.data(), s.n);
      for (const auto& path : paths) {
        std::function<void(int64_t)> one;
        if (path == "sgemm") {
          one = [&](int64_t b) {
            cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, s.m, s.n,
                        s.k, 1.0f, o.a32.data(), o.a_cols, o.b32.data(), o.b_cols, 0.0f, o.c.data() + b * s.m * s.n, s.n);
          };
        } else if (path == "avx512bf16") {
          // As the layers call it: activations and gradients fp32, a weight operand bf16.
          const Matrix b = s.b_weight ? Matrix{o.b16.data(), zs::memory::DType::kBF16, o.b_cols, s.tb}
                                      : Matrix::f32(o.b32.data(), o.b_cols, s.tb);
          one = [&, b](int64_t i) {
            zs::nn::detail::gemm(GemmPath::kAvx512Bf16, s.m, s.n, s.k, 1.0f, Matrix::f32(o.a32.data(), o.a_cols, s.ta),
                                 b, 0.0f, o.c.data() + i * s.m * s.n, s.n);
          };
#ifdef ZS_HAVE_DNNL
        } else if (path == "onednn" || path == "onednn_layer") {
          one = dnnl_runner.prepare(s, o, path == "onednn_layer");
#endif
#ifdef ZS_HAVE_XSMM
        } else if (path == "libxsmm" || path == "libxsmm_layer") {
          one = xsmm_runner.prepare(s, o, path == "libxsmm_layer");
#endif
        } else {
          throw zs::ConfigError("--paths: unknown path '" + path +
                               "'; use sgemm, avx512bf16, onednn, onednn_layer, libxsmm, libxsmm_layer");
        }
        // Batched shapes run one product per thread, each single-threaded inside (as attention does).
        const bool batched = s.batch > 1;
        if (batched) openblas_set_num_threads(1);
        const double t = median_seconds(reps, verbose, s.name + " " + path, [&] { run_batched(s, threads, one); });
        if (batched) openblas_set_num_threads(threads);
        gflops[path] = flops / t / 1e9;
        seconds_total[path] += t;
        if (path != "sgemm") check_result(s, path, o.c.data(), ref);
      }
      flops_total += flops;
      std::printf("%-7s %-9s %5lld %5lld %5lld %4lld |", model.c_str(), s.name.c_str(), (long long)s.m, (long long)s.n,
                  (long long)s.k, (long long)s.batch);
      boost::json::object r, rates;
      double best_bf16 = 0, best_kernel = 0, best_layer = 0;
      for (const auto& [p, g] : gflops) {
        std::printf(" %s %.1f", p.c_str(), g);
        rates[p] = g;
        if (p != "sgemm") best_bf16 = std::max(best_bf16, g);
        if (p == "avx512bf16" || p == "onednn" || p == "libxsmm") best_kernel = std::max(best_kernel, g);
        if (p == "avx512bf16" || p.ends_with("_layer")) best_layer = std::max(best_layer, g);
      }
      std::printf("\n");
      r["model"] = model;
      r["shape"] = s.name;
      r["m"] = s.m;
      r["n"] = s.n;
      r["k"] = s.k;
      r["batch"] = s.batch;
      r["trans_a"] = s.ta;
      r["trans_b"] = s.tb;
      r["gflops"] = rates;
      if (gflops.count("sgemm") && best_bf16 > 0) r["best_bf16_vs_sgemm"] = best_bf16 / gflops["sgemm"];
      if (gflops.count("avx512bf16")) {
        r["avx512bf16_vs_best_layer"] = gflops["avx512bf16"] / best_layer;
        r["avx512bf16_vs_best_kernel"] = gflops["avx512bf16"] / best_kernel;
        std::printf("%-7s %-9s ours / best: %.2f on the layer's operands, %.2f against kernels alone\n", "", "",
                    gflops["avx512bf16"] / best_layer, gflops["avx512bf16"] / best_kernel);
      }
      report.results.push_back(std::move(r));
    }
    // The step's mix: total FLOPs over total time per path (the FLOP-weighted harmonic mean).
    boost::json::object mix;
    std::printf("%-7s all shapes:", model.c_str());
    for (const auto& [p, t] : seconds_total) {
      mix[p] = flops_total / t / 1e9;
      std::printf(" %s %.1f GFLOP/s", p.c_str(), flops_total / t / 1e9);
    }
    std::printf("\n");
    if (seconds_total.count("sgemm")) {
      baseline[model] = flops_total / seconds_total["sgemm"] / 1e9;
      for (const auto& [p, t] : seconds_total) {
        if (p != "sgemm") ratios[model + "/" + p + "_vs_sgemm"] = seconds_total["sgemm"] / t;
      }
    }
    report.config["gflops_all_shapes_" + model] = mix;
  }
  report.baseline["name"] = "OpenBLAS sgemm on fp32 operands, GFLOP/s over all shapes of the model (same run)";
  report.baseline["gflops"] = baseline;
  report.ratio = ratios;
  const std::string json = zs::bench::json_path_arg(argc, argv);
  if (!json.empty()) report.write(json);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "gemm_bench: %s\n", e.what());
  return 1;
}
