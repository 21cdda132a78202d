// EngineContext: the engine's nn::Context. Serves activation memory from the device arena's transient
// pool (so activations count against `device.memory_mb` and show in the memory report) and forwards
// every module boundary to the engine (ZeRO-3 gather/release, gradient bucket readiness).
#pragma once

#include "memory/allocator.h"
#include "nn/context.h"

namespace zs::engine {

// What the engine does at module boundaries.
class ModuleHooks {
 public:
  virtual ~ModuleHooks() = default;
  virtual void before_forward(nn::Module& m) = 0;
  virtual void after_forward(nn::Module& m) = 0;
  virtual void before_backward(nn::Module& m) = 0;
  virtual void after_backward(nn::Module& m) = 0;
};

class EngineContext final : public nn::Context {
 public:
  EngineContext(memory::DeviceAllocator& device, ModuleHooks& hooks) : device_(device), hooks_(hooks) {}

  memory::Tensor allocate(memory::Shape shape, memory::DType dtype, nn::MemoryUse use) override;
  bool training() const override { return true; }
  // Over the measuring backend the model's arithmetic is skipped (the estimator).
  bool computes() const override { return device_.backend().runs_kernels(); }

 protected:
  void before_forward(nn::Module& m) override { hooks_.before_forward(m); }
  void after_forward(nn::Module& m) override { hooks_.after_forward(m); }
  void before_backward(nn::Module& m) override { hooks_.before_backward(m); }
  void after_backward(nn::Module& m) override { hooks_.after_backward(m); }

 private:
  memory::DeviceAllocator& device_;
  ModuleHooks& hooks_;
};

}  // namespace zs::engine
