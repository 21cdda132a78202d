#include "nn/detail/gemm.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>

#include "core/errors.h"
#include "memory/cpu_features.h"
#include "memory/dtype.h"
#include "memory/peak_flops.h"
#include "nn/detail/gemm_kernels.h"
#include "nn/detail/ops.h"
#include "nn/detail/parallel.h"
#include "nn/flops.h"

namespace zs::nn::detail {
namespace {

// The kSgemm path's fp32 view of an operand: the data itself, or a widened copy in `keep`.
const float* as_f32(const Matrix& x, int64_t rows, int64_t cols, std::vector<float>& keep) {
  if (x.dtype == memory::DType::kF32) return static_cast<const float*>(x.data);
  ZS_ASSERT(x.dtype == memory::DType::kBF16, "gemm: operand dtype {} (fp32 or bf16 only)", memory::dtype_name(x.dtype));
  // Stored (rows, cols) with row stride ld: widen the rows whole, keeping the stride.
  keep.resize(static_cast<size_t>(rows > 0 ? (rows - 1) * x.ld + cols : 0));
  memory::convert_bf16_to_f32({static_cast<const uint16_t*>(x.data), keep.size()}, keep);
  return keep.data();
}

}  // namespace

namespace {

Bf16GemmChoice choose_bf16_path() {
  // Checked first, so a misspelt value is an error on every CPU, not only where it would be used.
  const char* env = std::getenv("ZS_BF16_GEMM");
  const std::string_view want = env == nullptr || *env == '\0' ? "auto" : env;
  if (want != "auto" && want != "native" && want != "sgemm") {
    throw ConfigError(fmt::format("ZS_BF16_GEMM={}: unknown value; use auto (measure this CPU, the default), native "
                                  "(the AVX512-BF16 kernel) or sgemm (fp32 products)",
                                  want));
  }
  if (!memory::cpu_has_avx512_bf16()) return {GemmPath::kSgemm, 0.0, "the CPU has no AVX512-BF16"};
  if (memory::best_isa() < memory::IsaLevel::kAvx512) return {GemmPath::kSgemm, 0.0, "AVX-512 kernels are off (--isa)"};
  if (want == "native") return {GemmPath::kAvx512Bf16, 0.0, "ZS_BF16_GEMM=native", true};
  if (want == "sgemm") return {GemmPath::kSgemm, 0.0, "ZS_BF16_GEMM=sgemm"};
  // Note [bf16 product rate]: one core's rates, as the kernel's per-core blocks see them. A ratio below
  // the margin is measured again, up to kBf16RateTries times in all, and the best one counts.
  double ratio = memory::peak_flops(memory::PeakKind::kBf16Dot, 1).flops_per_s /
                 memory::peak_flops(memory::PeakKind::kFp32Fma, 1).flops_per_s;
  const memory::IsaLevel isa = memory::best_isa();
  for (int tries = 1; ratio < kMinBf16RateOverFma && tries < kBf16RateTries; ++tries) {
    ratio = std::max(ratio, memory::measure_peak_flops(memory::PeakKind::kBf16Dot, isa, 1).flops_per_s /
                                memory::measure_peak_flops(memory::PeakKind::kFp32Fma, isa, 1).flops_per_s);
  }
  if (ratio >= kMinBf16RateOverFma) return {GemmPath::kAvx512Bf16, ratio, "vdpbf16ps outruns fp32 FMAs here", true};
  return {GemmPath::kSgemm, ratio, "vdpbf16ps does not outrun fp32 FMAs here", true};
}

}  // namespace

namespace {
Bf16GemmChoice& process_choice() {
  static Bf16GemmChoice choice = choose_bf16_path();
  return choice;
}
}  // namespace

const Bf16GemmChoice& bf16_gemm_choice() { return process_choice(); }

void set_bf16_gemm_path(GemmPath path, std::string_view why) {
  ZS_ASSERT(gemm_path_supported(path), "bf16 products: path avx512bf16 on a CPU without AVX512-BF16");
  Bf16GemmChoice& choice = process_choice();
  choice.path = path;
  choice.why = why;
}

GemmPath bf16_gemm_path() { return bf16_gemm_choice().path; }

GemmPath gemm_path_for(memory::DType weight) {
  return weight == memory::DType::kBF16 ? bf16_gemm_path() : GemmPath::kSgemm;
}

bool gemm_path_supported(GemmPath path) {
  return path == GemmPath::kSgemm || memory::cpu_has_avx512_bf16();
}

std::string_view gemm_path_name(GemmPath path) {
  return path == GemmPath::kAvx512Bf16 ? "avx512bf16" : "sgemm";
}

void gemm(GemmPath path, int64_t m, int64_t n, int64_t k, float alpha, const Matrix& a, const Matrix& b, float beta,
          float* c, int64_t ldc, const float* bias) {
  if (m == 0 || n == 0 || !kernels_enabled()) return;
  if (path == GemmPath::kAvx512Bf16) {
    ZS_ASSERT(gemm_path_supported(path), "gemm: path avx512bf16 on a CPU without AVX512-BF16");
    gemm_avx512bf16(m, n, k, alpha, a, b, beta, c, ldc, bias);
    add_flops(2 * static_cast<uint64_t>(m) * static_cast<uint64_t>(n) * static_cast<uint64_t>(k));  // nn/flops.h
    return;
  }
  if (bias != nullptr) {  // C starts as bias in every row; sgemm accumulates on top
    parallel_for(m, 64, [=](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r) std::copy_n(bias, n, c + r * ldc);
    });
  }
  std::vector<float> a_keep, b_keep;
  const float* ap = as_f32(a, a.trans ? k : m, a.trans ? m : k, a_keep);
  const float* bp = as_f32(b, b.trans ? n : k, b.trans ? k : n, b_keep);
  detail::gemm(a.trans, b.trans, m, n, k, alpha, ap, a.ld, bp, b.ld, beta, c, ldc);
}

}  // namespace zs::nn::detail
