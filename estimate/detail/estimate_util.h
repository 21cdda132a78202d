// Internal helpers shared by the estimator's sources (estimate.cpp: the rules; estimate_offload.cpp:
// the offload tiers and buffers; estimate_report.cpp: table and JSON). Not installed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "estimate/estimate.h"
#include "engine/offload_rules.h"
#include "engine/flat_layout.h"
#include "offload/aligned_buffer.h"

namespace zs::engine::detail {

inline constexpr uint64_t kAlign = FlatLayout::kAlignElements;
// Host offload buffers are page-mapped and swap-file regions 4096-aligned.
inline constexpr uint64_t kPageBytes = offload::kIoAlignment;

inline uint64_t round_up(uint64_t n, uint64_t align) { return (n + align - 1) / align * align; }
inline uint64_t ceil_div(uint64_t n, uint64_t d) { return (n + d - 1) / d; }
inline uint64_t bytes_per_element(Precision p) { return p == Precision::kFp32 ? 4 : 2; }

// "1,500,000,000".
std::string group_digits(uint64_t v);
// Optimizer-state bytes per stepped element, master excluded (reports; exact only for elementwise
// optimizers, whose states scale with the stepped elements).
double state_bytes_per_element(const EstimateInput& in);
// m at `stage`: 2 with reuse_fp32_param (a residual), 4 for a separate fp32 master (bf16/fp16, or
// anything offloaded), else 0.
uint64_t master_bytes_at(const EstimateInput& in, int stage);

// estimate_offload.cpp. ConfigError when optimizer offload at `stage` meets a compressed optimizer or
// reuse_fp32_param (parse_config's rules).
void check_offload(const EstimateInput& in, int stage);
// The " -> host (...)" / " -> NVMe (...)" suffixes of the category formulas at `stage`.
std::string params_tier_note(const EstimateInput& in, int stage);
std::string grads_tier_note(const EstimateInput& in, int stage);
std::string optimizer_tier_note(const EstimateInput& in, int stage);
// Stage 3 with parameters on NVMe: the gatherer's prefetch window (offload_rules.h) for the input's limits.
uint64_t nvme_prefetch_window(const EstimateInput& in);
// Stage 3 with parameters on NVMe: the bound on the gatherer's host staging buffers.
TransientBound nvme_param_staging_bound(const EstimateInput& in, int stage);
// ShardGroup::offload_buffers' formula in symbols.
std::string offload_buffers_symbols(const EstimateInput& in, int stage);

}  // namespace zs::engine::detail
