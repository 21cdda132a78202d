// The fused Lion dispatcher and its scalar kernel. Compiled with -ffp-contract=off
// (optim/CMakeLists.txt), so the result equals Lion::step_reference bit for bit.
#include "optim/fused_lion.h"

#include <algorithm>

#include "core/errors.h"
#include "optim/detail/lion_kernels.h"
#include "optim/detail/low_precision.h"

namespace zs::optim {
namespace detail {

void fused_lion_scalar(const LionArrays& a, const LionConstants& k) {
  // Blocks small enough that the updated weights are still in L1 when the conversion reads them
  // (as fused_adam_scalar).
  constexpr size_t kBlock = 512;
  for (size_t b = 0; b < a.n; b += kBlock) {
    const size_t len = std::min(kBlock, a.n - b);
    float* __restrict p = a.master + b;
    const float* __restrict g = a.grad + b;
    float* __restrict m = a.exp_avg + b;
    for (size_t i = 0; i < len; ++i) {
      const float grad = g[i] * k.grad_scale;
      const float c = k.beta1 * m[i] + k.one_minus_beta1 * grad;
      const float sign = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : c);
      p[i] = p[i] * k.decay - k.lr * sign;
      m[i] = k.beta2 * m[i] + k.one_minus_beta2 * grad;
    }
    if (a.low_precision != nullptr) {
      store_low_precision_scalar(p, static_cast<uint16_t*>(a.low_precision) + b, a.low_precision_dtype, len);
    }
  }
}

}  // namespace detail

void fused_lion(const LionArrays& a, const LionConstants& k, memory::IsaLevel isa) {
  ZS_ASSERT(a.low_precision == nullptr || a.low_precision_dtype == memory::DType::kBF16 ||
                a.low_precision_dtype == memory::DType::kF16,
            "fused_lion: low-precision copy must be bf16 or fp16, got {}", memory::dtype_name(a.low_precision_dtype));
  ZS_ASSERT(memory::isa_supported(isa), "fused_lion: {} kernel called on a CPU without it", memory::isa_name(isa));
  switch (isa) {
    case memory::IsaLevel::kAvx512:
      detail::fused_lion_avx512(a, k);
      return;
    case memory::IsaLevel::kAvx2:
      detail::fused_lion_avx2(a, k);
      return;
    case memory::IsaLevel::kScalar:
      detail::fused_lion_scalar(a, k);
      return;
  }
}

}  // namespace zs::optim
