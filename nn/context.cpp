#include "nn/context.h"

#include <optional>

#include "core/clock.h"
#include "core/errors.h"
#include "nn/detail/parallel.h"
#include "nn/flops.h"
#include "nn/model.h"
#include "nn/module.h"

namespace zs::nn {
namespace {

// Every check here is reachable from a user's model code: the errors are ModelErrors that say what the
// model must do, never internal assertions (Lifecycle rule in nn/context.h).
void check_can_forward(const Module& m, bool training) {
  if (training && m.forward_pending()) [[unlikely]] {
    throw ModelError(fmt::format(
        "module '{}' ({}) ran forward twice without a backward in between: a module instance runs once per "
        "forward/backward pair. To use one weight twice (a tied embedding, weight sharing), let one module own the "
        "parameter and use it twice inside its own forward/backward (\"Shared weights\" in nn/module.h); otherwise "
        "declare a separate instance",
        m.display_name(), m.type_name()));
  }
}

void check_can_backward(const Module& m) {
  if (!m.forward_pending()) [[unlikely]] {
    throw ModelError(fmt::format(
        "backward of module '{}' ({}) without a training-mode forward before it: its forward was not run through the "
        "Context (call ctx.forward(child, x), never child.forward(ctx, x)), or its backward already ran in this pass",
        m.display_name(), m.type_name()));
  }
}

// After m's backward: a child whose forward ran but whose backward did not would lose its gradients.
void check_children_done(const Module& m) {
  for (const Module* c : m.children()) {
    if (c->forward_pending()) [[unlikely]] {
      throw ModelError(fmt::format(
          "module '{}' ({}) finished its backward without the backward of its child '{}' ({}), whose forward ran in "
          "this pass: call ctx.backward(child, dy) for every child its forward ran through ctx.forward (a skipped "
          "backward would leave that child's gradients out silently)",
          m.display_name(), m.type_name(), c->display_name(), c->type_name()));
    }
  }
}

// Sets Context::running_ for the duration of one module call.
class RunningScope {
 public:
  RunningScope(const Module*& slot, const Module& m) : slot_(slot), previous_(slot) { slot_ = &m; }
  ~RunningScope() { slot_ = previous_; }
  RunningScope(const RunningScope&) = delete;
  RunningScope& operator=(const RunningScope&) = delete;

 private:
  const Module*& slot_;
  const Module* previous_;
};

}  // namespace

void Context::run_deferred(std::vector<DeferredGrad>& grads) {
  std::optional<detail::KernelsOff> off;  // Note [measuring run], as forward_loss and backward_loss
  if (!computes()) off.emplace();
  for (DeferredGrad& g : grads) {
    RunningScope scope(running_, *g.owner);
    g.compute(*this);
  }
  grads.clear();
}

// Note [activation recomputation]
// A recomputed module (Module::set_recomputed) runs its training forward as any module, through
// the hooks; when it returns, its subtree's saved tensors are dropped (clear_saved) and only its input
// is kept (keep_recompute_input). Its backward starts by restoring the input and running the forward
// again through Context::forward, hooks and all: ZeRO-3 gathers the subtree's parameters for the
// re-run as for any forward, and since the re-run is part of the backward pass, the order the
// gatherer records and prefetches along includes it (the first step records it, later steps follow
// it). The re-run is the same code on the same input and parameters, so it saves the same tensors
// (bit for bit: kernels are deterministic at a fixed thread count, and random draws are keyed by the
// pass, not by a call counter); then the module's backward runs as it would have. Checkpointed
// modules nested in one being re-run are not recomputed again: the re-run keeps their tensors for
// the backward that follows at once. Peak: the kept inputs, plus one recomputed module's
// activations during its re-run and backward (plus whatever unrecomputed modules keep).
memory::Tensor Context::forward(Module& child, const memory::Tensor& input) {
  const bool train = training();
  check_can_forward(child, train);
  before_forward(child);
  memory::Tensor out;
  {
    RunningScope running(running_, child);
    out = child.forward(*this, input);
  }
  child.forward_pending_ = train;
  if (train && child.recomputed_ && recompute_depth_ == 0) {
    child.clear_saved();
    child.forward_pending_ = true;
    child.recompute_input_ = keep_recompute_input(input);
    child.recompute_kept_ = true;
  }
  after_forward(child);
  return out;
}

void Context::recompute(Module& child) {
  const double t0 = now_seconds();
  const uint64_t flops0 = flops_performed();
  memory::Tensor input = restore_recompute_input(std::move(child.recompute_input_));
  child.recompute_input_ = {};
  child.recompute_kept_ = false;
  child.forward_pending_ = false;
  struct Depth {
    int& d;
    explicit Depth(int& depth) : d(depth) { ++d; }
    ~Depth() { --d; }
  } depth(recompute_depth_);
  forward(child, input);  // the output is the forward's; only the saved tensors are wanted
  ++recompute_.modules;
  recompute_.seconds += now_seconds() - t0;
  add_flops_recomputed(flops_performed() - flops0);  // nn/flops.h: not the model's FLOPs
}

memory::Tensor Context::backward(Module& child, const memory::Tensor& grad_output) {
  check_can_backward(child);
  if (child.recompute_kept_) recompute(child);
  before_backward(child);
  memory::Tensor dx;
  {
    RunningScope running(running_, child);
    dx = child.backward(*this, grad_output);
  }
  child.forward_pending_ = false;
  check_children_done(child);
  after_backward(child);
  return dx;
}

void Context::skip_forward(Module& child) {
  before_forward(child);
  for (Module* c : child.children()) skip_forward(*c);
  after_forward(child);
}

void Context::skip_backward(Module& child) {
  before_backward(child);
  const std::vector<Module*> children = child.children();
  for (auto it = children.rbegin(); it != children.rend(); ++it) skip_backward(**it);
  after_backward(child);
}

float Context::forward_loss(Model& model, const Batch& batch) {
  std::optional<detail::KernelsOff> off;  // Note [measuring run] in nn/detail/parallel.h
  if (!computes()) off.emplace();
  const bool train = training();
  check_can_forward(model, train);
  before_forward(model);
  float loss = 0.0f;
  {
    RunningScope running(running_, model);
    loss = model.forward_loss(*this, batch);
  }
  model.forward_pending_ = train;
  after_forward(model);
  return loss;
}

void Context::backward_loss(Model& model, float grad_scale) {
  std::optional<detail::KernelsOff> off;
  if (!computes()) off.emplace();
  check_can_backward(model);
  before_backward(model);
  {
    RunningScope running(running_, model);
    model.backward_loss(*this, grad_scale);
  }
  model.forward_pending_ = false;
  check_children_done(model);
  after_backward(model);
}

}  // namespace zs::nn
