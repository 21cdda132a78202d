// RecomputeInputStore: where the engine keeps checkpointed modules' inputs between their forward and
// the re-run in their backward (nn::Context::keep_recompute_input / restore_recompute_input; Note
// [activation recomputation] in nn/context.cpp), per the `activation_checkpointing` keys:
//   - default: the input tensor itself, in the device arena;
//   - cpu_checkpointing: a copy in a host buffer (tier host, category activations); the device input
//     is freed when its other users are done, and the re-run reads a fresh device copy;
//   - contiguous_memory_optimization: a copy in a slot of one buffer allocated at the first kept input
//     (number_checkpoints slots of that input's size, 64-byte rounded; on the host with
//     cpu_checkpointing, else a persistent block of the arena), so kept inputs never fragment the
//     transient end of the arena. A slot frees when the last view of its copy is dropped.
//   - synchronize_checkpoint_boundary: the backend synchronizes before each keep and after each restore.
// Copies go through the backend (host <-> device bytes are counted as transfers). A measuring backend
// moves nothing, so the estimator sees the same allocations without data.
#pragma once

#include <memory>

#include "engine/recompute_config.h"
#include "memory/allocator.h"
#include "memory/tensor.h"
#include "memory/tracker.h"

namespace zs::engine {

struct DeviceArena;

class RecomputeInputStore {
 public:
  // `slots`: the contiguous buffer's slots (number_checkpoints, or the model's checkpointed modules).
  RecomputeInputStore(const RecomputeConfig& cfg, int64_t slots, std::shared_ptr<DeviceArena> arena);
  ~RecomputeInputStore();
  RecomputeInputStore(const RecomputeInputStore&) = delete;
  RecomputeInputStore& operator=(const RecomputeInputStore&) = delete;

  // What to keep for `input` (a contiguous device tensor).
  memory::Tensor keep(const memory::Tensor& input);
  // The kept tensor back on the device: itself when it is there, else a copy into `fresh` (an
  // activation-use device tensor of the same shape and dtype the caller allocated).
  bool on_host() const { return cfg_.cpu_checkpointing; }
  memory::Tensor restore(memory::Tensor kept, memory::Tensor fresh);
  // The contiguous buffer's bytes (0 before the first kept input, or without the optimization).
  size_t buffer_bytes() const;

 private:
  struct Slots;
  memory::Tensor keep_in_slot(const memory::Tensor& input);

  const RecomputeConfig& cfg_;
  int64_t slot_count_;
  std::shared_ptr<DeviceArena> arena_;
  std::shared_ptr<Slots> slots_;  // shared with the owners of kept copies
};

}  // namespace zs::engine
