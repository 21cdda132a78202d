// Internal to memory/peak_flops.cpp: the register-only multiply-add loops of the peak probe, one per
// instruction set (Note [peak probe] in memory/peak_flops.h), each in a file compiled for its ISA.
#pragma once

#include <cstdint>

namespace zs::memory::detail {

// Each runs `iterations` rounds over its independent accumulator chains and returns the
// multiply-adds done (fp32 lanes x instructions); the result goes to `sink` so the loop is kept.
uint64_t peak_loop_sse(int64_t iterations, volatile float& sink);        // mulps + addps xmm (baseline)
uint64_t peak_loop_avx2(int64_t iterations, volatile float& sink);       // vfmadd231ps ymm
uint64_t peak_loop_avx512(int64_t iterations, volatile float& sink);     // vfmadd231ps zmm
uint64_t peak_loop_avx512bf16(int64_t iterations, volatile float& sink); // vdpbf16ps zmm

}  // namespace zs::memory::detail
