// Context: how a module calls its children and gets memory. The engine implements it.
//
// Every module boundary goes through a Context, so whoever runs the model can act there: the engine
// gathers a ZeRO-3 module's parameters in before_forward and releases them in after_forward,
// marks gradient buckets ready in after_backward, and re-runs recomputed modules (Activation
// checkpointing in nn/module.h). Modules never call a child's forward/backward directly (they are
// not public).
//
//   Tensor h = ctx.forward(*ln1_, x);          // before_forward(ln1) ; ln1.forward ; after_forward(ln1)
//   Tensor dx = ctx.backward(*ln1_, dh);       // before_backward(ln1); ln1.backward; after_backward(ln1)
//   Tensor tmp = ctx.allocate({n, c}, DType::kF32, MemoryUse::kScratch);
//
// Memory. allocate() returns a Tensor that owns its bytes through a shared owner (memory::Tensor's
// owner): the bytes go back to whoever served them when the last copy of the Tensor is dropped. So
//   - kScratch tensors are locals of one layer method and are freed when it returns (RAII);
//   - kActivation tensors are forward outputs and the tensors a module saves in its members for its
//     backward; a module drops its saved tensors at the end of its backward (or in clear_saved());
//   - kGradient tensors are activation gradients flowing backward (a backward's return value).
// Contents are unspecified: layers write every element before reading it. All tensors are
// contiguous and 64-byte aligned.
//
// Lifecycle rule. A module instance runs at most once per forward/backward pair in training mode:
// forward, then backward, then forward again. Breaking it is the model's mistake and is reported
// where it happens, as a ModelError naming the module and what to do:
//   - a second forward before the backward (a module used twice: see "Shared weights" in nn/module.h);
//   - a backward with no forward before it (the forward was called directly, not through ctx.forward);
//   - a module whose backward returns without running the backward of a child whose forward ran
//     (the child's gradients would be lost silently);
//   - a layer reading a parameter of a module that is not the one running through the Context (a
//     forward/backward called directly, child.forward(ctx, x), or a parameter shared across modules;
//     nn/param_access.h).
// In evaluation mode (training() == false) modules save nothing and forward may be repeated.
//
// Thread-safety: a Context and the model it runs are used by one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "memory/tensor.h"

namespace zs::nn {

class Module;
class Context;
class Model;
struct Batch;

// Where the running micro-batch lies in the global batch stream: the optimizer step (in evaluation,
// the evaluation batch's index), the global index of this rank's first sample in that step (its
// position over every rank and micro-step: micro_step * micro_batch * ranks + rank * micro_batch) and
// this rank's sample count. A layer whose random draws must not depend on the world size or the
// accumulation setting keys them by it (moe::MoE's gate noise), the way nn/data.h picks samples.
struct BatchPosition {
  int64_t step = 0;
  int64_t first_sample = 0;
  int64_t samples = -1;  // this rank's samples in the micro-batch; -1: not set
};

// Note [deferred weight gradients]
// A zero-bubble pipeline schedule (pp/'s ZB-H1) splits a backward into the input gradient (B), which
// the previous stage waits for, and the weight gradient (W), run later to fill the pipeline's bubble.
// While a sink is installed (Context::set_weight_grad_sink), a layer that supports it (nn::Linear, the
// GPT's matmuls) computes only its input gradient in its backward and appends its weight gradient to
// the sink, keeping what it needs (its input and a copy of dy); Context::run_deferred computes them
// later as part of their owners (whose parameters they read and write). Every other layer computes
// all its gradients in its backward, as without a sink: the split moves work, the sums are the same.
// The copy of dy is there because a caller may write into a gradient after passing it to a child's
// backward (a residual sum in place, say). A model whose every module leaves such gradients as they
// are (pp::GptStage: nn::Block and its parts only read them) says so when it installs the sink
// (`grads_intact`), and the layers then keep dy itself: in the pipeline GPT's B pass the copies were
// up to about 5% of B's CPU time (docs/benchmarks.md, "Pipeline bubble, memory and step time"), work
// the W pass cannot fill, and their memory.
// No hooks run around a deferred gradient (an engine that marks gradients ready in after_backward
// must wait for the W pass: not integrated yet).
struct DeferredGrad {
  const Module* owner;
  std::function<void(Context&)> compute;
};

enum class MemoryUse : uint8_t {
  kActivation,  // forward outputs and tensors saved for backward: live until the backward consumes them
  kGradient,    // activation gradients returned by backward: live until the previous module consumed them
  kScratch,     // temporaries inside one forward/backward call: freed before it returns
};

class Context {
 public:
  Context() = default;
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  virtual ~Context() = default;

