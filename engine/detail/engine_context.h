// EngineContext: the engine's nn::Context. Serves activation memory from the device arena's transient
// pool (so activations count against `device.memory_mb` and show in the memory report) and forwards
// every module boundary to the engine (ZeRO-3 gather/release, gradient bucket readiness).
#pragma once

#include <memory>

#include "engine/detail/recompute_store.h"
#include "memory/alloc_trace.h"
#include "memory/allocator.h"
#include "memory/backend.h"
#include "memory/tracker.h"
#include "nn/context.h"

namespace zs::engine {

// Note [engine memory lifetime]
// The model outlives the engine in the usual program (it is declared first), and a model keeps
// Tensors whose bytes the engine served: the activations it saved for backward (shared owners of
// arena blocks), and its parameters' data/grad views into the flat buffers. When the engine went
// first - an exception between forward and backward, a program ending after a forward - the blocks
// were returned later to a dead allocator: use after free, double free, a segfault that hid the
// user's own error. Two rules now make any order safe:
//   1. ~Engine drops what the model holds into the engine: Module::clear_saved() on the root and
//      every parameter's data and grad views. The blocks return to a live arena, and the model is left
//      as before the engine (it can be given to a new one).
//   2. A Tensor served by EngineContext::allocate shares ownership of the whole arena (backend,
//      segment, allocator, tracker: DeviceArena). A copy the user kept past the engine keeps its bytes
//      valid and returns its block to a live allocator; the arena goes when its last block does.
// Rule 2 alone would leave the model's parameter views dangling and the arena alive as long as the
// model; rule 1 alone would not cover a Tensor copied out of the model. Persistent model-state blocks
// stay owned by the engine alone: nothing outside it owns them (parameter views do not).

// The engine's device memory: the backend, its kDevice segment carved by the allocator, and the
// tracker the allocator reports to. Shared by the engine and every activation Tensor it served
// (Note [engine memory lifetime]). Members are destroyed in reverse: allocator, backend, tracker.
struct DeviceArena {
  explicit DeviceArena(std::unique_ptr<memory::Backend> b)
      : backend(std::move(b)), allocator(*backend, backend->capacity(memory::Tier::kDevice), &tracker) {}
  // Starts recording every allocation and free (device.alloc_trace); the recorder outlives the allocator.
  void record_trace() {
    trace = std::make_unique<memory::AllocTraceRecorder>(allocator.capacity());
    allocator.set_trace_recorder(trace.get());
  }
  memory::MemoryTracker tracker;
  std::unique_ptr<memory::Backend> backend;
  std::unique_ptr<memory::AllocTraceRecorder> trace;  // null unless record_trace()
  memory::DeviceAllocator allocator;
};

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
  EngineContext(std::shared_ptr<DeviceArena> arena, ModuleHooks& hooks)
      : arena_(std::move(arena)), device_(arena_->allocator), hooks_(hooks) {}

  memory::Tensor allocate(memory::Shape shape, memory::DType dtype, nn::MemoryUse use) override;
  // False while Engine::eval_batch runs: modules save nothing for a backward.
  bool training() const override { return training_; }
  void set_training(bool training) { training_ = training; }
  // Tensors share ownership of the arena (Note [engine memory lifetime]).
  // Over the measuring backend the model's arithmetic is skipped (the estimator).
  bool computes() const override { return device_.backend().runs_kernels(); }
  // Where checkpointed modules' inputs wait (engine/detail/recompute_store.h); none: in place.
  void set_checkpoint_store(std::unique_ptr<RecomputeInputStore> store) { checkpoints_ = std::move(store); }
  size_t checkpoint_buffer_bytes() const { return checkpoints_ ? checkpoints_->buffer_bytes() : 0; }

 protected:
  void before_forward(nn::Module& m) override { hooks_.before_forward(m); }
  void after_forward(nn::Module& m) override { hooks_.after_forward(m); }
  void before_backward(nn::Module& m) override { hooks_.before_backward(m); }
  void after_backward(nn::Module& m) override { hooks_.after_backward(m); }
  memory::Tensor keep_recompute_input(const memory::Tensor& input) override;  // recompute.cpp
  memory::Tensor restore_recompute_input(memory::Tensor kept) override;

 private:
  std::shared_ptr<DeviceArena> arena_;
  memory::DeviceAllocator& device_;
  ModuleHooks& hooks_;
  bool training_ = true;
  std::unique_ptr<RecomputeInputStore> checkpoints_;
};

}  // namespace zs::engine
