// Registry entries (optim/registry.h) of DeepSpeed's `Adam` and `AdamW` types: both optim::Adam.
#include "optim/adam.h"
#include "optim/detail/typed_entry.h"

namespace zs::optim {
namespace {

class AdamType final : public detail::TypedOptimizerType<AdamConfig> {
 public:
  explicit AdamType(bool adamw) : adamw_(adamw) {}
  std::string_view name() const override { return adamw_ ? "AdamW" : "Adam"; }
  std::string_view state_family() const override { return detail::kAdamStateFamily; }

 protected:
  // DeepSpeed's Adam type defaults to decoupled weight decay (adam_w_mode true); AdamW forces it.
  AdamConfig defaults() const override { return AdamConfig{.adam_w_mode = true}; }
  void read(ObjectReader& p, AdamConfig& a) const override {
    p.read("lr", a.lr, RealRange::non_negative());
    p.read("betas", a.betas, RealRange::half_open(0.0, 1.0));
    p.read("eps", a.eps, RealRange::positive());
    p.read("weight_decay", a.weight_decay, RealRange::non_negative());
    p.read("bias_correction", a.bias_correction);
    if (!adamw_) {
      p.read("adam_w_mode", a.adam_w_mode);
    } else {
      p.unsupported("adam_w_mode", "AdamW always decouples weight decay (use type Adam to choose)");
    }
    // torch_adam picks DeepSpeed's implementation (torch's or its fused one), set_grad_none how its
    // zero_grad clears gradients: the update is the same either way, and zeroshard has one of each.
    p.ignore("torch_adam");
    p.ignore("set_grad_none");
    p.unsupported_if_true("amsgrad", "zeroshard does not implement AMSGrad yet");
    // DeepSpeed refuses it here too ("'max_grad_norm' is not supported as an optimizer parameter").
    p.unsupported("max_grad_norm", "use the top-level gradient_clipping instead (DeepSpeed refuses it as an optimizer param too)");
  }
  void check(const AdamConfig& a, const std::string& path) const override { optim::validate(a, path); }
  std::unique_ptr<Optimizer> create(const AdamConfig& a) const override { return std::make_unique<Adam>(a); }

 private:
  bool adamw_;
};

}  // namespace

const OptimizerType& adam_type() {
  static const AdamType kType(false);
  return kType;
}

const OptimizerType& adamw_type() {
  static const AdamType kType(true);
  return kType;
}

}  // namespace zs::optim
