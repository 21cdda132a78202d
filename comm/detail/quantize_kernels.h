// Per-ISA kernels of comm/quantize.h over separate scale and value arrays (internal to comm). Each
// kernel covers every element (tails included) and gives the scalar kernel's bits.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace zs::comm::detail {

// The scale of a block (Note [Int8 blocks]): its value `scale` and the factor `inv` each element is
// multiplied by before rounding. Internal linkage: each ISA's file has its own copy.
namespace {
struct BlockScale {
  float scale;
  float inv;
};
[[maybe_unused]] BlockScale block_scale(float absmax, bool non_finite) {
  if (non_finite) return {std::numeric_limits<float>::quiet_NaN(), 0.0f};
  if (absmax == 0.0f) return {0.0f, 0.0f};
  const float inv = 127.0f / absmax;
  if (inv > std::numeric_limits<float>::max()) return {0.0f, 0.0f};  // absmax below ~3.7e-37: flushed
  return {absmax / 127.0f, inv};
}
}  // namespace

// x[0..n) -> scales[0..ceil(n / kQuantBlock)), q[0..n).
void quantize_scalar(const float* x, size_t n, float* scales, int8_t* q);
void quantize_avx2(const float* x, size_t n, float* scales, int8_t* q);
void quantize_avx512(const float* x, size_t n, float* scales, int8_t* q);
// out[i] (=|+=) q[i] * scales[i / kQuantBlock].
void dequantize_scalar(const int8_t* q, const float* scales, size_t n, float* out, bool accumulate);
void dequantize_avx2(const int8_t* q, const float* scales, size_t n, float* out, bool accumulate);
void dequantize_avx512(const int8_t* q, const float* scales, size_t n, float* out, bool accumulate);

}  // namespace zs::comm::detail
