// Module: a node of the model tree with named parameters and named children.
//
// A module declares its parameters and children in its constructor, in the order they are used,
// and implements forward/backward on row-major activations. Children run only through the Context
// (ctx.forward(child, x) / ctx.backward(child, dy)) so the engine can hook every boundary.
//
//   class Mlp : public Module {
//    public:
//     Mlp(int64_t d) : fc_(add_child<Linear>("fc", d, 4 * d)), proj_(add_child<Linear>("proj", 4 * d, d)) {}
//     std::string_view type_name() const override { return "Mlp"; }
//    protected:
//     Tensor forward(Context& ctx, const Tensor& x) override { return ctx.forward(proj_, ctx.forward(fc_, x)); }
//     Tensor backward(Context& ctx, const Tensor& dy) override { return ctx.backward(fc_, ctx.backward(proj_, dy)); }
//    private:
//     Linear& fc_; Linear& proj_;
//   };
//
// Saved state. forward saves what backward needs in the module's own members (shared Tensors from
// ctx.allocate or the input itself); backward uses them and drops them. Each instance runs once per
// forward/backward pair (nn/context.h, "Lifecycle rule"). clear_saved() drops saved state without a
// backward (activation recomputation drops a recomputed module's state after its forward).
//
// Activation recomputation (DeepSpeed's "activation checkpointing"; "checkpoint" in zeroshard's names
// means saved training state only). set_recomputed(true) on any module (a block of the user's own
// model, a GPT block): in a training forward the module keeps only its input, its subtree's saved tensors are
// dropped when its forward returns, and its backward first re-runs its forward from that input
// (Note [activation recomputation] in nn/context.cpp). The module needs nothing for it: the Context
// does it at the module's boundary, with the same hooks (a ZeRO-3 engine gathers the parameters again
// for the re-run). The re-run must compute what the first run did: a module that draws random numbers
// keys them by something a re-run does not change (nn's counter-based RNG keyed by pass, as MoE's
// gate noise is), never by a counter its forward advances.
//
//   for (Module* b : blocks.children()) b->set_recomputed(true);
//
// Names. assign_names(root) gives every module its path ("blocks.3.attn", root "") and every
// parameter its full name ("blocks.3.attn.qkv.weight"). The canonical parameter order (visit_params)
// is depth-first: a module's own parameters in declaration order, then its children in declaration
// order. Checkpoints and the engine's flat buffers use this order. A parameter belongs to exactly
// one module (no sharing; a tied embedding lives in the one module that uses it twice).
//
// Shared weights. An instance runs once per forward/backward pair, and a layer reads a parameter only
// while the module that declares it runs (nn/param_access.h): two modules cannot share a Parameter,
// and one module cannot run twice in a pass (both are ModelErrors that point here). A weight used
// twice is owned by one module that uses it twice inside its own forward and backward, adding both
// uses' gradients into one GradAccumulator. At ZeRO-3 the owner's parameters stay gathered from the
// start to the end of its forward (and of its backward), so every use sees them; nn::GptModel's tied
// embedding is written this way (wte is the input lookup and the output head). One square weight
// applied twice, y = (x W^T) W^T (tests/docs/usage_snippets_test.cpp compiles and trains it):
//
//   class TwiceLinear : public Module {
//    public:
//     explicit TwiceLinear(int64_t d) : w_(declare_param("weight", {d, d}, Init::normal(0.0f, 0.3f))) {}
//     std::string_view type_name() const override { return "TwiceLinear"; }
//    protected:
//     Tensor forward(Context& ctx, const Tensor& x) override {    // x (n, d) -> (n, d)
//       Tensor h = apply(ctx, x), y = apply(ctx, h);              // first use, second use
//       if (ctx.training()) { x_ = x; h_ = h; }
//       return y;
//     }
//     Tensor backward(Context& ctx, const Tensor& dy) override {
//       GradAccumulator g(ctx, w_);                                // both uses add into one gradient
//       Tensor dx = back(ctx, back(ctx, dy, h_, g), x_, g);
//       x_ = h_ = {};
//       return dx;
//     }
//     void clear_own_saved() override { x_ = h_ = {}; }
//    private:
//     Tensor apply(Context& ctx, const Tensor& in);                                  // in W^T
//     Tensor back(Context& ctx, const Tensor& dout, const Tensor& in, GradAccumulator& g);  // g += dout^T in; dout W
//     Parameter& w_;
//     Tensor x_, h_;
//   };
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memory/tensor.h"
#include "nn/context.h"
#include "nn/parameter.h"

