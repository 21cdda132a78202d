// Registry entry (optim/registry.h) of zeroshard's `CAdam` type (optim/cadam.h).
#include "optim/cadam.h"
#include "optim/detail/typed_entry.h"

namespace zs::optim {
namespace {

class CAdamType final : public detail::TypedOptimizerType<CAdamConfig> {
 public:
  std::string_view name() const override { return "CAdam"; }
  bool sign_update() const override { return true; }

 protected:
  void read(ObjectReader& p, CAdamConfig& c) const override {
    p.read("lr", c.lr, RealRange::non_negative());
    p.read("betas", c.betas, RealRange::half_open(0.0, 1.0));
    p.read("weight_decay", c.weight_decay, RealRange::non_negative());
    p.unsupported("eps", "CAdam takes the sign of the momentum and has no eps");
  }
  void check(const CAdamConfig& c, const std::string& path) const override { optim::validate(c, path); }
  std::unique_ptr<Optimizer> create(const CAdamConfig& c) const override { return std::make_unique<CAdam>(c); }
};

}  // namespace

const OptimizerType& cadam_type() {
  static const CAdamType kType;
  return kType;
}

}  // namespace zs::optim
