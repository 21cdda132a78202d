// The optimizer registry: every optimizer type a config may name, with what the rest of zeroshard
// needs to know of it, so that no code outside optim/ compares optimizer names.
//
// Each entry (an OptimizerType, one static object per type, defined beside its optimizer) declares
//   - its name (DeepSpeed's spelling; configs match it case-insensitively, "adamw" = "AdamW"),
//   - its `optimizer.params`: defaults, strict parsing (unknown keys rejected with a did-you-mean,
//     ranges checked, JSON paths in errors) and validation,
//   - its states (StateSpec: names, dtypes and bytes per element), hence its bytes per parameter,
//   - whether it drives its own compressed communication (CompressedTraits: the engine then runs
//     it itself, engine/compressed_step.cpp),
//   - a factory for the elementwise optimizer::Optimizer (nullptr for the compressed ones).
// The list of entries is explicit, in registry.cpp (no self-registration: a static library drops
// unreferenced objects). Adding an optimizer = its own files + one line there (docs/design.md).
//
//   OptimizerChoice opt = read_optimizer(reader);   // reader: the config's "optimizer" object
//   std::unique_ptr<Optimizer> o = opt.make();      // nullptr when opt.compressed()
//   OptimizerChoice lion("Lion", LionConfig{.lr = 1e-4, .weight_decay = 0.1});
//   lion.params<LionConfig>().lr = 3e-5;
//
// Thread-safety: entries are immutable; OptimizerChoice is a value (copy it per thread).
#pragma once

#include <any>
#include <array>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/errors.h"
#include "core/json.h"
#include "optim/optimizer.h"

namespace zs::optim {

// The hyper-parameters every registered optimizer has, for code that treats optimizers alike
// (schedules take lr as their base; benchmarks derive one optimizer's settings from another's).
struct HyperParams {
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};
  double weight_decay = 0.0;
};

// An optimizer whose update the engine drives itself because it averages its own compressed
// momentum or gradients (Note [compressed optimizers] in engine/compressed_step.cpp).
struct CompressedTraits {
  // Optimizer-state bytes per stepped element as the reports state them (momentum, variance and
  // error feedback, each fp32; the momentum and the worker error are whole, see docs/memory.md).
  double state_bytes_per_param = 12.0;
  // Takes local steps between synchronisations at stage 0 (0/1 Adam): a whole fp32 accumulator, and
  // compressed-gradient steps that copy the whole gradient in fp32.
  bool local_steps = false;
};

// What the registry knows of one optimizer type. The params are type-erased (std::any holding the
// type's own config struct, e.g. AdamConfig); detail/typed_entry.h implements the casts once.
class OptimizerType {
 public:
  virtual ~OptimizerType() = default;
  // Canonical spelling, DeepSpeed's ("AdamW", "OneBitAdam", "Lion").
  virtual std::string_view name() const = 0;
  // The params a config without `optimizer.params` (or without a key) gets.
  virtual std::any default_params() const = 0;
  // Reads the keys of `optimizer.params` into `params` (which holds default_params()). The caller
  // finishes the reader (unknown keys) and then calls validate().
  virtual void read_params(ObjectReader& reader, std::any& params) const = 0;
  // Throws ConfigError naming `json_path` + the key (e.g. "optimizer.params.betas[1]").
  virtual void validate(const std::any& params, const std::string& json_path) const = 0;
  virtual HyperParams hyper(const std::any& params) const = 0;
  virtual void set_hyper(std::any& params, const HyperParams& hyper) const = 0;
  // Lion's family: every element moves by lr per step (sign update), so its lr is 3-10x smaller and
  // its weight_decay 3-10x larger than AdamW's for the same model (optim/cadam.h, optim/lion.h).
  virtual bool sign_update() const { return false; }
  // Set for the optimizers the engine drives itself; make() then returns nullptr.
  virtual std::optional<CompressedTraits> compressed() const { return std::nullopt; }
  // The family of the states a checkpoint of this type holds: a run resumes from a checkpoint of any
  // type of its own family (Adam, AdamW, OneBitAdam and ZeroOneAdam all keep Adam's exp_avg and
  // exp_avg_sq, so each continues from the others). By default a type is a family of its own.
  virtual std::string_view state_family() const { return name(); }
  // Whether a run with this type can resume from the optimizer states of a checkpoint saved by the
  // type named `saved_type` (its name as the checkpoint records it; unregistered: false).
  bool can_resume_from(std::string_view saved_type) const;
  // The elementwise optimizer for these params (widest kernel of this CPU); nullptr if compressed().
  virtual std::unique_ptr<Optimizer> make(const std::any& params) const = 0;
};

