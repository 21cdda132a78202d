// Question: how close do the fused optimizer steps (AdamW: optim/fused_adam.h; CAdam: optim/cadam.h,
// both via Optimizer::step_parallel) come to the memory-bandwidth ceiling of their own traffic, at 1
// and 2 threads, 1M to 200M parameters; and how many parameters per second does CAdam's smaller
// state (1.125 B/param against AdamW's 8) buy?
//
// The baseline, measured in the same run at the same size and thread count, is a loop per optimizer
// with exactly its memory traffic and no arithmetic. AdamW: read master, gradient and both moments,
// write master and both moments back in place. CAdam: read master, gradient, the int8 momentum and
// the block scales, write master, int8 momentum and scales back. Both (with a low-precision copy)
// also write a 16-bit copy of master. STREAM's triad is not that ceiling: it never reads the array it
// writes, while an optimizer reads every line before writing it. The ceiling loops use the same
// vector width as the kernels and the same split into per-thread ranges as step_parallel (cache lines
// for AdamW, whole 32-element blocks for CAdam). Each point is the median of several repetitions,
// ceiling and optimizer interleaved so that both see the same machine load, after a warm-up pass.
// GB/s counts bytes read + written: AdamW 28 B/param in fp32 (16 read, 12 written), 30 with a bf16
// copy; CAdam 14.25 B/param (9.125 read, 5.125 written), 16.25 with a bf16 copy. Sizes are parameter
// counts (K/M/G = 1e3/1e6/1e9).
//
//   optim_bench [--sizes 1M,10M,50M,200M] [--threads 1,2] [--optimizers adamw,cadam]
//               [--isa scalar|avx2|avx512] [--reps N] [--json FILE]
// GCC 12's AVX-512 intrinsics trip -Wmaybe-uninitialized in the header (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/support/bench_json.h"
#include "core/errors.h"
#include "core/parallel.h"
#include "memory/cpu_features.h"
#include "optim/adam.h"
#include "optim/cadam.h"

namespace {

using zs::bench::now_seconds;
using zs::memory::IsaLevel;

std::vector<size_t> parse_list(const std::string& list, const std::string& flag, bool units) {
  std::vector<size_t> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    std::string item = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) {
      size_t pos = 0;
      unsigned long long v = 0;
      try {
        v = std::stoull(item, &pos);
      } catch (const std::exception&) {
        throw zs::ConfigError(flag + ": '" + item + "' is not a number; use e.g. " + (units ? "1M,10M,200M" : "1,2"));
      }
      std::string unit = item.substr(pos);
      if (units && unit == "K") v *= 1000ull;
      else if (units && unit == "M") v *= 1000000ull;
      else if (units && unit == "G") v *= 1000000000ull;
      else if (!unit.empty()) throw zs::ConfigError(flag + ": unknown suffix in '" + item + "'; use e.g. " + (units ? "1M,10M,200M" : "1,2"));
      if (v == 0) throw zs::ConfigError(flag + ": values must be >= 1, got '" + item + "'");
      out.push_back(v);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (out.empty()) throw zs::ConfigError(flag + ": expected a comma-separated list such as " + (units ? "1M,10M,200M" : "1,2"));
  return out;
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
template <typename T>
using Buffer = std::unique_ptr<T[], FreeDeleter>;

template <typename T>
Buffer<T> allocate(size_t n) {
  size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
  auto* p = static_cast<T*>(std::aligned_alloc(64, bytes));
  if (p == nullptr) throw zs::OutOfMemoryError("optim_bench: cannot allocate " + std::to_string(bytes) + " bytes; pass smaller --sizes");
  return Buffer<T>(p);
}

// The ceiling loops: loads and stores of exactly Adam's arrays, no arithmetic. The empty asm hides
// the loaded values from the compiler: without it, storing a value just loaded from the same address
// is removed as redundant, and so is the unused gradient load. The 16-bit copy is master's bits
// truncated (one pack instruction, as cheap as the kernel's conversion store).
void ceiling_scalar(float* p, const float* g, float* m, float* v, uint16_t* low, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float pv = p[i], gv = g[i], mv = m[i], vv = v[i];
    asm volatile("" : "+x"(pv), "+x"(mv), "+x"(vv) : "x"(gv));
    m[i] = mv;
    v[i] = vv;
    p[i] = pv;
    uint32_t bits;
    std::memcpy(&bits, &pv, 4);
    if (low != nullptr) low[i] = static_cast<uint16_t>(bits);
  }
}

__attribute__((target("avx512f,avx512bw"))) void ceiling_avx512(float* p, const float* g, float* m, float* v,
                                                                 uint16_t* low, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 pv = _mm512_loadu_ps(p + i), gv = _mm512_loadu_ps(g + i);
    __m512 mv = _mm512_loadu_ps(m + i), vv = _mm512_loadu_ps(v + i);
    asm volatile("" : "+v"(pv), "+v"(mv), "+v"(vv) : "v"(gv));
    _mm512_storeu_ps(m + i, mv);
    _mm512_storeu_ps(v + i, vv);
    _mm512_storeu_ps(p + i, pv);
    if (low != nullptr) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(low + i), _mm512_cvtepi32_epi16(_mm512_castps_si512(pv)));
    }
  }
  ceiling_scalar(p + i, g + i, m + i, v + i, low == nullptr ? nullptr : low + i, n - i);
}

