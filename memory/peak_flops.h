// The peak floating-point rate of the cores a rank computes on, measured (model FLOPs utilisation:
// achieved FLOP/s over this; docs/benchmarks.md, "Model FLOPs utilisation").
//
//   const memory::PeakFlops& p = memory::peak_flops(memory::PeakKind::kFp32Fma, threads);  // once per process
//   double mfu = flops_per_step / step_seconds / p.flops_per_s;
//
// Note [peak probe]: nominal peaks (cores x clock x FMA ports x lanes) need a clock nobody can read
// reliably (turbo, AVX-512 licences, a VM's steal) and per-microarchitecture port tables, so the peak
// is measured: a loop of independent register-only multiply-adds (no memory traffic), timed in short
// trials on each of `threads` threads at once. The threads meet at a start line (so cores that share
// execution units, SMT siblings, are measured sharing them) and run trials for a fixed wall time;
// each thread's best trial is its rate (a preemption or a frequency ramp spoils single trials, not the
// best one: the figure holds on a loaded machine), and the rank's peak is their sum. The instruction
// is the one the products of that kind run on:
//   kFp32Fma  vfmadd231ps on the widest vector of best_isa() (zmm under AVX-512, ymm under AVX2; the
//             --isa cap lowers it like every kernel choice), mulps + addps on xmm at kScalar
//   kBf16Dot  vdpbf16ps zmm (AVX512-BF16): 32 multiply-adds per instruction
// About 10 ms per kind; results are kept per (kind, isa, threads) for the life of the process.
// Thread-safe.
#pragma once

#include <cstdint>
#include <string_view>

#include "memory/cpu_features.h"

namespace zs::memory {

enum class PeakKind : uint8_t { kFp32Fma, kBf16Dot };

struct PeakFlops {
  PeakKind kind{};
  double flops_per_s = 0.0;   // all threads together
  double min_thread_flops_per_s = 0.0;  // the slowest thread's rate
  int threads = 0;
  IsaLevel isa = IsaLevel::kScalar;
  std::string_view instruction;  // "vfmadd231ps zmm", "vdpbf16ps zmm", ...
  int lanes = 0;                 // fp32 multiply-adds per instruction
  double probe_s = 0.0;          // wall time of the measurement
};

// Whether `kind` can be measured at `isa` here: kFp32Fma at every supported level, kBf16Dot at
// kAvx512 on a CPU with AVX512-BF16.
bool peak_supported(PeakKind kind, IsaLevel isa);
// The peak of `kind` on `threads` (>= 1) threads at best_isa(), measured on first use and kept.
// Throws InternalError when !peak_supported(kind, best_isa()) (kBf16Dot without AVX512-BF16).
const PeakFlops& peak_flops(PeakKind kind, int threads);
// One fresh measurement at an explicit level (tests exercise every level the CPU runs).
PeakFlops measure_peak_flops(PeakKind kind, IsaLevel isa, int threads);
std::string_view peak_kind_name(PeakKind kind);  // "fp32 FMA", "bf16 dot product"

}  // namespace zs::memory
