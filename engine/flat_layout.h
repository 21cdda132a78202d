// FlatLayout: where each parameter lives in the engine's flat model-state buffers.
//
// Parameters are laid out in the model's canonical order (nn::Module::visit_params), each starting
// on a multiple of kAlignElements so every parameter view is 64-byte aligned for fp32 and bf16/fp16
// alike; the gaps are zero padding that no layer sees. Every flat buffer of the engine (parameters,
// gradients, fp32 master weights, each optimizer state) uses this one layout, so a ShardRange means
// the same elements in all of them.
//
// Expert parameters (nn::Parameter::expert_parallel_size() E > 1) are sharded over their own
// expert-data-parallel group, so they live in their own layouts: one per distinct E
// (group_by_expert_parallel_size). A FlatLayout holds parameters of one E only.
//
// Gradient buckets (plan_buckets) group consecutive parameters from the END of the layout, because
// backward produces gradients in reverse order: bucket 0 is ready first.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "memory/shard.h"
#include "nn/parameter.h"

namespace zs::engine {

struct ParamSlot {
  nn::Parameter* param = nullptr;
  size_t offset = 0;  // elements from the start of the flat buffer
  size_t numel = 0;
  memory::ShardRange range() const { return {offset, numel}; }
};

class FlatLayout {
 public:
  static constexpr size_t kAlignElements = 32;  // 64 bytes of bf16/fp16 (and 128 of fp32)

  // Every parameter must have the same expert_parallel_size (ModelError otherwise).
  explicit FlatLayout(std::vector<nn::Parameter*> params);

  std::span<const ParamSlot> slots() const { return slots_; }
  // Elements of the flat buffers, padding included (a multiple of kAlignElements).
  size_t total() const { return total_; }
  // Elements of the parameters themselves, padding excluded.
  size_t param_elements() const { return param_elements_; }
  // The parameters' expert_parallel_size: 1 for dense parameters (and an empty layout).
  int expert_parallel_size() const { return expert_parallel_size_; }
  // The non-empty parameters' ranges, ascending: the tensors a compressed allreduce sees
  // (comm::OneBitAllreduce; the alignment gaps between them are its padding).
  std::vector<memory::ShardRange> param_ranges() const;

 private:
  std::vector<ParamSlot> slots_;
  int expert_parallel_size_ = 1;
  size_t total_ = 0;
  size_t param_elements_ = 0;
};

// The parameters of one partition group, in canonical order.
struct ParamGroup {
  int expert_parallel_size = 1;
  std::vector<nn::Parameter*> params;
};
// Splits `params` (canonical order) by expert_parallel_size: the dense group first (always present,
// possibly empty), then one group per distinct E > 1, ascending. Each keeps the canonical order.
std::vector<ParamGroup> group_by_expert_parallel_size(const std::vector<nn::Parameter*>& params);

struct BucketPlan {
  size_t first_slot = 0;  // slots [first_slot, end_slot) of the layout, ascending
  size_t end_slot = 0;
  memory::ShardRange range;  // the elements the bucket covers, padding between its slots included
};

// Splits the layout into buckets of about `bucket_elements` elements (a parameter larger than that
// gets a bucket of its own), in the order backward fills them: the last parameters first.
std::vector<BucketPlan> plan_buckets(const FlatLayout& layout, size_t bucket_elements);

}  // namespace zs::engine
