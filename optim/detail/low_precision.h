// The scalar kernels' last move: the updated fp32 values rounded into the caller's bf16/fp16 copy
// (round to nearest even, the scalar conversion so a scalar reference stays scalar). Internal.
#pragma once

#include <cstddef>
#include <cstdint>

#include "memory/dtype.h"

namespace zs::optim::detail {

inline void store_low_precision_scalar(const float* values, void* low, memory::DType dtype, size_t n) {
  auto* out = static_cast<uint16_t*>(low);
  if (dtype == memory::DType::kBF16) {
    memory::convert_f32_to_bf16({values, n}, {out, n}, memory::IsaLevel::kScalar);
  } else {
    memory::convert_f32_to_f16({values, n}, {out, n}, memory::IsaLevel::kScalar);
  }
}

}  // namespace zs::optim::detail