__attribute__((target("avx2"))) void ceiling_avx2(float* p, const float* g, float* m, float* v, uint16_t* low, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 pv = _mm256_loadu_ps(p + i), gv = _mm256_loadu_ps(g + i);
    __m256 mv = _mm256_loadu_ps(m + i), vv = _mm256_loadu_ps(v + i);
    asm volatile("" : "+x"(pv), "+x"(mv), "+x"(vv) : "x"(gv));
    _mm256_storeu_ps(m + i, mv);
    _mm256_storeu_ps(v + i, vv);
    _mm256_storeu_ps(p + i, pv);
    if (low != nullptr) {
      __m256i b = _mm256_srli_epi32(_mm256_castps_si256(pv), 16);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(low + i),
                       _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
    }
  }
  ceiling_scalar(p + i, g + i, m + i, v + i, low == nullptr ? nullptr : low + i, n - i);
}

// Runs the ceiling loop of `isa` over [0, n) split like Optimizer::step_parallel (cache lines of
// master, at least 1024 lines per thread).
void ceiling(IsaLevel isa, int threads, float* p, const float* g, float* m, float* v, uint16_t* low, size_t n) {
  const int64_t lines = static_cast<int64_t>((n + 15) / 16);
  zs::parallel_for_threads(threads, lines, 1024, [&](int64_t l0, int64_t l1, int) {
    const size_t b = static_cast<size_t>(l0) * 16, e = std::min(n, static_cast<size_t>(l1) * 16);
    uint16_t* lo = low == nullptr ? nullptr : low + b;
    switch (isa) {
      case IsaLevel::kAvx512: ceiling_avx512(p + b, g + b, m + b, v + b, lo, e - b); break;
      case IsaLevel::kAvx2: ceiling_avx2(p + b, g + b, m + b, v + b, lo, e - b); break;
      case IsaLevel::kScalar: ceiling_scalar(p + b, g + b, m + b, v + b, lo, e - b); break;
    }
  });
}

// CAdam's ceiling loops: per block of 32, loads of master, gradient, the 32 int8 momenta and the
// block's scale, stores of master, momenta and scale (and the 16-bit copy), no arithmetic.
void cadam_ceiling_scalar(float* p, const float* g, int8_t* q, float* scale, uint16_t* low, size_t n) {
  for (size_t b = 0; b < n; b += 32) {
    float s = scale[b / 32];
    asm volatile("" : "+x"(s));
    scale[b / 32] = s;
    for (size_t i = b; i < std::min(n, b + 32); ++i) {
      float pv = p[i], gv = g[i];
      int8_t qv = q[i];
      asm volatile("" : "+x"(pv), "+r"(qv) : "x"(gv));
      p[i] = pv;
      q[i] = qv;
      uint32_t bits;
      std::memcpy(&bits, &pv, 4);
      if (low != nullptr) low[i] = static_cast<uint16_t>(bits);
    }
  }
}

__attribute__((target("avx512f,avx512bw"))) void cadam_ceiling_avx512(float* p, const float* g, int8_t* q, float* scale,
                                                                       uint16_t* low, size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 p0 = _mm512_loadu_ps(p + i), p1 = _mm512_loadu_ps(p + i + 16);
    __m512 g0 = _mm512_loadu_ps(g + i), g1 = _mm512_loadu_ps(g + i + 16);
    __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i));
    float s = scale[i / 32];
    asm volatile("" : "+v"(p0), "+v"(p1), "+v"(qv), "+x"(s) : "v"(g0), "v"(g1));
    _mm512_storeu_ps(p + i, p0);
    _mm512_storeu_ps(p + i + 16, p1);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), qv);
    scale[i / 32] = s;
    if (low != nullptr) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(low + i), _mm512_cvtepi32_epi16(_mm512_castps_si512(p0)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(low + i + 16), _mm512_cvtepi32_epi16(_mm512_castps_si512(p1)));
    }
  }
  cadam_ceiling_scalar(p + i, g + i, q + i, scale + i / 32, low == nullptr ? nullptr : low + i, n - i);
}

