// Dispatch and the scalar kernels of comm/quantize.h.
#include "comm/quantize.h"

#include <algorithm>
#include <cmath>

#include "comm/detail/quantize_kernels.h"
#include "core/errors.h"

namespace zs::comm {
namespace detail {

void quantize_scalar(const float* x, size_t n, float* scales, int8_t* q) {
  for (size_t b = 0; b < n; b += kQuantBlock) {
    const size_t len = std::min(kQuantBlock, n - b);
    float absmax = 0.0f;
    bool non_finite = false;
    for (size_t i = 0; i < len; ++i) {
      const float a = std::fabs(x[b + i]);
      non_finite |= !(a <= std::numeric_limits<float>::max());
      absmax = a > absmax ? a : absmax;
    }
    const BlockScale s = block_scale(absmax, non_finite);
    scales[b / kQuantBlock] = s.scale;
    for (size_t i = 0; i < len; ++i) {
      // Round to nearest even (the SIMD conversions' mode); |x * inv| <= 127 up to one rounding.
      const float r = non_finite ? 0.0f : std::nearbyint(x[b + i] * s.inv);
      q[b + i] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
    }
  }
}

void dequantize_scalar(const int8_t* q, const float* scales, size_t n, float* out, bool accumulate) {
  for (size_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(q[i]) * scales[i / kQuantBlock];
    out[i] = accumulate ? out[i] + v : v;
  }
}

}  // namespace detail

namespace {

void check_isa(memory::IsaLevel isa) {
  if (!memory::isa_supported(isa)) {
    throw ConfigError(fmt::format("int8 quantisation: the {} kernel cannot run on this CPU", memory::isa_name(isa)));
  }
}

float* scales_of(int32_t* wire) { return reinterpret_cast<float*>(wire); }
const float* scales_of(const int32_t* wire) { return reinterpret_cast<const float*>(wire); }
size_t scale_words(size_t n) { return (n + kQuantBlock - 1) / kQuantBlock; }

}  // namespace

void quantize_int8(const float* x, size_t n, int32_t* wire, memory::IsaLevel isa) {
  check_isa(isa);
  auto* q = reinterpret_cast<int8_t*>(wire + scale_words(n));
  if (n % 4 != 0) wire[int8_words(n) - 1] = 0;  // the padding bytes of the last word: defined
  switch (isa) {
    case memory::IsaLevel::kAvx512: return detail::quantize_avx512(x, n, scales_of(wire), q);
    case memory::IsaLevel::kAvx2: return detail::quantize_avx2(x, n, scales_of(wire), q);
    case memory::IsaLevel::kScalar: return detail::quantize_scalar(x, n, scales_of(wire), q);
  }
}

void dequantize_int8(const int32_t* wire, size_t n, float* out, bool accumulate, memory::IsaLevel isa) {
  check_isa(isa);
  const auto* q = reinterpret_cast<const int8_t*>(wire + scale_words(n));
  switch (isa) {
    case memory::IsaLevel::kAvx512: return detail::dequantize_avx512(q, scales_of(wire), n, out, accumulate);
    case memory::IsaLevel::kAvx2: return detail::dequantize_avx2(q, scales_of(wire), n, out, accumulate);
    case memory::IsaLevel::kScalar: return detail::dequantize_scalar(q, scales_of(wire), n, out, accumulate);
  }
}

void quantize_int8(const float* x, size_t n, int32_t* wire) {
  static const memory::IsaLevel isa = memory::best_isa();
  quantize_int8(x, n, wire, isa);
}

void dequantize_int8(const int32_t* wire, size_t n, float* out, bool accumulate) {
  static const memory::IsaLevel isa = memory::best_isa();
  dequantize_int8(wire, n, out, accumulate, isa);
}

}  // namespace zs::comm
