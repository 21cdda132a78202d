// Per-ISA fused Lion kernels behind optim/fused_lion.h (internal).
//
// Each kernel updates a.n elements (any length; it handles its own tail) and agrees bit for bit with
// Lion::step_reference. The avx2/avx512 kernels live in files compiled with their ISA flags: call
// them only when memory::isa_supported() says so.
#pragma once

#include "optim/fused_lion.h"

namespace zs::optim::detail {

void fused_lion_scalar(const LionArrays& a, const LionConstants& k);
void fused_lion_avx2(const LionArrays& a, const LionConstants& k);
void fused_lion_avx512(const LionArrays& a, const LionConstants& k);

}  // namespace zs::optim::detail
