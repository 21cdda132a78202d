// Optimizer: updates a flat fp32 partition in place.
//
// An optimizer owns no tensors. The engine owns the flat model states (fp32 master weights, gradients
// and the optimizer's states, each a plain buffer it places on device, host or NVMe and saves in
// checkpoints) and hands the optimizer one chunk at a time, so offload can stream sub-groups through
// it. Kernels know nothing of sharding (llm.c's style): a chunk is a set of equally long spans plus
// one pointer per state.
//
// States need not be fp32 per element: a StateSpec says how many bytes one stored value takes and how
// many elements share it (CAdam keeps an int8 per element and one fp32 scale per block of 32). The
// engine allocates each state with spec.bytes_for(partition elements) and starts it at
// spec.initial_value (fp32 per-element states) or zero (any other layout).
//
//   optim::Adam adam(cfg);
//   std::vector<float> m(n), v(n);
//   void* states[] = {m.data(), v.data()};
//   adam.step({.master = master, .grad = grad, .states = states}, {.step = 1, .lr = 1e-3});
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "memory/dtype.h"

namespace zs::optim {

// One optimizer state, e.g. Adam's "exp_avg" (fp32 per element) or CAdam's "exp_avg_scale" (one fp32
// per block of 32 elements).
struct StateSpec {
  std::string_view name;
  size_t value_bytes = 4;          // bytes of one stored value: 4 (fp32), 1 (int8), ...
  size_t elements_per_value = 1;   // 1: one value per element; B: one value per block of B elements (e.g. scales)
  float initial_value = 0.0f;      // fp32 states (value_bytes 4, elements_per_value 1) start at this;
                                   // others start zeroed
  // Bytes of this state for `elements` elements (blocks rounded up).
  constexpr size_t bytes_for(size_t elements) const {
    return (elements + elements_per_value - 1) / elements_per_value * value_bytes;
  }
};

// One contiguous piece of a partition. master and grad have the same number of elements.
struct ParamChunk {
  std::span<float> master;            // fp32 master weights, updated in place
  std::span<const float> grad;        // fp32 gradients (already averaged over ranks and micro-batches)
  // One pointer per StateSpec, in state_specs() order: the stored value that holds the chunk's FIRST
  // element (for a block state, the value of the block the chunk starts in; chunk starts are
  // multiples of alignment_elements(), so that block starts at the chunk). Each state holds at least
  // spec.bytes_for(master.size()) bytes from there.
  std::span<void* const> states;
  // Optional low-precision copy of the updated weights written in the same pass (the bf16/fp16
  // parameters the model computes with); nullptr when the model computes in fp32.
  void* low_precision = nullptr;
  memory::DType low_precision_dtype = memory::DType::kBF16;
  bool apply_weight_decay = true;     // false for biases and norm weights ("no_weight_decay" tag)
};

// What is the same for every chunk of one step.
struct StepContext {
  int64_t step = 1;        // 1-based count of optimizer steps taken, this one included (bias correction)
  double lr = 1e-3;        // this step's learning rate (from the schedule)
  float grad_scale = 1.0f; // multiplies every gradient first (clipping coefficient, 1/loss scale)
  // This step's betas when the schedule sets them (OneCycle's cycle_momentum), replacing the
  // configured ones as DeepSpeed's scheduler replaces param_group['betas'] (bias corrections use them too).
  std::optional<std::array<double, 2>> betas{};
  const std::array<double, 2>& betas_or(const std::array<double, 2>& configured) const { return betas ? *betas : configured; }
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string_view name() const = 0;
  // The states this optimizer keeps, in the order ParamChunk::states holds them.
  virtual std::span<const StateSpec> state_specs() const = 0;
  // Chunk starts handed to step() must be multiples of this many elements from the start of the
  // state buffers (block-quantised states); the engine guarantees multiples of 32. Default 1.
  // Every spec's elements_per_value divides it.
  virtual size_t alignment_elements() const { return 1; }
  // Bytes of optimizer state for `elements` elements (sum of bytes_for over state_specs()).
  size_t state_bytes(size_t elements) const;
  // Average bytes of optimizer state per parameter element (Adam 8, CAdam 1.125), for reports:
  // state_bytes(2^20) / 2^20. Use state_bytes() for allocation sizes.
  double state_bytes_per_param() const;
  // Updates one chunk. Thread-safe for disjoint chunks. An optimizer with tensor_sums() > 0 takes the
  // chunk as one whole parameter tensor here.
  virtual void step(const ParamChunk& chunk, const StepContext& ctx) const = 0;

  // Values per parameter TENSOR the update needs summed over the whole tensor before it can apply
  // (Lamb's ||p||^2 and ||u||^2; Note [per-tensor optimizers] in optim/lamb.h). 0, the default: an
  // elementwise optimizer, whose step() may run on any cut of a tensor. Above 0, a step of a tensor cut
  // into chunks is two passes: accumulate_tensor_sums() on every chunk (each exactly once: it advances
  // the states), the caller adds up each tensor's sums over all its chunks (over ranks too), then
  // apply_tensor_sums() on every chunk with its tensor's totals. Thread-safe for disjoint chunks.
  virtual size_t tensor_sums() const { return 0; }
  // Pass 1: advances the chunk's states from its gradient and ADDS its tensor_sums() values to `sums`.
  // Reads master, does not write it.
  virtual void accumulate_tensor_sums(const ParamChunk& chunk, const StepContext& ctx, std::span<double> sums) const;
  // Pass 2: updates master (and the low-precision copy) from the states and the tensor's `totals`.
  // Does not read chunk.grad (it may be empty).
  virtual void apply_tensor_sums(const ParamChunk& chunk, const StepContext& ctx, std::span<const double> totals) const;
  // The same update spread over `threads` threads (core/parallel.h's pool; the calling thread takes
  // part): the chunk is cut into contiguous pieces and step() runs on each piece, its state pointers
  // advanced by the piece's offset converted per spec (offset / elements_per_value * value_bytes).
  // Cuts: alignment_elements() == 1: at cache-line boundaries of master (multiples of 16 elements
  // from its first 64-byte-aligned element); otherwise at multiples of lcm(16, alignment_elements())
  // elements from the chunk start, so no block of a block state is split. Results equal step()'s bit
  // for bit, because every optimizer here updates each element (each block) from that element's
  // (block's) values alone. threads <= 1, or a chunk too small to split, runs step() on the calling
  // thread. Thread-safe for disjoint chunks like step(); calls from several threads take turns on
  // the pool. Elementwise optimizers only (tensor_sums() == 0).
  void step_parallel(const ParamChunk& chunk, const StepContext& ctx, int threads) const;
};

}  // namespace zs::optim
