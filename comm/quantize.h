// Block-quantised int8: the wire format of ZeRO++'s quantised weight all-gather (qwZ) and quantised
// gradient reduce-scatter (qgZ), comm/quantized_collectives.h.
//
//   std::vector<int32_t> wire(comm::int8_words(n));
//   comm::quantize_int8(x, n, wire.data());          // n floats -> scales + int8 values
//   comm::dequantize_int8(wire.data(), n, y);        // y[i] = q[i] * scale of i's block
//
// Note [Int8 blocks]
// n elements are cut into blocks of kQuantBlock (the last may be shorter); each block has one fp32
// scale, symmetric (DeepSpeed's qwZ: per-group symmetric int8, csrc/quantization): s = absmax / 127
// and q = round-to-nearest-even(x * (127 / absmax)), in [-127, 127]; a value comes back as q * s.
// Error per element: |x - q s| <= s / 2 (plus the fp32 rounding of the product, a few ulp of absmax).
// An all-zero block has s = 0. A block whose absmax is so small that 127 / absmax overflows (below
// ~3.7e-37) is flushed to zero (s = 0): its error is below that bound. A block holding an inf or a
// NaN gets s = NaN and q = 0, so every value of it comes back NaN: fp16 training's overflow check
// still sees the overflow after the collective (a finite absmax there would hide it).
// Wire layout of one piece: ceil(n / kQuantBlock) scales (fp32 bits, one int32 word each), then the
// n int8 values, padded to whole words: int8_words(n) int32 words, ~n/4 (1.6% of it scales).
// Kernels: scalar, AVX2 and AVX-512, chosen at run time (memory/cpu_features.h); all give the same
// bits (the block's absmax is exact in any order; one multiply, one rounding per element; the
// dequantising add is a multiply then an add, never fused).
#pragma once

#include <cstddef>
#include <cstdint>

#include "memory/cpu_features.h"

namespace zs::comm {

inline constexpr size_t kQuantBlock = 256;  // elements per scale

// int32 words of the wire form of n elements.
constexpr size_t int8_words(size_t n) { return (n + kQuantBlock - 1) / kQuantBlock + (n + 3) / 4; }

// Packs x[0..n) into wire[0..int8_words(n)) (Note [Int8 blocks]).
void quantize_int8(const float* x, size_t n, int32_t* wire);
void quantize_int8(const float* x, size_t n, int32_t* wire, memory::IsaLevel isa);
// out[i] = value i of the wire form of n elements; `accumulate`: out[i] += it instead.
void dequantize_int8(const int32_t* wire, size_t n, float* out, bool accumulate = false);
void dequantize_int8(const int32_t* wire, size_t n, float* out, bool accumulate, memory::IsaLevel isa);

}  // namespace zs::comm
