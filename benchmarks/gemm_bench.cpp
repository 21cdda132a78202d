// Question: which bf16 matrix product should nn use (docs/design.md, "bf16 matrix products")? On the
// products one training step of the example GPTs issues, GFLOP/s of
//   sgemm       today's path: OpenBLAS sgemm on fp32 operands (the fp32 step; the bf16 step added a
//               widening of the weight on top) - the baseline
//   avx512bf16  nn::detail::gemm's own AVX512-BF16 kernel, as the layers call it: fp32 activations
//               and gradients, bf16 weights, rounded to bf16 while packing, fp32 C
//   onednn      oneDNN's matmul primitive (Debian's libdnnl, when the build found it), bf16 x bf16 ->
//               fp32, primitives created before timing, operands already bf16 (the rounding pass an
//               fp32 activation would need first is not timed: a generous figure for oneDNN)
//   libxsmm     libxsmm's JIT bf16 kernels (Debian's libxsmm-dev, when the build found it), bf16 x
//               bf16 -> fp32, one kernel per 64 x 64 block of C over all of k, dispatched before
//               timing, called from the worker pool's threads (as a library would call them); op(B)
//               already in libxsmm's VNNI pair layout and op(A) already bf16 (neither pass timed)
// all in one run on the same threads. Linear shapes per block (tokens x d) x (d x 3d, d, 4d) and
// (tokens x 4d) x (4d x d): forward Y = X W^T, dX = dY W, dW = dY^T X. Attention: one causal panel
// of 64 query rows per (batch, head), every head on its own thread (as nn/attention.cpp runs them):
// S = Q K^T (64 x T x hs), Y = P V (64 x hs x T), dP = dY V^T, dV = P^T dY.
//
//   gemm_bench [--models small,large] [--threads N] [--reps 5] [--paths sgemm,avx512bf16,onednn,libxsmm] [--json FILE]
//
// small: 4 layers d 256 seq 128 micro-batch 8 (1,024 tokens); large: 6 layers d 512 seq 256 mb 8
// (2,048 tokens); head size 64. Each figure is the median over --reps timed repetitions after a warm-up.
// ratio: per shape, best bf16 path GFLOP/s / sgemm GFLOP/s; "avx512bf16_vs_best" compares ours with the
// best of all bf16 paths measured (the target: >= 0.8).
#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "benchmarks/support/bench_json.h"
#include "core/errors.h"
#include "core/parallel.h"
#include "memory/cpu_features.h"
#include "memory/dtype.h"
#include "nn/detail/gemm.h"
#include "nn/detail/parallel.h"

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
    out.push_back({std::string(name) + ".fwd", tokens, o, in, false, true});
    out.push_back({std::string(name) + ".dx", tokens, in, o, false, false});
    out.push_back({std::string(name) + ".dw", o, in, tokens, true, false});
  }
  const int64_t heads = 8 * d / 64;  // micro-batch x heads
  out.push_back({"attn.qk", 64, T, 64, false, true, heads});
  out.push_back({"attn.pv", 64, 64, T, false, false, heads});
  out.push_back({"attn.dp", 64, T, 64, false, true, heads});
  out.push_back({"attn.dv", T, 64, 64, true, false, heads});
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

