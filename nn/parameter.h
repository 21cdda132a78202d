// Parameter: one named, shaped model weight, its initialiser, its tags and its storage views.
//
// A module declares its parameters in its constructor (Module::declare_param); nothing is allocated
// then. Whoever owns model states (the engine's flat buffers, or nn::materialize for tests and the
// standalone path) later points `data` and `grad` at storage:
//   - data: the parameter in its storage dtype (fp32, bf16 or fp16), shape == shape(). It may be
//     undefined while the engine holds it partitioned (ZeRO-3 between gather and release).
//   - grad: where layers ACCUMULATE dL/dparam (grad += ...), fp32, bf16 or fp16, same shape.
//     Layers write grads only through nn::GradAccumulator (nn/param_access.h).
//
// Initialisation is a pure function of (seed, full name, element index) through the counter-based
// RNG (core/rng.h), so any sub-range of the flattened parameter can be initialised alone and the
// model is identical for every world size and partitioning:
//   std::vector<float> shard(size);
//   p.init().fill(shard, /*first_index=*/offset, seed, p.full_name());
//
// Thread-safety: none; parameters are configured before training and their views are set by one
// thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "memory/tensor.h"

namespace zs::nn {

class Module;

// Tag names the engine and optimizers understand.
inline constexpr std::string_view kTagNoWeightDecay = "no_weight_decay";  // biases, norm weights
inline constexpr std::string_view kTagExpert = "expert";                  // MoE expert weights

class Init {
 public:
  enum class Kind : uint8_t { kZeros, kOnes, kNormal, kUniform };

  static Init zeros() { return Init(Kind::kZeros, 0.0f, 0.0f); }
  static Init ones() { return Init(Kind::kOnes, 0.0f, 0.0f); }
  static Init normal(float mean, float std) { return Init(Kind::kNormal, mean, std); }
  static Init uniform(float lo, float hi) { return Init(Kind::kUniform, lo, hi); }

  // Fills out[i] with element (first_index + i) of the parameter named `full_name`.
  // Deterministic: depends only on (seed, full_name, element index, this Init).
  void fill(std::span<float> out, uint64_t first_index, uint64_t seed, const std::string& full_name) const;

  Kind kind() const { return kind_; }
  float a() const { return a_; }  // normal: mean; uniform: lo
  float b() const { return b_; }  // normal: std;  uniform: hi
  std::string describe() const;   // "normal(0, 0.02)"

 private:
  Init(Kind kind, float a, float b) : kind_(kind), a_(a), b_(b) {}
  Kind kind_;
  float a_;
  float b_;
};

class Parameter {
 public:
  Parameter(std::string name, memory::Shape shape, Init init, std::vector<std::string> tags = {});
  Parameter(const Parameter&) = delete;
  Parameter& operator=(const Parameter&) = delete;

  const std::string& name() const { return name_; }            // local: "weight"
  const std::string& full_name() const { return full_name_; }  // "blocks.3.attn.qkv.weight" (after assign_names)
  const memory::Shape& shape() const { return shape_; }
  int64_t numel() const { return memory::shape_numel(shape_); }
  const Init& init() const { return init_; }
  const std::vector<std::string>& tags() const { return tags_; }
  bool has_tag(std::string_view tag) const;
  // Adds `tag` unless present. For a module that tags parameters it did not declare (moe::MoE marks
  // every parameter of its experts with kTagExpert); call before the engine plans the model.
  void add_tag(std::string_view tag);

  // Storage views (see the file comment). set_data/set_grad check the shape; undefined is allowed.
  const memory::Tensor& data() const { return data_; }
  const memory::Tensor& grad() const { return grad_; }
  void set_data(memory::Tensor t);
  void set_grad(memory::Tensor t);

  // Set by assign_names (nn/module.h).
  void set_full_name(std::string full_name) { full_name_ = std::move(full_name); }
  // The module that declared this parameter (Module::declare_param), or nullptr for a free-standing
  // one. Layers read a parameter only while its owner runs through the Context (nn/param_access.h).
  const Module* owner() const { return owner_; }

  // Expert parallelism (MoE). 1 (the default): every data-parallel rank holds this parameter, and the
  // engine averages its gradient and shards its states over the whole data-parallel group. E > 1: an
  // expert's parameter, held only by the ranks with the same index in consecutive groups of E ranks
  // (the `edp` group of comm::ExpertGroups, DeepSpeed's expert-data-parallel group); the engine
  // reduces its gradient and shards its states over that group only. Set by the module that declares
  // it (moe::MoE), together with the kTagExpert tag; the engine reads only this and the tag.
  int expert_parallel_size() const { return expert_parallel_size_; }
  void set_expert_parallel_size(int e);

 private:
  friend class Module;
  std::string name_;
  std::string full_name_;
  memory::Shape shape_;
  Init init_;
  std::vector<std::string> tags_;
  memory::Tensor data_;
  memory::Tensor grad_;
  const Module* owner_ = nullptr;
  int expert_parallel_size_ = 1;
};

}  // namespace zs::nn
