#include "nn/flops.h"

#include <atomic>

#include "nn/detail/gemm.h"
#include "nn/threads.h"

namespace zs::nn {
namespace {
std::atomic<uint64_t> g_flops{0};
std::atomic<uint64_t> g_recomputed{0};
}  // namespace

uint64_t flops_performed() { return g_flops.load(std::memory_order_relaxed); }

void add_flops(uint64_t flops) { g_flops.fetch_add(flops, std::memory_order_relaxed); }

uint64_t flops_recomputed() { return g_recomputed.load(std::memory_order_relaxed); }

void add_flops_recomputed(uint64_t flops) { g_recomputed.fetch_add(flops, std::memory_order_relaxed); }

const memory::PeakFlops& product_peak(memory::DType compute) {
  const bool dot = compute == memory::DType::kBF16 && detail::bf16_gemm_path() == detail::GemmPath::kAvx512Bf16;
  return memory::peak_flops(dot ? memory::PeakKind::kBf16Dot : memory::PeakKind::kFp32Fma, compute_threads());
}

}  // namespace zs::nn