// Every registered type, in registry.cpp's order.
std::span<const OptimizerType* const> optimizer_types();
// The type named `name` (any case: DeepSpeed's "adam", "AdamW", "lion"), or nullptr.
const OptimizerType* find_optimizer_type(std::string_view name);
// "Adam, AdamW, ... or Lion": the registered names, for messages; `elementwise_only` leaves out
// the compressed ones.
std::string optimizer_type_list(bool elementwise_only = false);

// An optimizer type with its params: what a config's `optimizer {type, params}` says. A value.
class OptimizerChoice {
 public:
  // AdamW with its defaults (DeepSpeed's default when a config has no optimizer section).
  OptimizerChoice();
  // The type named `name` (any case) with its defaults; ConfigError if no such type is registered.
  explicit OptimizerChoice(std::string_view name);
  // The type named `name` with `params`, which must be that type's params struct (ZS_ASSERT).
  template <class Params>
  OptimizerChoice(std::string_view name, Params params) : OptimizerChoice(name) {
    ZS_ASSERT(std::any_cast<Params>(&params_) != nullptr, "{} params given as another optimizer's struct", type_->name());
    params_ = std::move(params);
  }

  const OptimizerType& type() const { return *type_; }
  std::string_view name() const { return type_->name(); }
  const std::any& erased_params() const { return params_; }
  // Replaces the params by `params`, which must hold this type's struct (ZS_ASSERT).
  void set_erased_params(std::any params) {
    ZS_ASSERT(params.type() == params_.type(), "{} params replaced by another optimizer's struct", type_->name());
    params_ = std::move(params);
  }
  // The params as the type's own struct; ZS_ASSERT that `Params` is it.
  template <class Params>
  const Params& params() const { return *checked<Params>(); }
  template <class Params>
  Params& params() { return *const_cast<Params*>(checked<Params>()); }
  // nullptr when the params are not a `Params` (another type's struct).
  template <class Params>
  const Params* params_if() const { return std::any_cast<Params>(&params_); }

  // The configured (base) learning rate: the scheduler's base.
  double lr() const { return type_->hyper(params_).lr; }
  HyperParams hyper() const { return type_->hyper(params_); }
  void set_hyper(const HyperParams& h) { type_->set_hyper(params_, h); }
  // The optimizer averages its own (compressed) momentum or gradients: the engine hands it each
  // rank's local gradients on the steps it asks for, and make() is nullptr.
  bool compressed() const { return type_->compressed().has_value(); }
  std::optional<CompressedTraits> compressed_traits() const { return type_->compressed(); }
  std::unique_ptr<Optimizer> make() const { return type_->make(params_); }
  // OptimizerType::can_resume_from: whether this optimizer continues from `saved_type`'s states.
  bool can_resume_from(std::string_view saved_type) const { return type_->can_resume_from(saved_type); }
  // The elementwise optimizer's states (empty for compressed ones) and its bytes per parameter
  // element (CompressedTraits::state_bytes_per_param for compressed ones).
  std::vector<StateSpec> state_specs() const;
  double state_bytes_per_param() const;

 private:
  template <class Params>
  const Params* checked() const {
    const Params* p = std::any_cast<Params>(&params_);
    ZS_ASSERT(p != nullptr, "{} params read as another optimizer's struct", type_->name());
    return p;
  }
  const OptimizerType* type_;
  std::any params_;
};

// Reads a config's `optimizer` object (`reader`): "type" (required; unknown or not-yet-implemented
// types are ConfigErrors naming `<path>.type` and the registered types) and "params" (strict,
// validated). The caller finishes `reader`.
OptimizerChoice read_optimizer(ObjectReader& reader);

}  // namespace zs::optim
