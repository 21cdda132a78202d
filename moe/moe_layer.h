// moe::MoE: a Mixture-of-Experts layer (DeepSpeed's deepspeed.moe.layer.MoE) as an nn::Module.
//
//   auto groups = world.split_groups(/*ep_size=*/2);            // comm::ExpertGroups {dp, ep, edp}
//   moe::MoEOptions o{.num_experts = 8, .ep_size = 2, .k = 2};
//   auto& moe = add_child<moe::MoE>("moe", d, [d] { return std::make_unique<MyMlp>(d); }, o, &groups);
//   ...forward:  Tensor y = ctx.forward(moe, x);                 // x (..., d) -> y (..., d)
//                loss += aux_loss_coef * moe.l_aux();            // the load-balancing loss of this pass
//   ...backward: moe.set_aux_loss_grad(aux_loss_coef * grad_scale);   // d(loss)/d(l_aux), before:
//                Tensor dx = ctx.backward(moe, dy);
//
// Groups. The layer takes the comm::ExpertGroups of its ep_size (World::split_groups(ep_size)): it
// routes tokens over `ep`; the engine reduces expert gradients over `edp`. Without groups (nullptr)
// the layer runs on this process alone: ep_size must be 1. The groups must outlive the layer.
//
// Parameters and names. Children: "gate.wg" (Linear(d, E), no bias, fp32 gating), "experts.<e>" for
// the experts this rank holds, named by their GLOBAL index e (so an expert's initial values, a pure
// function of seed and full name, are the same for every ep_size), and with use_residual "mlp" (one
// more expert from the factory) and "coefficient" (Linear(d, 2) with bias). Rank p of the EP group holds
// experts p*E/P .. (p+1)*E/P - 1. Every expert parameter is tagged nn::kTagExpert with
// expert_parallel_size = ep_size (nn/parameter.h): the engine's contract.
//
// l_aux. forward computes the gate's load-balancing loss of this rank's tokens (moe/gating.h); the
// model reads l_aux() and adds coef * l_aux to its loss. Its gradient enters through
// set_aux_loss_grad(g) with g = d(loss)/d(l_aux) = coef * grad_scale, required before every training
// backward (pass 0 when l_aux is not in the loss): the gate learns from both the output and l_aux.
//
// Randomness (random token selection, RSample, Jitter, top-2 sampling) is keyed by (rng_seed, this
// layer's name, the optimizer step, the token's global index): the context's nn::BatchPosition gives
// the step and the global index of this rank's first sample, and a sample's T tokens are numbered
// first_sample * T + t (T = tokens / samples). Reproducible, the same for every world size, ep_size
// and accumulation setting (the global batch is), and re-run identically by activation checkpointing
// (backward leaves the position alone). The engine sets the position; a caller driving a Context
// itself sets it (a UsageError names the call when a forward that draws finds none).
//
// Collectives: in training and eval, every rank of `ep` runs the layer the same number of times, with
// any number of tokens (0 too); forward runs [an allgather of loads over ep when drop_tokens is
// false], a count exchange and two alltoallv over ep; backward runs two alltoallv over ep.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/world.h"
#include "memory/tensor.h"
#include "moe/dispatch.h"
#include "moe/gating.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace zs::moe {

// DeepSpeed's MoE arguments and defaults.
struct MoEOptions {
  int num_experts = 1;
  int ep_size = 1;
  int k = 1;
  double capacity_factor = 1.0;
  double eval_capacity_factor = 1.0;
  int min_capacity = 4;
  bool use_residual = false;  // PR-MoE: a dense MLP mixed in by a learned 2-way softmax
  NoisyGatePolicy noisy_gate_policy = NoisyGatePolicy::kNone;
  bool drop_tokens = true;
  bool use_rts = true;
  bool top2_2nd_expert_sampling = true;
  uint64_t rng_seed = 0;  // keys the gate's random draws (not DeepSpeed's: it draws from torch's RNG)

  GateConfig gate_config() const;
  // ConfigError naming the key (prefixed, e.g. "model.moe.") for each mistake: num_experts % ep_size,
  // k out of range, capacity factors, ...
  void validate(std::string_view prefix = "") const;
};

// Builds one expert: any module mapping (n, d) -> (n, d). Called once per local expert (and once more
// for the residual MLP).
using ExpertFactory = std::function<std::unique_ptr<nn::Module>()>;

// What the last forward routed (this rank's tokens).
struct MoEStats {
  int64_t tokens = 0;
  int64_t capacity = 0;
  int64_t dropped = 0;                 // routed choices dropped for capacity
  std::vector<int64_t> expert_counts;  // (E) choices routed to each expert before capacity
  float l_aux = 0.0f;
};

class MoE : public nn::Module {
 public:
  MoE(int64_t hidden_size, const ExpertFactory& expert, MoEOptions options, const comm::ExpertGroups* groups = nullptr);
  ~MoE() override;
  std::string_view type_name() const override { return "MoE"; }

  const MoEOptions& options() const { return options_; }
  int local_experts() const { return options_.num_experts / options_.ep_size; }
  int first_expert() const { return first_expert_; }  // global index of experts(0)
  nn::Module& expert(int local) { return *experts_.at(static_cast<size_t>(local)); }

  // The load-balancing loss of the last forward (0 before any).
  float l_aux() const { return stats_.l_aux; }
  const MoEStats& stats() const { return stats_; }
  // d(loss)/d(l_aux) for the next backward (see the file comment).
  void set_aux_loss_grad(float g) { aux_grad_ = g; aux_grad_set_ = true; }

 protected:
  memory::Tensor forward(nn::Context& ctx, const memory::Tensor& x) override;
  memory::Tensor backward(nn::Context& ctx, const memory::Tensor& dy) override;
  void clear_own_saved() override;

 private:
  int64_t first_global_token(const nn::Context& ctx, int64_t tokens) const;
  memory::Tensor run_experts(nn::Context& ctx, const memory::Tensor& x, int64_t rows);

  int64_t d_;
  MoEOptions options_;
  const comm::ExpertGroups* groups_;
  int first_expert_ = 0;
  nn::Module& gate_;
  std::vector<nn::Module*> experts_;
  nn::Module* mlp_ = nullptr;
  nn::Linear* coefficient_ = nullptr;
  float aux_grad_ = 0.0f;
  bool aux_grad_set_ = false;
  MoEStats stats_;

  struct Saved;
  std::unique_ptr<Saved> saved_;
};

}  // namespace zs::moe
