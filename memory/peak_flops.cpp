#include "memory/peak_flops.h"

#include <emmintrin.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/clock.h"
#include "core/errors.h"
#include "core/parallel.h"
#include "core/spin.h"
#include "memory/detail/peak_kernels.h"

namespace zs::memory {

namespace detail {

// Baseline x86-64 (SSE2, no FMA): a multiply and an add per chain step, 4 lanes each.
uint64_t peak_loop_sse(int64_t iterations, volatile float& sink) {
  constexpr int kChains = 12;  // + 2 constants within the 16 xmm registers
  const __m128 x = _mm_set1_ps(1.0f - 0x1p-20f);
  const __m128 y = _mm_set1_ps(0x1p-10f);
  __m128 acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm_set1_ps(static_cast<float>(j));
  for (int64_t i = 0; i < iterations; ++i) {
    for (int j = 0; j < kChains; ++j) acc[j] = _mm_add_ps(_mm_mul_ps(acc[j], x), y);
  }
  __m128 total = acc[0];
  for (int j = 1; j < kChains; ++j) total = _mm_add_ps(total, acc[j]);
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, total);
  sink = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  return static_cast<uint64_t>(iterations) * kChains * 4;
}

}  // namespace detail

namespace {

using Loop = uint64_t (*)(int64_t, volatile float&);

struct Probe {
  Loop loop;
  std::string_view instruction;
  int lanes;
};

Probe probe_for(PeakKind kind, IsaLevel isa) {
  if (kind == PeakKind::kBf16Dot) return {&detail::peak_loop_avx512bf16, "vdpbf16ps zmm", 32};
  switch (isa) {
    case IsaLevel::kAvx512: return {&detail::peak_loop_avx512, "vfmadd231ps zmm", 16};
    case IsaLevel::kAvx2: return {&detail::peak_loop_avx2, "vfmadd231ps ymm", 8};
    case IsaLevel::kScalar: break;
  }
  return {&detail::peak_loop_sse, "mulps + addps xmm", 4};
}

// Note [peak probe] in peak_flops.h. 2048 rounds of 12-16 chains: 5-25 us per trial, long against the
// clock's reading (~25 ns) and short against a scheduler's time slice, so most trials run whole.
constexpr int64_t kIterations = 2048;
constexpr double kTrialWindowS = 0.01;  // each thread's trials, after the start line
constexpr double kStartLineS = 0.2;     // a worker later than this (a loaded machine) starts alone

struct Run {
  Loop loop;
  int threads;
  std::atomic<int> arrived{0};
  std::vector<double> best_rate;  // multiply-adds per second, per thread
};

void run_thread(Run& run, int chunk) {
  const double arrived_at = now_seconds();
  run.arrived.fetch_add(1);
  for (int spins = 0; run.arrived.load() < run.threads && now_seconds() - arrived_at < kStartLineS; ++spins) {
    if (spins % 64 == 63) sched_yield();  // a late worker may need this core to arrive at all
    cpu_relax();
  }
  volatile float sink = 0.0f;
  double best = 0.0;
  const double end = now_seconds() + kTrialWindowS;
  for (int trial = 0; trial < 3 || now_seconds() < end; ++trial) {
    const double t0 = now_seconds();
    const uint64_t macs = run.loop(kIterations, sink);
    const double dt = now_seconds() - t0;
    if (dt > 0) best = std::max(best, static_cast<double>(macs) / dt);
  }
  run.best_rate[static_cast<size_t>(chunk)] = best;
}

}  // namespace

bool peak_supported(PeakKind kind, IsaLevel isa) {
  if (!isa_supported(isa)) return false;
  return kind == PeakKind::kFp32Fma || (isa == IsaLevel::kAvx512 && cpu_has_avx512_bf16());
}

std::string_view peak_kind_name(PeakKind kind) {
  return kind == PeakKind::kBf16Dot ? "bf16 dot product" : "fp32 FMA";
}

PeakFlops measure_peak_flops(PeakKind kind, IsaLevel isa, int threads) {
  ZS_ASSERT(threads >= 1, "measure_peak_flops: threads {} (>= 1)", threads);
  ZS_ASSERT(peak_supported(kind, isa), "measure_peak_flops: {} at {} cannot run on this CPU", peak_kind_name(kind),
            isa_name(isa));
  const Probe probe = probe_for(kind, isa);
  Run run{.loop = probe.loop, .threads = threads, .best_rate = std::vector<double>(static_cast<size_t>(threads), 0.0)};
  const double t0 = now_seconds();
  parallel_for_threads(threads, threads, 1, [&](int64_t begin, int64_t end, int chunk) {
    (void)begin, (void)end;
    run_thread(run, chunk);
  });
  // Workers left polling would take the cores from the next library's threads (Note [worker spin]).
  park_pool_workers();
  PeakFlops p;
  p.kind = kind;
  p.threads = threads;
  p.isa = isa;
  p.instruction = probe.instruction;
  p.lanes = probe.lanes;
  p.probe_s = now_seconds() - t0;
  double sum = 0.0, least = run.best_rate.front();
  for (double r : run.best_rate) {
    sum += r;
    least = std::min(least, r);
  }
  p.flops_per_s = 2.0 * sum;  // a multiply-add is two FLOPs
  p.min_thread_flops_per_s = 2.0 * least;
  return p;
}

const PeakFlops& peak_flops(PeakKind kind, int threads) {
  static std::mutex mu;
  static std::map<std::tuple<PeakKind, IsaLevel, int>, PeakFlops> measured;  // node addresses are stable
  const IsaLevel isa = best_isa();
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_tuple(kind, isa, threads);
  auto it = measured.find(key);
  if (it == measured.end()) it = measured.emplace(key, measure_peak_flops(kind, isa, threads)).first;
  return it->second;
}

}  // namespace zs::memory