__attribute__((target("avx2"))) void cadam_ceiling_avx2(float* p, const float* g, int8_t* q, float* scale,
                                                        uint16_t* low, size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i));
    float s = scale[i / 32];
    asm volatile("" : "+x"(qv), "+x"(s));
    for (size_t j = 0; j < 32; j += 8) {
      __m256 pv = _mm256_loadu_ps(p + i + j), gv = _mm256_loadu_ps(g + i + j);
      asm volatile("" : "+x"(pv) : "x"(gv));
      _mm256_storeu_ps(p + i + j, pv);
      if (low != nullptr) {
        __m256i b = _mm256_srli_epi32(_mm256_castps_si256(pv), 16);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(low + i + j),
                         _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
      }
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), qv);
    scale[i / 32] = s;
  }
  cadam_ceiling_scalar(p + i, g + i, q + i, scale + i / 32, low == nullptr ? nullptr : low + i, n - i);
}

// Split like Optimizer::step_parallel for alignment 32: whole blocks, lcm(16, 32) = 32 elements per
// unit, at least 512 units per thread.
void cadam_ceiling(IsaLevel isa, int threads, float* p, const float* g, int8_t* q, float* scale, uint16_t* low,
                   size_t n) {
  const int64_t units = static_cast<int64_t>((n + 31) / 32);
  zs::parallel_for_threads(threads, units, 512, [&](int64_t u0, int64_t u1, int) {
    const size_t b = static_cast<size_t>(u0) * 32, e = std::min(n, static_cast<size_t>(u1) * 32);
    uint16_t* lo = low == nullptr ? nullptr : low + b;
    switch (isa) {
      case IsaLevel::kAvx512: cadam_ceiling_avx512(p + b, g + b, q + b, scale + b / 32, lo, e - b); break;
      case IsaLevel::kAvx2: cadam_ceiling_avx2(p + b, g + b, q + b, scale + b / 32, lo, e - b); break;
      case IsaLevel::kScalar: cadam_ceiling_scalar(p + b, g + b, q + b, scale + b / 32, lo, e - b); break;
    }
  });
}

int reps_for(size_t traffic_bytes, int forced) {
  if (forced > 0) return forced;
  double r = 3e9 / static_cast<double>(traffic_bytes);  // ~0.3 s of traffic per point at ~10 GB/s
  return static_cast<int>(std::min(200.0, std::max(3.0, r)));
}

std::string human_params(size_t n) {
  if (n >= 1000000 && n % 1000000 == 0) return std::to_string(n / 1000000) + "M";
  if (n >= 1000 && n % 1000 == 0) return std::to_string(n / 1000) + "K";
  return std::to_string(n);
}

std::vector<std::string> parse_optimizers(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = list.find(',', start);
    const std::string item = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item != "adamw" && item != "cadam") {
      throw zs::ConfigError("--optimizers: unknown optimizer '" + item + "'; use a list of adamw and cadam");
    }
    if (std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// Median seconds of the ceiling and of the optimizer over `reps` interleaved repetitions.
template <typename Ceiling, typename Step>
std::pair<double, double> measure(int reps, Ceiling&& ceiling_once, Step&& step_once) {
  ceiling_once();  // warm-up
  step_once();
  std::vector<double> tc, to;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_seconds();
    ceiling_once();
    const double t1 = now_seconds();
    step_once();
    const double t2 = now_seconds();
    tc.push_back(t1 - t0);
    to.push_back(t2 - t1);
  }
  return {zs::bench::median(tc), zs::bench::median(to)};
}

}  // namespace

