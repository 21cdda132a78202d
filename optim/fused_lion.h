// Fused Lion kernels: one pass per element over the fp32 master weights, the gradient and the
// momentum, writing the bf16/fp16 copy of the updated weight in the same pass.
//
// Per element, in exactly the order and with exactly the fp32 operations of the scalar reference
// (Lion::step_reference, optim/lion.h), so every kernel agrees with it bit for bit:
//   g    = grad * grad_scale
//   c    = beta1 * m + one_minus_beta1 * g
//   s    = c > 0 ? 1 : (c < 0 ? -1 : c)
//   p    = p * decay - lr * s
//   m    = beta2 * m + one_minus_beta2 * g
//   low  = f32_to_bf16(p) or f32_to_f16(p)   (round to nearest even, memory/dtype.h)
// The kernel files are compiled without FMA contraction (optim/CMakeLists.txt).
//
//   LionConstants k = lion_constants(config, ctx, /*apply_weight_decay=*/true);
//   fused_lion({.master = p, .grad = g, .exp_avg = m, .n = n}, k, memory::best_isa());
//
// Thread-safety: kernels touch only the arrays they are given; disjoint ranges may run concurrently.
#pragma once

#include <cstddef>

#include "memory/cpu_features.h"
#include "memory/dtype.h"
#include "optim/lion.h"

namespace zs::optim {

// The per-step scalars of Lion::step, folded once per chunk (same rounding as the reference).
struct LionConstants {
  float beta1 = 0.9f;
  float beta2 = 0.99f;
  float one_minus_beta1 = 0.1f;  // 1.0f - beta1, in fp32
  float one_minus_beta2 = 0.01f;
  float lr = 1e-4f;
  float decay = 1.0f;            // float(1 - lr * weight_decay) (double, rounded once); 1 without decay
  float grad_scale = 1.0f;
};

LionConstants lion_constants(const LionConfig& config, const StepContext& ctx, bool apply_weight_decay);

// Raw views of one range; all arrays hold n elements. `low_precision` is nullptr or n bf16/fp16
// values (low_precision_dtype: kBF16 or kF16). No alignment needed; no array may overlap another.
struct LionArrays {
  float* master = nullptr;
  const float* grad = nullptr;
  float* exp_avg = nullptr;
  size_t n = 0;
  void* low_precision = nullptr;
  memory::DType low_precision_dtype = memory::DType::kBF16;
};

// Runs the fused kernel of `isa` (must be supported here: memory::isa_supported; checked with
// ZS_ASSERT, callers validate user choices first) over one range, on the calling thread.
void fused_lion(const LionArrays& a, const LionConstants& k, memory::IsaLevel isa);

}  // namespace zs::optim