double median_seconds(int reps, const std::function<void()>& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const double t0 = zs::bench::now_seconds();
    f();
    t.push_back(zs::bench::now_seconds() - t0);
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
  dnnl::stream strm{eng};

  // Returns a callable that runs the product once (primitive built here, outside the timing).
  std::function<void(int64_t)> prepare(const Shape& s, Operands& o) {
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    // op(A) (m, k) with strides for the stored layout; likewise op(B) (k, n).
    dnnl::memory::desc a_md(dims{s.m, s.k}, dt::bf16, s.ta ? dims{1, s.m} : dims{s.k, 1});
    dnnl::memory::desc b_md(dims{s.k, s.n}, dt::bf16, s.tb ? dims{1, s.k} : dims{s.n, 1});
    dnnl::memory::desc c_md(dims{s.m, s.n}, dt::f32, dims{s.n, 1});
    auto pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), eng);
    auto prim = std::make_shared<dnnl::matmul>(pd);
    const int omp_threads = s.batch > 1 ? 1 : threads;  // a batch runs one product per pool thread
    return [this, prim, a_md, b_md, c_md, &o, s, omp_threads](int64_t b) {
      omp_set_num_threads(omp_threads);  // this thread's OpenMP team size
      dnnl::memory a(a_md, eng, o.a16.data()), bm(b_md, eng, o.b16.data()), c(c_md, eng, o.c.data() + b * s.m * s.n);
      prim->execute(strm, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, c}});
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

  std::function<void(int64_t)> prepare(const Shape& s, Operands& o) {
    if (s.k % 2 != 0) throw zs::ConfigError("libxsmm path: odd k " + std::to_string(s.k));
    auto vnni = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(s.k * s.n));
    auto a_rows = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(s.m * s.k));
    for (int64_t p = 0; p < s.k; ++p) {
      for (int64_t j = 0; j < s.n; ++j) {
        (*vnni)[((p / 2) * s.n + j) * 2 + p % 2] = o.b16[s.tb ? j * o.b_cols + p : p * o.b_cols + j];
      }
    }
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t p = 0; p < s.k; ++p) (*a_rows)[i * s.k + p] = o.a16[s.ta ? p * o.a_cols + i : i * o.a_cols + p];
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
    return [vnni, a_rows, kernels, &o, s, pool_threads](int64_t b) {
      float* c = o.c.data() + b * s.m * s.n;
      const int64_t row_blocks = (s.m + kBlock - 1) / kBlock;
      zs::parallel_for_threads(pool_threads, row_blocks, 1, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t i0 = r * kBlock, bn = std::min(kBlock, s.m - i0);
          for (int64_t j0 = 0; j0 < s.n; j0 += kBlock) {
            const int64_t bm = std::min(kBlock, s.n - j0);
            kernels->at({bm, bn})(reinterpret_cast<const libxsmm_bfloat16*>(vnni->data()) + j0 * 2,
                                  reinterpret_cast<const libxsmm_bfloat16*>(a_rows->data()) + i0 * s.k,
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
  const std::vector<std::string> models = split(zs::bench::arg_value(argc, argv, "--models", "small,large"));
  const int reps = std::stoi(zs::bench::arg_value(argc, argv, "--reps", "5"));
  const int threads = std::stoi(zs::bench::arg_value(argc, argv, "--threads", std::to_string(zs::nn::compute_threads())));
  std::vector<std::string> paths = split(zs::bench::arg_value(argc, argv, "--paths", "sgemm,avx512bf16,onednn,libxsmm"));
  if (!zs::nn::detail::gemm_path_supported(GemmPath::kAvx512Bf16)) {
    std::erase(paths, "avx512bf16");
    std::printf("note: no AVX512-BF16 on this CPU: the avx512bf16 path is skipped\n");
  }
#ifndef ZS_HAVE_DNNL
  if (std::erase(paths, "onednn") > 0) std::printf("note: built without oneDNN (libdnnl-dev): onednn skipped\n");
#else
  DnnlRunner dnnl_runner{threads};
#endif
#ifndef ZS_HAVE_XSMM
  if (std::erase(paths, "libxsmm") > 0) std::printf("note: built without libxsmm (libxsmm-dev): libxsmm skipped\n");
#else
  // Compared where our kernel runs (libxsmm would emulate bf16 elsewhere, or find no kernel).
  if (!zs::memory::cpu_has_avx512_bf16() && std::erase(paths, "libxsmm") > 0) {
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
      Operands o(s);
      const double flops = 2.0 * static_cast<double>(s.m * s.n * s.k * s.batch);
      std::map<std::string, double> gflops;
      for (const auto& path : paths) {
        std::function<void(int64_t)> one;
        if (path == "sgemm") {
          one = [&](int64_t b) {
            cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, s.m, s.n,
                        s.k, 1.0f, o.a32.data(), o.a_cols, o.b32.data(), o.b_cols, 0.0f, o.c.data() + b * s.m * s.n, s.n);
          };
        } else if (path == "avx512bf16") {
          // As the layers call it: the activation/gradient operand fp32, the weight-like one bf16.
          one = [&](int64_t b) {
            zs::nn::detail::gemm(GemmPath::kAvx512Bf16, s.m, s.n, s.k, 1.0f, Matrix::f32(o.a32.data(), o.a_cols, s.ta),
                                 Matrix{o.b16.data(), zs::memory::DType::kBF16, o.b_cols, s.tb}, 0.0f,
                                 o.c.data() + b * s.m * s.n, s.n);
          };
#ifdef ZS_HAVE_DNNL
        } else if (path == "onednn") {
          one = dnnl_runner.prepare(s, o);
#endif
#ifdef ZS_HAVE_XSMM
        } else if (path == "libxsmm") {
          one = xsmm_runner.prepare(s, o);
#endif
        } else {
          throw zs::ConfigError("--paths: unknown path '" + path + "'; use sgemm, avx512bf16, onednn, libxsmm");
        }
        // Batched shapes run one product per thread, each single-threaded inside (as attention does).
        const bool batched = s.batch > 1;
        if (batched) openblas_set_num_threads(1);
        const double t = median_seconds(reps, [&] { run_batched(s, threads, one); });
        if (batched) openblas_set_num_threads(threads);
        gflops[path] = flops / t / 1e9;
        seconds_total[path] += t;
      }
      flops_total += flops;
      std::printf("%-7s %-9s %5lld %5lld %5lld %4lld |", model.c_str(), s.name.c_str(), (long long)s.m, (long long)s.n,
                  (long long)s.k, (long long)s.batch);
      boost::json::object r, rates;
      double best_bf16 = 0;
      for (const auto& [p, g] : gflops) {
        std::printf(" %s %.1f", p.c_str(), g);
        rates[p] = g;
        if (p != "sgemm") best_bf16 = std::max(best_bf16, g);
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
      if (gflops.count("avx512bf16") && best_bf16 > 0) r["avx512bf16_vs_best"] = gflops["avx512bf16"] / best_bf16;
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
