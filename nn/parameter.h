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

#include <algorithm>
#include <cstdint>
#include <memory>
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

// Note [tensor slices]
// Tensor parallelism (tp/, Megatron-LM's layers) gives each rank of a tensor-parallel group one slice
// of a tensor of the tp = 1 model, under that tensor's full name: a column-parallel weight (out, in)
// holds rows, a row-parallel one columns. The slice is along one dimension `dim` of the full tensor,
// which is cut into `stride` equal blocks, each block into `parts` equal pieces; this rank holds piece
// `index` of every block, in block order (Megatron's partition_stride: the fused qkv weight (3C, C)
// has stride 3, so a rank's q, k and v rows are all its heads'). shape() is the slice's, full_shape()
// the tp = 1 tensor's, and an element's place in the full tensor is what initialisation, checkpoints
// (a slice is stored into the full tensor, so a run resumes at any tp degree) and digests use:
// a TP shard initialises as the slice of the tp = 1 tensor, so tp = 2 trains as tp = 1 does.
// A parameter with parts == 1 in a tensor-parallel model is replicated on every rank of the group (a
// norm, a row layer's bias): the engine counts it once in the gradient norm.
// Padding (Megatron's padded vocabulary, --make-vocab-size-divisible-by): with `full_extent` > 0 the
// pieces (stride 1) cover parts * shape[dim] positions of `dim`, of which only the first full_extent
// belong to the full tensor; the rest, at the end of the last pieces, are padding that has no place in
// it: full_shape() has full_extent along dim, for_each_full_run skips the padding, and init_values
// gives it zeros (a layer keeps it out of its results: a padded vocabulary's logits are masked).
struct TensorSlice {
  int dim = 0;     // the full tensor's dimension that is split
  int parts = 1;   // tensor-parallel size; 1: the whole tensor
  int index = 0;   // this rank's piece, 0 <= index < parts
  int stride = 1;  // equal blocks of `dim`, each split into `parts` (Megatron's partition_stride)
  int64_t full_extent = 0;  // the full tensor's size along dim when the pieces are padded; 0: parts * shape[dim]
  bool whole() const { return parts == 1; }
  bool operator==(const TensorSlice&) const = default;
};

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

class Parameter;

// Initial values from outside the model (`zeroshard train --init-from`, run/hf_weights.h). When a
// parameter has one, init_values reads it instead of init(): read(p, out, full_first) fills `out` with
// elements [full_first, full_first + out.size()) of p's full (tp = 1) tensor, row-major, as fp32. Each
// rank asks only for the elements it initialises (its ZeRO shard, its tensor-parallel slice), so a
// source that reads files reads only those. Called from the engine's initialisation threads at once.
class ValueSource {
 public:
  virtual ~ValueSource() = default;
  virtual void read(const Parameter& p, std::span<float> out, uint64_t full_first) const = 0;
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

  // Tensor parallelism (Note [tensor slices]). Set by the layer that declares the parameter, with a
  // shape() that is already the slice's; ModelError when the slice does not fit the shape.
  const TensorSlice& tensor_slice() const { return slice_; }
  void set_tensor_slice(const TensorSlice& slice);
  // The tp = 1 tensor's shape and elements (shape() and numel() for a whole tensor).
  memory::Shape full_shape() const;
  int64_t full_numel() const;
  // Calls fn(local, full, n) for the maximal runs of this slice's flattened elements [first, first +
  // count) that are contiguous in the full tensor's flattened order, in increasing `local`: local
  // elements [local, local + n) are full elements [full, full + n). One run for a whole tensor.
  template <typename Fn>
  void for_each_full_run(uint64_t first, uint64_t count, Fn&& fn) const;
  // out[i] = element first + i of this slice as init() gives it in the full tensor (Init::fill keyed by
  // the full name and the full element index): the values of the tp = 1 model at the same place.
  // With a value source set (set_value_source), the source's values instead of init()'s.
  void init_values(std::span<float> out, uint64_t first, uint64_t seed) const;
  // Initial values from `source` (nullptr: init() again). Set before the engine initialises the model.
  void set_value_source(std::shared_ptr<const ValueSource> source) { source_ = std::move(source); }
  const ValueSource* value_source() const { return source_.get(); }

 private:
  friend class Module;
  std::string name_;
  std::string full_name_;
  memory::Shape shape_;
  Init init_;
  std::shared_ptr<const ValueSource> source_;
  std::vector<std::string> tags_;
  memory::Tensor data_;
  memory::Tensor grad_;
  const Module* owner_ = nullptr;
  int expert_parallel_size_ = 1;
  TensorSlice slice_;
  // Of the slice (set_tensor_slice): elements of one run's row below `dim` (the local inner size), the
  // local and full extents of one block of `dim`, and the rows of this piece that are not padding.
  uint64_t inner_ = 1, local_block_ = 1, full_dim_ = 1, valid_rows_ = 1;
};

template <typename Fn>
void Parameter::for_each_full_run(uint64_t first, uint64_t count, Fn&& fn) const {
  if (slice_.whole()) {
    if (count > 0) fn(first, first, count);
    return;
  }
  // Local element i = ((o * local_dim) + j) * inner + k, j = b * local_block + q (block b, row q of
  // this rank's piece); in the full tensor it is ((o * full_dim) + b * full_block + index * local_block
  // + q) * inner + k, full_block = parts * local_block. A run is one piece row-block: local_block *
  // inner contiguous elements, of which the first valid_rows * inner are the full tensor's (padding:
  // the rest are skipped).
  const uint64_t run = local_block_ * inner_;
  const uint64_t valid = valid_rows_ * inner_;
  const uint64_t blocks = static_cast<uint64_t>(slice_.stride);
  const uint64_t full_block = static_cast<uint64_t>(slice_.parts) * local_block_;
  uint64_t at = first;
  const uint64_t end = first + count;
  while (at < end) {
    const uint64_t r = at / run, within = at % run;  // r = o * blocks + b
    if (within >= valid) {  // padding: no place in the full tensor
      at = std::min(end, (r + 1) * run);
      continue;
    }
    const uint64_t o = r / blocks, b = r % blocks;
    const uint64_t full =
        (o * full_dim_ + b * full_block + static_cast<uint64_t>(slice_.index) * local_block_) * inner_ + within;
    const uint64_t n = std::min(valid - within, end - at);
    fn(at, full, n);
    at += n;
  }
}

}  // namespace zs::nn
