#include "nn/param_access.h"

#include <exception>

#include "core/errors.h"
#include "memory/dtype.h"
#include "nn/detail/parallel.h"
#include "nn/module.h"

namespace zs::nn {
namespace {

bool within(const Module& ancestor, const Module& m) {
  return ancestor.name().empty() || m.name().rfind(ancestor.name() + ".", 0) == 0;
}

// A parameter is valid only while the module that declared it runs through the Context: the engine
// gathers it for that module (ZeRO-3) and collects its gradient after that module's backward. Anything
// else is the model's mistake, named here before it reads a released parameter or loses a gradient.
void check_owner_running(const Context& ctx, const Parameter& p) {
  const Module* owner = p.owner();
  const Module* running = ctx.running();
  if (owner == nullptr || owner == running) [[likely]] return;
  if (running == nullptr || within(*running, *owner)) {
    throw ModelError(fmt::format(
        "module '{}' ({}) ran without the Context: its parameter '{}' was used while {} was running. A module's "
        "forward/backward must be called as ctx.forward(child, x) / ctx.backward(child, dy), never "
        "child.forward(ctx, x), so the engine can gather its parameters and collect its gradients",
        owner->display_name(), owner->type_name(), p.full_name(),
        running == nullptr ? std::string("no module") : fmt::format("'{}'", running->display_name())));
  }
  throw ModelError(fmt::format(
      "module '{}' ({}) used parameter '{}' of another module, '{}': a parameter is valid only while the module that "
      "declares it runs (at ZeRO-3 it is gathered for that module alone). To share a weight, let one module own it "
      "and use it twice inside its own forward/backward (\"Shared weights\" in nn/module.h)",
      running->display_name(), running->type_name(), p.full_name(), owner->display_name()));
}

}  // namespace

const memory::Tensor& weight_stored(Context& ctx, const Parameter& p) {
  check_owner_running(ctx, p);
  const memory::Tensor& d = p.data();
  // The engine always sets data before the owner runs; a model run on its own needs materialize().
  if (d.raw() == nullptr) [[unlikely]] {
    throw UsageError(fmt::format("parameter '{}' has no data: a model run without the engine needs its storage first "
                                 "(nn::materialize(model, seed))",
                                 p.full_name()));
  }
  ZS_ASSERT(d.is_contiguous(), "parameter '{}' data is not contiguous", p.full_name());
  return d;
}

memory::Tensor weight_f32(Context& ctx, const Parameter& p) {
  const memory::Tensor& d = weight_stored(ctx, p);
  if (d.dtype() == memory::DType::kF32) return d;
  memory::Tensor w = ctx.allocate(p.shape(), memory::DType::kF32, MemoryUse::kScratch);
  if (detail::kernels_enabled()) w.copy_from(d);
  return w;
}

GradAccumulator::GradAccumulator(Context& ctx, Parameter& p) : param_(p), uncaught_at_start_(std::uncaught_exceptions()) {
  check_owner_running(ctx, p);
  const memory::Tensor& g = p.grad();
  if (g.raw() == nullptr) [[unlikely]] {
    throw UsageError(fmt::format("parameter '{}' has no grad tensor: a model run without the engine needs its storage "
                                 "first (nn::materialize(model, seed))",
                                 p.full_name()));
  }
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