int main(int argc, char** argv) try {
  const std::vector<size_t> sizes = parse_list(zs::bench::arg_value(argc, argv, "--sizes", "1M,10M,50M,200M"), "--sizes", true);
  const std::vector<size_t> thread_list = parse_list(zs::bench::arg_value(argc, argv, "--threads", "1,2"), "--threads", false);
  const std::vector<std::string> optimizers = parse_optimizers(zs::bench::arg_value(argc, argv, "--optimizers", "adamw,cadam"));
  const std::string isa_arg = zs::bench::arg_value(argc, argv, "--isa", "");
  const IsaLevel isa = isa_arg.empty() ? zs::memory::best_isa() : zs::memory::parse_isa(isa_arg, "--isa");
  int reps_arg = 0;
  if (std::string r = zs::bench::arg_value(argc, argv, "--reps", ""); !r.empty()) reps_arg = static_cast<int>(parse_list(r, "--reps", false).front());

  const zs::optim::AdamConfig adam_cfg{.lr = 1e-3, .weight_decay = 0.01, .adam_w_mode = true};
  const zs::optim::Adam adam(adam_cfg, isa);
  // Lion's rule (optim/cadam.h): lr 10x smaller and weight decay 10x larger than AdamW's.
  const zs::optim::CAdamConfig cadam_cfg{.lr = 1e-4, .betas = {0.965, 0.99}, .weight_decay = 0.1};
  const zs::optim::CAdam cadam(cadam_cfg, isa);

  zs::bench::Report report;
  report.benchmark = "optim_bench";
  boost::json::array size_list, thread_json, optimizer_json;
  for (size_t s : sizes) size_list.push_back(s);
  for (size_t t : thread_list) thread_json.push_back(t);
  for (const std::string& o : optimizers) optimizer_json.push_back(boost::json::string(o == "adamw" ? "AdamW" : "CAdam"));
  report.config["params"] = size_list;
  report.config["threads"] = thread_json;
  report.config["optimizers"] = optimizer_json;
  report.config["isa"] = std::string(zs::memory::isa_name(isa));
  report.config["adamw"] = "AdamW lr 1e-3 betas (0.9, 0.999) eps 1e-8 weight_decay 0.01";
  report.config["cadam"] = "CAdam lr 1e-4 betas (0.965, 0.99) weight_decay 0.1, int8 momentum, fp32 scale per 32";
  boost::json::object state_bytes;
  state_bytes["AdamW"] = adam.state_bytes_per_param();
  state_bytes["CAdam"] = cadam.state_bytes_per_param();
  report.config["optimizer_state_bytes_per_param"] = state_bytes;
  report.config["gbps_counts"] =
      "bytes read + written per second, 1e9: AdamW 28 B/param fp32, 30 with bf16 copy; CAdam 14.25 B/param fp32, "
      "16.25 with bf16 copy";

  std::printf("optimizer state bytes per param: AdamW %.3f, CAdam %.3f\n", adam.state_bytes_per_param(),
              cadam.state_bytes_per_param());
  std::printf("%-6s %-6s %-5s %3s %5s %10s %10s %12s %8s %8s\n", "opt", "params", "copy", "thr", "reps", "Gparam/s",
              "GB/s", "ceiling GB/s", "ratio", "vs AdamW");
  boost::json::object ratios;
  double adam_min_from_10m = 1e9, cadam_min_from_10m = 1e9;
  for (size_t n : sizes) {
    // AdamW and CAdam share master, gradient and the 16-bit copy.
    Buffer<float> p = allocate<float>(n), g = allocate<float>(n);
    Buffer<uint16_t> low = allocate<uint16_t>(n);
    const bool want_adam = std::find(optimizers.begin(), optimizers.end(), "adamw") != optimizers.end();
    const bool want_cadam = std::find(optimizers.begin(), optimizers.end(), "cadam") != optimizers.end();
    const size_t blocks = (n + 31) / 32;
    Buffer<float> m = allocate<float>(want_adam ? n : 1), v = allocate<float>(want_adam ? n : 1);
    Buffer<int8_t> q = allocate<int8_t>(want_cadam ? n : 1);
    Buffer<float> scale = allocate<float>(want_cadam ? blocks : 1);
    for (size_t i = 0; i < n; ++i) {  // also faults every page in before timing
      p[i] = static_cast<float>(i % 1001) * 1e-3f - 0.5f;
      g[i] = static_cast<float>(i % 997) * 1e-5f - 5e-3f;
      low[i] = 0;
      if (want_adam) m[i] = 0.0f, v[i] = 0.0f;
      if (want_cadam) q[i] = 0;
    }
    for (size_t b = 0; want_cadam && b < blocks; ++b) scale[b] = 0.0f;
    void* adam_states[] = {m.get(), v.get()};
    void* cadam_states[] = {q.get(), scale.get()};
    int64_t step = 0;
    std::map<std::string, double> adam_rate;  // "copy/threads" -> Gparam/s, for CAdam's "vs AdamW"
    for (const std::string& which : optimizers) {
      const bool is_cadam = which == "cadam";
      const zs::optim::Optimizer& opt = is_cadam ? static_cast<const zs::optim::Optimizer&>(cadam) : adam;
      const std::string name(opt.name());
      for (bool with_low : {false, true}) {
        const size_t traffic = is_cadam ? n * (with_low ? 16 : 14) + 2 * blocks * 4 : n * (with_low ? 30 : 28);
        const int reps = reps_for(traffic, reps_arg);
        for (size_t threads : thread_list) {
          const int t = static_cast<int>(threads);
          const std::span<void* const> states = is_cadam ? std::span<void* const>(cadam_states) : adam_states;
          zs::optim::ParamChunk chunk{.master = {p.get(), n}, .grad = {g.get(), n}, .states = states};
          if (with_low) chunk.low_precision = low.get();
          uint16_t* lo = with_low ? low.get() : nullptr;
          const double lr = is_cadam ? cadam_cfg.lr : adam_cfg.lr;
          auto [sc, so] = measure(
              reps,
              [&] {
                if (is_cadam) {
                  cadam_ceiling(isa, t, p.get(), g.get(), q.get(), scale.get(), lo, n);
                } else {
                  ceiling(isa, t, p.get(), g.get(), m.get(), v.get(), lo, n);
                }
              },
              [&] { opt.step_parallel(chunk, {.step = ++step, .lr = lr}, t); });
          const double gbps = static_cast<double>(traffic) / so / 1e9;
          const double ceil_gbps = static_cast<double>(traffic) / sc / 1e9;
          const double ratio = gbps / ceil_gbps;
          const double gparams = static_cast<double>(n) / so / 1e9;
          const std::string key = std::string(with_low ? "bf16" : "fp32") + "/t" + std::to_string(t);
          if (!is_cadam) adam_rate[key] = gparams;
          const double vs_adam = is_cadam && adam_rate.count(key) ? gparams / adam_rate[key] : 0.0;
          std::printf("%-6s %-6s %-5s %3d %5d %10.3f %10.2f %12.2f %8.3f %8s\n", name.c_str(), human_params(n).c_str(),
                      with_low ? "bf16" : "none", t, reps, gparams, gbps, ceil_gbps, ratio,
                      vs_adam > 0 ? fmt::format("{:.2f}x", vs_adam).c_str() : "");
          boost::json::object row;
          row["optimizer"] = name;
          row["params"] = n;
          row["low_precision"] = with_low ? "bf16" : "none";
          row["threads"] = t;
          row["repetitions"] = reps;
          row["state_bytes_per_param"] = opt.state_bytes_per_param();
          row["traffic_bytes"] = traffic;
          row["median_s"] = so;
          row["ceiling_median_s"] = sc;
          row["gparams_per_s"] = gparams;
          row["gbps"] = gbps;
          row["ceiling_gbps"] = ceil_gbps;
          row["ratio"] = ratio;
          if (vs_adam > 0) row["params_per_s_vs_adamw"] = vs_adam;
          report.results.push_back(std::move(row));
          ratios[name + "/" + human_params(n) + "/" + key] = ratio;
          if (vs_adam > 0) ratios["CAdam_vs_AdamW_params_per_s/" + human_params(n) + "/" + key] = vs_adam;
          if (n >= 10000000) {
            double& lowest = is_cadam ? cadam_min_from_10m : adam_min_from_10m;
            lowest = std::min(lowest, ratio);
          }
        }
      }
    }
  }
  report.baseline["name"] =
      "traffic ceilings, one per optimizer: AdamW reads master, grad, exp_avg, exp_avg_sq and writes master and "
      "moments in place; CAdam reads master, grad, int8 momentum, block scales and writes master, momentum, scales; "
      "(+ 16-bit copy); no arithmetic; same ISA width, threads and split, same run";
  if (adam_min_from_10m < 1e9) ratios["AdamW/min_from_10M"] = adam_min_from_10m;
  if (cadam_min_from_10m < 1e9) ratios["CAdam/min_from_10M"] = cadam_min_from_10m;
  report.ratio = ratios;
  std::printf("ratio = optimizer GB/s / its ceiling's GB/s at the same size and thread count");
  if (adam_min_from_10m < 1e9) std::printf("; lowest from 10M params up: AdamW %.3f", adam_min_from_10m);
  if (cadam_min_from_10m < 1e9) std::printf(", CAdam %.3f", cadam_min_from_10m);
  std::printf(" (target >= 0.9)\n");
  const std::string json = zs::bench::json_path_arg(argc, argv);
  if (!json.empty()) report.write(json);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "optim_bench: %s\n", e.what());
  return 1;
}