namespace zs::nn {

class Module {
 public:
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  virtual ~Module();

  // "Linear", "LayerNorm", ...: for traces and error messages.
  virtual std::string_view type_name() const = 0;

  const std::string& local_name() const { return local_name_; }  // "attn" ("" for the root)
  const std::string& name() const { return name_; }              // "blocks.3.attn" ("" for the root)
  // name(), or "<root>" for the root: for messages.
  std::string display_name() const;

  // Own parameters, in declaration order.
  std::vector<Parameter*> params() const;
  // Direct children, in declaration order.
  std::vector<Module*> children() const;
  // This module and all descendants, pre-order (this first).
  std::vector<Module*> named_modules();
  // Every parameter of the subtree in canonical order (see the file comment).
  void visit_params(const std::function<void(Parameter&)>& fn);
  std::vector<Parameter*> all_params();
  // Parameter by full name in this subtree, or nullptr.
  Parameter* find_param(std::string_view full_name);
  // Elements over all parameters of the subtree.
  int64_t param_count();

  // Drops saved activations of this subtree and resets the lifecycle state (see the file comment).
  void clear_saved();
  // True between a training-mode forward and its backward.
  bool forward_pending() const { return forward_pending_; }
  // Activation recomputation of this module (see the file comment). Not for the root model, whose
  // input is a Batch: mark its children.
  void set_recomputed(bool on) { recomputed_ = on; }
  bool recomputed() const { return recomputed_; }
  [[deprecated("renamed set_recomputed (checkpoint names are for saved training state)")]]
  void set_checkpointed(bool on) { set_recomputed(on); }

 protected:
  Parameter& declare_param(std::string name, memory::Shape shape, Init init, std::vector<std::string> tags = {});

  template <typename M, typename... Args>
  M& add_child(std::string name, Args&&... args) {
    auto child = std::make_unique<M>(std::forward<Args>(args)...);
    M& ref = *child;
    adopt_child(std::move(name), std::move(child));
    return ref;
  }
  void adopt_child(std::string name, std::unique_ptr<Module> child);
  // A child that adds no component to its subtree's names: a container of model parts that keep their
  // own full names (a pipeline stage holding several chunks of one model, pp/ and run/). The parts'
  // full names must not clash (the engine's layout refuses duplicates).
  void adopt_part(std::unique_ptr<Module> part);

  // y = f(x). Training mode: save what backward needs. Called only by Context::forward.
  virtual memory::Tensor forward(Context& ctx, const memory::Tensor& input) = 0;
  // dL/dx from dL/dy; accumulates parameter grads. Undefined Tensor for integer input.
  virtual memory::Tensor backward(Context& ctx, const memory::Tensor& grad_output) = 0;
  // Drops this module's own saved tensors (not the children's). Default: nothing saved.
  virtual void clear_own_saved() {}

 private:
  friend class Context;
  friend void assign_names(Module& root);

  std::string local_name_;
  std::string name_;
  std::vector<std::unique_ptr<Parameter>> params_;
  std::vector<std::unique_ptr<Module>> children_;
  bool forward_pending_ = false;
  bool recomputed_ = false;
  bool recompute_kept_ = false;     // recomputed: the forward kept only its input...
  memory::Tensor recompute_input_;  // ...this, from the forward to the backward's re-run
};

// Runs children in order: forward x -> c0 -> c1 -> ...; backward in reverse. Children are named
// "0", "1", ... (GPT's "blocks.3").
class Sequential : public Module {
 public:
  template <typename M, typename... Args>
  M& append(Args&&... args) {
    return add_child<M>(std::to_string(size_++), std::forward<Args>(args)...);
  }
  int size() const { return size_; }
  std::string_view type_name() const override { return "Sequential"; }

 protected:
  memory::Tensor forward(Context& ctx, const memory::Tensor& input) override;
  memory::Tensor backward(Context& ctx, const memory::Tensor& grad_output) override;

 private:
  int size_ = 0;
};

// Sets local/full names of every module and parameter in the tree (root name "").
void assign_names(Module& root);

// Standalone storage (tests, running without the engine): names the tree, then gives every
// parameter an owning host `data` tensor of `dtype` (fp32, bf16 or fp16) initialised by its Init
// with `seed` (fp32 values rounded to dtype) and a zeroed fp32 `grad`.
void materialize(Module& root, uint64_t seed, memory::DType dtype = memory::DType::kF32);

// Zeroes every parameter's grad in the subtree (undefined grads are skipped).
void zero_grads(Module& root);

}  // namespace zs::nn
