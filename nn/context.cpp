#include "nn/context.h"

#include <optional>

#include "core/errors.h"
#include "nn/detail/parallel.h"
#include "nn/model.h"
#include "nn/module.h"

namespace zs::nn {
namespace {

void check_can_forward(const Module& m, bool training) {
  if (training && m.forward_pending()) [[unlikely]] {
    throw InternalError(fmt::format(
        "module '{}' ({}) ran forward twice without a backward in between: each module instance runs once per "
        "forward/backward pair (use a separate instance, or call clear_saved() to discard the first forward)",
        m.display_name(), m.type_name()));
  }
}

void check_can_backward(const Module& m) {
  if (!m.forward_pending()) [[unlikely]] {
    throw InternalError(fmt::format(
        "backward of module '{}' ({}) without a training-mode forward before it (or its saved state was cleared)",
        m.display_name(), m.type_name()));
  }
}

}  // namespace

memory::Tensor Context::forward(Module& child, const memory::Tensor& input) {
  const bool train = training();
  check_can_forward(child, train);
  before_forward(child);
  memory::Tensor out = child.forward(*this, input);
  child.forward_pending_ = train;
  after_forward(child);
  return out;
}

memory::Tensor Context::backward(Module& child, const memory::Tensor& grad_output) {
  check_can_backward(child);
  before_backward(child);
  memory::Tensor dx = child.backward(*this, grad_output);
  child.forward_pending_ = false;
  after_backward(child);
  return dx;
}

float Context::forward_loss(Model& model, const Batch& batch) {
  std::optional<detail::KernelsOff> off;  // Note [measuring run] in nn/detail/parallel.h
  if (!computes()) off.emplace();
  const bool train = training();
  check_can_forward(model, train);
  before_forward(model);
  float loss = model.forward_loss(*this, batch);
  model.forward_pending_ = train;
  after_forward(model);
  return loss;
}

void Context::backward_loss(Model& model, float grad_scale) {
  std::optional<detail::KernelsOff> off;
  if (!computes()) off.emplace();
  check_can_backward(model);
  before_backward(model);
  model.backward_loss(*this, grad_scale);
  model.forward_pending_ = false;
  after_backward(model);
}

}  // namespace zs::nn
