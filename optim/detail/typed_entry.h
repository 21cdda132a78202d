// TypedOptimizerType<Params>: an OptimizerType (optim/registry.h) over the type's own params struct,
// so an entry implements typed hooks and the std::any casts live here once (internal).
//
//   class LionType final : public detail::TypedOptimizerType<LionConfig> {
//     std::string_view name() const override { return "Lion"; }
//     void read(ObjectReader& p, LionConfig& c) const override { p.read("lr", c.lr, RealRange::non_negative()); ... }
//     void check(const LionConfig& c, const std::string& path) const override { optim::validate(c, path); }
//     std::unique_ptr<Optimizer> create(const LionConfig& c) const override { return std::make_unique<Lion>(c); }
//   };
//
// Params must have `lr`, `betas` (two doubles) and `weight_decay` members (HyperParams).
#pragma once

#include <any>
#include <memory>
#include <string>
#include <utility>

#include "core/errors.h"
#include "optim/registry.h"

namespace zs::optim::detail {

// OptimizerType::state_family of the types that keep Adam's two moments (exp_avg, exp_avg_sq).
inline constexpr std::string_view kAdamStateFamily = "adam";

template <class Params>
class TypedOptimizerType : public OptimizerType {
 public:
  std::any default_params() const override { return defaults(); }
  void read_params(ObjectReader& reader, std::any& params) const override { read(reader, cast(params)); }
  void validate(const std::any& params, const std::string& json_path) const override { check(cast(params), json_path); }
  HyperParams hyper(const std::any& params) const override {
    const Params& p = cast(params);
    return {.lr = p.lr, .betas = p.betas, .weight_decay = p.weight_decay};
  }
  void set_hyper(std::any& params, const HyperParams& h) const override {
    Params& p = cast(params);
    p.lr = h.lr;
    p.betas = h.betas;
    p.weight_decay = h.weight_decay;
  }
  std::unique_ptr<Optimizer> make(const std::any& params) const override { return create(cast(params)); }

 protected:
  virtual Params defaults() const { return Params{}; }
  virtual void read(ObjectReader& reader, Params& params) const = 0;
  virtual void check(const Params& params, const std::string& json_path) const = 0;
  // nullptr for the compressed optimizers (the engine drives them).
  virtual std::unique_ptr<Optimizer> create(const Params& params) const = 0;

 private:
  Params& cast(std::any& a) const { return *const_cast<Params*>(&cast(std::as_const(a))); }
  const Params& cast(const std::any& a) const {
    const Params* p = std::any_cast<Params>(&a);
    ZS_ASSERT(p != nullptr, "{}: params of another optimizer type", name());
    return *p;
  }
};

}  // namespace zs::optim::detail
