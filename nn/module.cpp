#include "nn/module.h"

#include "core/errors.h"
#include "nn/model.h"

namespace zs::nn {

Module::~Module() = default;

std::string Module::display_name() const { return name_.empty() ? std::string("<root>") : name_; }

namespace {

// Declarations come from the user's module constructors: a clash is the model's mistake (ModelError).
void check_unique_name(const Module& m, const std::string& name, std::string_view what, bool clash) {
  if (clash) [[unlikely]] {
    throw ModelError(fmt::format("{} declares {} '{}', but the name is taken by another parameter or child of the same "
                                 "module; give each a distinct name",
                                 m.type_name(), what, name));
  }
}

}  // namespace

Parameter& Module::declare_param(std::string name, memory::Shape shape, Init init, std::vector<std::string> tags) {
  for (const auto& p : params_) check_unique_name(*this, name, "parameter", p->name() == name);
  for (const auto& c : children_) check_unique_name(*this, name, "parameter", c->local_name_ == name);
  params_.push_back(std::make_unique<Parameter>(std::move(name), std::move(shape), init, std::move(tags)));
  params_.back()->owner_ = this;
  return *params_.back();
}

void Module::adopt_child(std::string name, std::unique_ptr<Module> child) {
  if (name.empty() || name.find('.') != std::string::npos) {
    throw ModelError(fmt::format("{} declares child '{}': a child name must be non-empty and without '.'", type_name(), name));
  }
  for (const auto& c : children_) check_unique_name(*this, name, "child", c->local_name_ == name);
  for (const auto& p : params_) check_unique_name(*this, name, "child", p->name() == name);
  child->local_name_ = name;
  child->name_ = std::move(name);
  children_.push_back(std::move(child));
}

void Module::adopt_part(std::unique_ptr<Module> part) {
  part->local_name_.clear();
  part->name_.clear();
  children_.push_back(std::move(part));
}

std::vector<Parameter*> Module::params() const {
  std::vector<Parameter*> out;
  out.reserve(params_.size());
  for (const auto& p : params_) out.push_back(p.get());
  return out;
}

std::vector<Module*> Module::children() const {
  std::vector<Module*> out;
  out.reserve(children_.size());
  for (const auto& c : children_) out.push_back(c.get());
  return out;
}

std::vector<Module*> Module::named_modules() {
  std::vector<Module*> out{this};
  for (const auto& c : children_) {
    auto sub = c->named_modules();
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

void Module::visit_params(const std::function<void(Parameter&)>& fn) {
  for (const auto& p : params_) fn(*p);
  for (const auto& c : children_) c->visit_params(fn);
}

std::vector<Parameter*> Module::all_params() {
  std::vector<Parameter*> out;
  visit_params([&](Parameter& p) { out.push_back(&p); });
  return out;
}

Parameter* Module::find_param(std::string_view full_name) {
  Parameter* found = nullptr;
  visit_params([&](Parameter& p) {
    if (found == nullptr && p.full_name() == full_name) found = &p;
  });
  return found;
}

int64_t Module::param_count() {
  int64_t n = 0;
  visit_params([&](Parameter& p) { n += p.numel(); });
  return n;
}

void Module::clear_saved() {
  clear_own_saved();
  forward_pending_ = false;
  recompute_kept_ = false;
  recompute_input_ = {};
  for (const auto& c : children_) c->clear_saved();
}

memory::Tensor Sequential::forward(Context& ctx, const memory::Tensor& input) {
  memory::Tensor x = input;
  for (Module* c : children()) x = ctx.forward(*c, x);
  return x;
}

memory::Tensor Sequential::backward(Context& ctx, const memory::Tensor& grad_output) {
  memory::Tensor dy = grad_output;
  auto kids = children();
  for (auto it = kids.rbegin(); it != kids.rend(); ++it) dy = ctx.backward(**it, dy);
  return dy;
}

memory::Tensor Model::forward(Context&, const memory::Tensor&) {
  throw UsageError(fmt::format("model '{}' ({}) was run as a child module: a Model runs through Context::forward_loss "
                               "(the engine's forward), not Context::forward; make the shared part a plain nn::Module",
                               display_name(), type_name()));
}

memory::Tensor Model::backward(Context&, const memory::Tensor&) {
  throw UsageError(fmt::format("model '{}' ({}) was run as a child module: a Model runs through Context::backward_loss "
                               "(the engine's backward), not Context::backward; make the shared part a plain nn::Module",
                               display_name(), type_name()));
}

namespace {

void name_tree(Module& m, const std::string& path) {
  for (Parameter* p : m.params()) p->set_full_name(path.empty() ? p->name() : path + "." + p->name());
  for (Module* c : m.children()) {
    // A part (adopt_part) adds no component.
    std::string child_path = path.empty() || c->local_name().empty() ? path + c->local_name() : path + "." + c->local_name();
    name_tree(*c, child_path);
  }
}

}  // namespace

void assign_names(Module& root) {
  root.local_name_.clear();
  root.name_.clear();
  for (Module* m : root.named_modules()) {
    for (Module* c : m->children()) {
      c->name_ = m->name_.empty() || c->local_name_.empty() ? m->name_ + c->local_name_ : m->name_ + "." + c->local_name_;
    }
  }
  name_tree(root, "");
}

void materialize(Module& root, uint64_t seed, memory::DType dtype) {
  ZS_ASSERT(dtype != memory::DType::kI32, "materialize with an integer dtype");
  assign_names(root);
  root.visit_params([&](Parameter& p) {
    memory::Tensor values = memory::Tensor::empty(p.shape(), memory::DType::kF32);
    p.init_values(values.f32(), 0, seed);
    if (dtype == memory::DType::kF32) {
      p.set_data(values);
    } else {
      memory::Tensor stored = memory::Tensor::empty(p.shape(), dtype);
      stored.copy_from(values);
      p.set_data(stored);
    }
    p.set_grad(memory::Tensor::empty(p.shape(), memory::DType::kF32));
  });
}

void zero_grads(Module& root) {
  root.visit_params([](Parameter& p) {
    if (p.grad().raw() != nullptr) p.grad().zero();
  });
}

}  // namespace zs::nn
