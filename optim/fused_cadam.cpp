// The fused CAdam dispatcher and its scalar kernel. Compiled with -ffp-contract=off (no fused
// multiply-add where the reference rounds twice) and -fno-math-errno (optim/CMakeLists.txt), so the
// result equals CAdam::step_reference bit for bit.
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "core/errors.h"
#include "optim/detail/cadam_kernels.h"
#include "optim/detail/low_precision.h"

namespace zs::optim::detail {
namespace {

// floor(y) for y in [-127, 128] without libm (floorf needs SSE4.1's roundss to be inlined on baseline
// x86-64): truncate through int32 (cvttss2si, exact here), then step down where that rounded up.
inline int32_t floor_small(float y) {
  const auto t = static_cast<int32_t>(y);
  return y < static_cast<float>(t) ? t - 1 : t;
}

// Updates one block of len <= 32 elements; returns nothing, writes p, q and the block's scale.
inline void update_block(const CAdamConstants& k, float* __restrict p, const float* __restrict g, int8_t* __restrict q,
                         float* __restrict scale, size_t len) {
  const float s_old = *scale;
  float m_new[kCAdamBlock];
  float dither[kCAdamBlock];
  for (size_t i = 0; i < len; ++i) {
    dither[i] = cadam_dither(std::bit_cast<uint32_t>(p[i]), k.lane_key[i]);
    const float m = static_cast<float>(q[i]) * s_old;
    const float grad = g[i] * k.grad_scale;
    const float c = k.beta1 * m + k.one_minus_beta1 * grad;
    const float sign = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : c);
    p[i] = p[i] - k.lr * (sign + k.weight_decay * p[i]);
    m_new[i] = k.beta2 * m + k.one_minus_beta2 * grad;
  }
  float absmax = 0.0f;
  bool finite = true;
  for (size_t i = 0; i < len; ++i) {
    const float a = std::fabs(m_new[i]);
    finite = finite && a <= std::numeric_limits<float>::max();
    absmax = std::max(absmax, a);
  }
  const float s = cadam_block_scale(absmax, finite);
  *scale = s;
  if (s > 0.0f) [[likely]] {
    const float inv = cadam_block_inverse(absmax);
    for (size_t i = 0; i < len; ++i) {
      const float x = std::clamp(m_new[i] * inv, -127.0f, 127.0f);
      q[i] = static_cast<int8_t>(std::min(floor_small(x + dither[i]), int32_t{127}));
    }
  } else {
    std::fill_n(q, len, int8_t{0});
  }
}

}  // namespace

void fused_cadam_scalar(const CAdamArrays& a, const CAdamConstants& k) {
  // Superblocks small enough that the updated weights are still in L1 when the conversion reads them.
  constexpr size_t kSuper = 16 * kCAdamBlock;
  for (size_t b = 0; b < a.n; b += kSuper) {
    const size_t len = std::min(kSuper, a.n - b);
    for (size_t i = 0; i < len; i += kCAdamBlock) {
      update_block(k, a.master + b + i, a.grad + b + i, a.exp_avg_q + b + i, a.exp_avg_scale + (b + i) / kCAdamBlock,
                   std::min(kCAdamBlock, len - i));
    }
    if (a.low_precision != nullptr) {
      store_low_precision_scalar(a.master + b, static_cast<uint16_t*>(a.low_precision) + b, a.low_precision_dtype, len);
    }
  }
}

void fused_cadam(const CAdamArrays& a, const CAdamConstants& k, memory::IsaLevel isa) {
  ZS_ASSERT(a.low_precision == nullptr || a.low_precision_dtype == memory::DType::kBF16 ||
                a.low_precision_dtype == memory::DType::kF16,
            "fused_cadam: low-precision copy must be bf16 or fp16, got {}", memory::dtype_name(a.low_precision_dtype));
  ZS_ASSERT(memory::isa_supported(isa), "fused_cadam: {} kernel called on a CPU without it", memory::isa_name(isa));
  switch (isa) {
    case memory::IsaLevel::kAvx512:
      fused_cadam_avx512(a, k);
      return;
    case memory::IsaLevel::kAvx2:
      fused_cadam_avx2(a, k);
      return;
    case memory::IsaLevel::kScalar:
      fused_cadam_scalar(a, k);
      return;
  }
}

}  // namespace zs::optim::detail
