// Registry entries (optim/registry.h) of DeepSpeed's `OneBitAdam` and `ZeroOneAdam` types: compressed
// optimizers, whose steps the engine drives itself (engine/compressed_step.cpp) with the kernels of
// optim/onebit_adam.h, so they make no optim::Optimizer.
#include "core/log.h"
#include "optim/detail/typed_entry.h"
#include "optim/onebit_adam.h"

namespace zs::optim {
namespace {

// Keys DeepSpeed's one-bit optimizers take that concern its CUDA/NCCL plumbing: zeroshard's compressed
// allreduce always runs on MPI (comm/compressed_allreduce.h), so the backend name is accepted and logged.
void read_one_bit_plumbing(ObjectReader& p, std::string_view type) {
  std::string backend;
  if (p.read_choice("comm_backend_name", backend, {"nccl", "mpi", "hccl", "compressed"}) && backend != "mpi") {
    ZS_LOG_INFO("{}: comm_backend_name '{}': zeroshard's compressed allreduce runs on MPI", type, backend);
  }
  // cuda_aware says whether MPI may be handed device buffers without a copy to the host first: only
  // the speed of DeepSpeed's exchange depends on it. zeroshard's CPU backend hands MPI its device
  // buffers (host memory) directly either way.
  p.ignore("cuda_aware");
  bool bias_correction = false;
  if (p.read("bias_correction", bias_correction) && bias_correction) {
    ZS_LOG_INFO("{}: bias_correction has no effect (DeepSpeed's {} does not use it either)", type, type);
  }
  p.unsupported_if_true("amsgrad", "one-bit optimizers do not support AMSGrad");
  p.unsupported("eps_inside_sqrt", "zeroshard adds eps outside the square root");
  p.unsupported("max_grad_norm", "use the top-level gradient_clipping instead (DeepSpeed refuses it as an optimizer param too)");
}

template <class Config>
void read_common(ObjectReader& p, Config& c) {
  p.read("lr", c.lr, RealRange::non_negative());
  p.read("betas", c.betas, RealRange::half_open(0.0, 1.0));
  p.read("eps", c.eps, RealRange::positive());
  p.read("weight_decay", c.weight_decay, RealRange::non_negative());
  // zeroshard's key (DeepSpeed has one scale per tensor and no option): "tensor" is DeepSpeed's.
  p.read_enum("compression_scale", c.compression_scale,
              {{"block", CompressionScale::kBlock}, {"tensor", CompressionScale::kTensor}});
}

class OneBitAdamType final : public detail::TypedOptimizerType<OneBitAdamConfig> {
 public:
  std::string_view name() const override { return "OneBitAdam"; }
  // Adam's moments (momentum and variance), so it resumes from Adam's states and they from its.
  std::string_view state_family() const override { return detail::kAdamStateFamily; }
  // Whole momentum, variance per stepped element, worker error: 3 x fp32.
  std::optional<CompressedTraits> compressed() const override { return CompressedTraits{.state_bytes_per_param = 12.0}; }

 protected:
  void read(ObjectReader& p, OneBitAdamConfig& c) const override {
    read_common(p, c);
    p.read("freeze_step", c.freeze_step, IntRange::non_negative());
    read_one_bit_plumbing(p, name());
  }
  void check(const OneBitAdamConfig& c, const std::string& path) const override { optim::validate(c, path); }
  std::unique_ptr<Optimizer> create(const OneBitAdamConfig&) const override { return nullptr; }
};

class ZeroOneAdamType final : public detail::TypedOptimizerType<ZeroOneAdamConfig> {
 public:
  std::string_view name() const override { return "ZeroOneAdam"; }
  // Adam's moments (momentum and variance), so it resumes from Adam's states and they from its.
  std::string_view state_family() const override { return detail::kAdamStateFamily; }
  // One-bit Adam's three plus the accumulator of its local steps.
  std::optional<CompressedTraits> compressed() const override {
    return CompressedTraits{.state_bytes_per_param = 16.0, .local_steps = true};
  }

 protected:
  void read(ObjectReader& p, ZeroOneAdamConfig& c) const override {
    read_common(p, c);
    p.read("var_freeze_step", c.var_freeze_step, IntRange::non_negative());
    p.read("var_update_scaler", c.var_update_scaler, IntRange::positive());
    p.read("local_step_scaler", c.local_step_scaler, IntRange::positive());
    p.read("local_step_clipper", c.local_step_clipper, IntRange::positive());
    read_one_bit_plumbing(p, name());
  }
  void check(const ZeroOneAdamConfig& c, const std::string& path) const override { optim::validate(c, path); }
  std::unique_ptr<Optimizer> create(const ZeroOneAdamConfig&) const override { return nullptr; }
};

}  // namespace

const OptimizerType& one_bit_adam_type() {
  static const OneBitAdamType kType;
  return kType;
}

const OptimizerType& zero_one_adam_type() {
  static const ZeroOneAdamType kType;
  return kType;
}

}  // namespace zs::optim
