// The list of optimizer types (Note [adding an optimizer]) and the config's `optimizer` section.
//
// Note [adding an optimizer]: an elementwise optimizer lives in its own files (config struct,
// validate(), an Optimizer subclass, its kernels) and ends with an entry: a
// detail::TypedOptimizerType<Config> saying how its params are read and checked and how to make it,
// reached through a function `const OptimizerType& <name>_type()`. Declare that function below and
// add it to kTypes: nothing else changes (config parsing, the engine's optimizer, the memory
// estimator, summaries and the optimizer_compare benchmark all go through this list).
#include "optim/registry.h"

#include <algorithm>
#include <cctype>

namespace zs::optim {

const OptimizerType& adam_type();
const OptimizerType& adamw_type();
const OptimizerType& one_bit_adam_type();
const OptimizerType& zero_one_adam_type();
const OptimizerType& cadam_type();
const OptimizerType& lion_type();
const OptimizerType& lamb_type();

namespace {

const std::vector<const OptimizerType*>& types() {
  static const std::vector<const OptimizerType*> kTypes = {
      &adam_type(), &adamw_type(), &one_bit_adam_type(), &zero_one_adam_type(), &cadam_type(), &lion_type(), &lamb_type(),
  };
  return kTypes;
}

// DeepSpeed optimizer types zeroshard does not implement yet (lower case): refused by name.
constexpr std::string_view kNotYet[] = {"onebitlamb", "adagrad", "sgd", "muadam", "muadamw", "musgd"};
// What to use instead, where one of ours comes close.
std::string_view not_yet_hint(std::string_view lowered) {
  if (lowered == "onebitlamb") {
    return " (use Lamb for its per-tensor trust ratio without compression, or OneBitAdam for compressed "
           "communication)";
  }
  return "";
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

}  // namespace

std::span<const OptimizerType* const> optimizer_types() { return types(); }

const OptimizerType* find_optimizer_type(std::string_view name) {
  const std::string wanted = lower(name);
  for (const OptimizerType* t : types()) {
    if (lower(t->name()) == wanted) return t;
  }
  return nullptr;
}

bool OptimizerType::can_resume_from(std::string_view saved_type) const {
  const OptimizerType* saved = find_optimizer_type(saved_type);
  return saved != nullptr && saved->state_family() == state_family();
}

std::string optimizer_type_list(bool elementwise_only) {
  std::vector<std::string_view> names;
  for (const OptimizerType* t : types()) {
    if (!elementwise_only || !t->compressed()) names.push_back(t->name());
  }
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) s += i + 1 == names.size() ? " or " : ", ";
    s += names[i];
  }
  return s;
}

OptimizerChoice::OptimizerChoice() : OptimizerChoice("AdamW") {}

OptimizerChoice::OptimizerChoice(std::string_view name) : type_(find_optimizer_type(name)) {
  if (type_ == nullptr) {
    throw ConfigError(fmt::format("unknown optimizer '{}'; use {}", name, optimizer_type_list()));
  }
  params_ = type_->default_params();
}

std::vector<StateSpec> OptimizerChoice::state_specs() const {
  std::unique_ptr<Optimizer> o = make();
  if (!o) return {};
  auto specs = o->state_specs();
  return {specs.begin(), specs.end()};
}

double OptimizerChoice::state_bytes_per_param() const {
  if (auto traits = compressed_traits()) return traits->state_bytes_per_param;
  double k = 0;
  for (const StateSpec& spec : state_specs()) {
    k += static_cast<double>(spec.value_bytes) / static_cast<double>(spec.elements_per_value);
  }
  return k;
}

OptimizerChoice read_optimizer(ObjectReader& r) {
  std::string name;
  r.require("type", name);
  const OptimizerType* type = find_optimizer_type(name);
  if (type == nullptr) {
    const std::string lowered = lower(name);
    const bool not_yet = std::find(std::begin(kNotYet), std::end(kNotYet), lowered) != std::end(kNotYet);
    throw ConfigError(fmt::format("{}: {} '{}'{}{}; use {}", r.path_of("type"), not_yet ? "optimizer" : "unknown optimizer", name,
                                  not_yet ? " is not implemented by zeroshard yet" : "", not_yet_hint(lowered),
                                  optimizer_type_list()));
  }
  OptimizerChoice choice(type->name());
  std::any params = type->default_params();
  r.read_object("params", [&](ObjectReader& p) { type->read_params(p, params); });
  type->validate(params, json_path_join(r.path(), "params"));
  choice.set_erased_params(std::move(params));
  return choice;
}

}  // namespace zs::optim
