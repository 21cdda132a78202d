#include "nn/param_access.h"

#include <exception>

#include "core/errors.h"
#include "memory/dtype.h"
#include "nn/detail/parallel.h"

namespace zs::nn {

memory::Tensor weight_f32(Context& ctx, const Parameter& p) {
  const memory::Tensor& d = p.data();
  ZS_ASSERT(d.raw() != nullptr, "parameter '{}' has no data: it must be materialised or gathered before its module runs",
            p.full_name());
  ZS_ASSERT(d.is_contiguous(), "parameter '{}' data is not contiguous", p.full_name());
  if (d.dtype() == memory::DType::kF32) return d;
  memory::Tensor w = ctx.allocate(p.shape(), memory::DType::kF32, MemoryUse::kScratch);
  if (detail::kernels_enabled()) w.copy_from(d);
  return w;
}

GradAccumulator::GradAccumulator(Context& ctx, Parameter& p) : param_(p), uncaught_at_start_(std::uncaught_exceptions()) {
  const memory::Tensor& g = p.grad();
  ZS_ASSERT(g.raw() != nullptr, "parameter '{}' has no grad tensor: the owner of model states must set one before backward",
            p.full_name());
  ZS_ASSERT(g.is_contiguous(), "parameter '{}' grad is not contiguous", p.full_name());
  if (g.dtype() == memory::DType::kF32) {
    buffer_ = g.f32();
  } else {
    scratch_ = ctx.allocate(p.shape(), memory::DType::kF32, MemoryUse::kScratch);
    if (detail::kernels_enabled()) scratch_.copy_from(g);
    buffer_ = scratch_.f32();
  }
}

void GradAccumulator::commit() {
  if (committed_) return;
  committed_ = true;
  if (scratch_.raw() != nullptr && detail::kernels_enabled()) param_.grad().copy_from(scratch_);
}

GradAccumulator::~GradAccumulator() {
  // A gradient half-written by a failing layer is not published.
  if (!committed_ && std::uncaught_exceptions() == uncaught_at_start_) commit();
}

}  // namespace zs::nn
