// The peak probe (memory/peak_flops.h): at every level this CPU runs (and the bf16 dot product where it
// has AVX512-BF16) the measured rate is positive, below a bound no core reaches (the vector's lanes x 2
// FLOPs x 2 issue ports x 6 GHz per thread) and above a floor any core passes even loaded (a quarter
// of an instruction per cycle at 1 GHz); it takes well under 0.5 s; peak_flops() measures once per
// process at best_isa() (the --isa variants check the capped level's loop).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "core/errors.h"
#include "memory/cpu_features.h"
#include "memory/peak_flops.h"

namespace zs::memory {
namespace {

constexpr double kGenerousClockHz = 6e9;
constexpr double kPorts = 2;

// fp32 multiply-adds per instruction of each probe loop (the bf16 dot product does 32).
int lanes_of(PeakKind kind, IsaLevel isa) {
  if (kind == PeakKind::kBf16Dot) return 32;
  return isa == IsaLevel::kAvx512 ? 16 : isa == IsaLevel::kAvx2 ? 8 : 4;
}

void expect_sane(const PeakFlops& p, PeakKind kind, IsaLevel isa, int threads) {
  const std::string what = fmt::format("{} at {} on {} thread(s): {} {:.1f} GFLOP/s, slowest thread {:.1f}, {:.1f} ms",
                                       peak_kind_name(kind), isa_name(isa), threads, p.instruction, p.flops_per_s / 1e9,
                                       p.min_thread_flops_per_s / 1e9, p.probe_s * 1e3);
  std::printf("%s\n", what.c_str());  // the figures, for the log
  SCOPED_TRACE(what);
  const double per_instruction = 2.0 * lanes_of(kind, isa);  // FLOPs
  EXPECT_EQ(p.lanes, lanes_of(kind, isa));
  EXPECT_EQ(p.threads, threads);
  EXPECT_EQ(p.isa, isa);
  EXPECT_EQ(p.kind, kind);
  EXPECT_GT(p.min_thread_flops_per_s, per_instruction * 0.25 * 1e9);
  EXPECT_LE(p.min_thread_flops_per_s * threads, p.flops_per_s * (1 + 1e-12));
  EXPECT_LT(p.flops_per_s, per_instruction * kPorts * kGenerousClockHz * threads);
  EXPECT_LT(p.probe_s, 0.5);
}

TEST(PeakFlops, EverySupportedLevelMeasuresASaneRate) {
  for (IsaLevel isa : supported_isas()) {
    for (int threads : {1, 2}) {
      expect_sane(measure_peak_flops(PeakKind::kFp32Fma, isa, threads), PeakKind::kFp32Fma, isa, threads);
    }
  }
}

TEST(PeakFlops, Bf16DotProductWhereTheCpuHasIt) {
  if (!peak_supported(PeakKind::kBf16Dot, IsaLevel::kAvx512)) {
    EXPECT_THROW(measure_peak_flops(PeakKind::kBf16Dot, IsaLevel::kAvx512, 1), InternalError);
    GTEST_SKIP() << "no AVX512-BF16 here";
  }
  for (int threads : {1, 2}) {
    expect_sane(measure_peak_flops(PeakKind::kBf16Dot, IsaLevel::kAvx512, threads), PeakKind::kBf16Dot,
                IsaLevel::kAvx512, threads);
  }
  EXPECT_FALSE(peak_supported(PeakKind::kBf16Dot, IsaLevel::kAvx2));
}

TEST(PeakFlops, MeasuredOncePerProcessAtTheLibrarysLevel) {
  const PeakFlops& first = peak_flops(PeakKind::kFp32Fma, 1);
  EXPECT_EQ(first.isa, best_isa());  // capped by the variants' --isa
  expect_sane(first, PeakKind::kFp32Fma, best_isa(), 1);
  const PeakFlops& again = peak_flops(PeakKind::kFp32Fma, 1);
  EXPECT_EQ(&first, &again);  // kept, not measured again
  EXPECT_EQ(first.flops_per_s, again.flops_per_s);
  EXPECT_NE(&peak_flops(PeakKind::kFp32Fma, 2), &first);  // per thread count
}

TEST(PeakFlops, RefusesBadArguments) {
  EXPECT_THROW(measure_peak_flops(PeakKind::kFp32Fma, IsaLevel::kScalar, 0), InternalError);
}

}  // namespace
}  // namespace zs::memory