  // Runs child.forward with the hooks around it. Checks the lifecycle rule above.
  memory::Tensor forward(Module& child, const memory::Tensor& input);
  // Runs child.backward with the hooks around it; returns dL/dinput (undefined for integer input).
  memory::Tensor backward(Module& child, const memory::Tensor& grad_output);

  // A child that does not run in this pass (progressive layer drop, nn/layer_drop.h: a skipped block
  // passes its input through): the hooks of the child and of its subtree run in the order its forward
  // (declaration order) or its backward (the reverse) would call them, and nothing else - no forward,
  // nothing saved. So an engine that gathers parameters along the module order it recorded (ZeRO-3) or
  // counts gradients per module sees the same modules every step. For modules that run their children
  // in declaration order (every built-in block).
  void skip_forward(Module& child);
  void skip_backward(Module& child);

  // Entry points for a whole model (the root module gets the same hooks as any child):
  // mean loss of the micro-batch, and backpropagation of grad_scale * d(mean loss).
  float forward_loss(Model& model, const Batch& batch);
  void backward_loss(Model& model, float grad_scale);

  // Activation recomputation so far: recomputed modules re-run, and the seconds their re-runs took
  // (the kept input's restore included). Counts, and a sum of seconds.
  struct RecomputeStats {
    int64_t modules = 0;
    double seconds = 0.0;
  };
  const RecomputeStats& recompute_stats() const { return recompute_; }
  // True while a recomputed module's forward re-runs inside its backward.
  bool recomputing() const { return recompute_depth_ > 0; }

  // The module whose forward/backward is running through this Context (the innermost one), or
  // nullptr between calls. Layers check it before touching a parameter (nn/param_access.h).
  const Module* running() const { return running_; }

  // The running micro-batch's position (see BatchPosition). The engine sets it before each forward
  // (training and evaluation); whoever drives a Context directly sets it before a forward whose
  // layers draw random numbers. Unchanged by backward, so a recomputed forward sees the same one.
  const BatchPosition& batch_position() const { return position_; }
  void set_batch_position(const BatchPosition& p) { position_ = p; }

  // Note [deferred weight gradients]: while `sink` is set, layers that can defer their weight gradient
  // append it there instead of computing it in backward; nullptr (the default) computes everything.
  // `grads_intact`: the running model never writes into a gradient it has passed to a child's
  // backward, so a deferred gradient may keep dy without copying it.
  void set_weight_grad_sink(std::vector<DeferredGrad>* sink, bool grads_intact = false) {
    weight_grad_sink_ = sink;
    grads_intact_ = sink != nullptr && grads_intact;
  }
  std::vector<DeferredGrad>* weight_grad_sink() const { return weight_grad_sink_; }
  bool weight_grad_sink_grads_intact() const { return grads_intact_; }
  // Computes the deferred gradients in order, each as part of its owner, and clears the list.
  void run_deferred(std::vector<DeferredGrad>& grads);

  // A tensor for `use` (see above). May throw OutOfMemoryError.
  virtual memory::Tensor allocate(memory::Shape shape, memory::DType dtype, MemoryUse use) = 0;
  // Training mode: modules save activations for backward. Evaluation: they do not.
  virtual bool training() const = 0;
  // False when the run only measures memory (the estimator): tensors are allocated as in training,
  // their contents are never computed, and nn's layer kernels skip their arithmetic by themselves
  // (Note [measuring run] in nn/detail/parallel.h). A module that loops over tensor data itself may
  // skip the loop when this is false; its results are not used.
  virtual bool computes() const { return true; }

 protected:
  // Hooks around every module call (default: nothing). Called on the thread running the model.
  // An exception thrown by a hook propagates out of forward()/backward().
  virtual void before_forward(Module& m) {}
  virtual void after_forward(Module& m) {}
  virtual void before_backward(Module& m) {}
  virtual void after_backward(Module& m) {}
  // Activation recomputation: where a recomputed module's input waits from its forward to its
  // backward. keep() gets the input when the module's forward returns; restore() gets what keep()
  // returned and gives back a tensor of the same shape and values that the re-run reads. Default: the
  // input tensor itself. The engine keeps it on the host tier (cpu_checkpointing) or in one
  // preallocated buffer (contiguous_memory_optimization).
  virtual memory::Tensor keep_recompute_input(const memory::Tensor& input) { return input; }
  virtual memory::Tensor restore_recompute_input(memory::Tensor kept) { return kept; }

 private:
  void recompute(Module& child);

  const Module* running_ = nullptr;
  std::vector<DeferredGrad>* weight_grad_sink_ = nullptr;
  bool grads_intact_ = false;
  BatchPosition position_;
  int recompute_depth_ = 0;
  RecomputeStats recompute_;
};

}  // namespace zs::nn
