// The fused Adam dispatcher and its scalar kernel. This file is compiled with -fno-math-errno (so the
// sqrt in the loop vectorises to SSE2 sqrtps instead of a libm call per element) and
// -ffp-contract=off (optim/CMakeLists.txt); sqrtps and divps are correctly rounded, so the result
// still equals Adam::step_reference bit for bit.
#include "optim/fused_adam.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "core/errors.h"
#include "optim/detail/adam_kernels.h"
#include "optim/detail/low_precision.h"

namespace zs::optim {
namespace detail {

void fused_adam_scalar(const AdamArrays& a, const AdamConstants& k) {
  // Blocks small enough that the updated weights are still in L1 when the conversion reads them:
  // one pass over memory, without calling a per-element conversion inside the vectorised loop.
  constexpr size_t kBlock = 512;
  for (size_t b = 0; b < a.n; b += kBlock) {
    const size_t len = std::min(kBlock, a.n - b);
    float* __restrict p = a.master + b;
    const float* __restrict g = a.grad + b;
    float* __restrict m = a.exp_avg + b;
    float* __restrict v = a.exp_avg_sq + b;
    for (size_t i = 0; i < len; ++i) {
      const float grad = g[i] * k.grad_scale + k.l2 * p[i];
      const float mi = k.beta1 * m[i] + k.one_minus_beta1 * grad;
      const float vi = k.beta2 * v[i] + k.one_minus_beta2 * grad * grad;
      const float denom = std::sqrt(vi) * k.inv_sqrt_bc2 + k.eps;
      m[i] = mi;
      v[i] = vi;
      p[i] = p[i] - k.decoupled_decay * p[i] - k.step_size * mi / denom;
    }
    if (a.low_precision != nullptr) {
      store_low_precision_scalar(p, static_cast<uint16_t*>(a.low_precision) + b, a.low_precision_dtype, len);
    }
  }
}

}  // namespace detail

void fused_adam(const AdamArrays& a, const AdamConstants& k, memory::IsaLevel isa) {
  ZS_ASSERT(a.low_precision == nullptr || a.low_precision_dtype == memory::DType::kBF16 ||
                a.low_precision_dtype == memory::DType::kF16,
            "fused_adam: low-precision copy must be bf16 or fp16, got {}", memory::dtype_name(a.low_precision_dtype));
  ZS_ASSERT(memory::isa_supported(isa), "fused_adam: {} kernel called on a CPU without it", memory::isa_name(isa));
  switch (isa) {
    case memory::IsaLevel::kAvx512:
      detail::fused_adam_avx512(a, k);
      return;
    case memory::IsaLevel::kAvx2:
      detail::fused_adam_avx2(a, k);
      return;
    case memory::IsaLevel::kScalar:
      detail::fused_adam_scalar(a, k);
      return;
  }
}

}  // namespace zs::optim
