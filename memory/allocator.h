// DeviceAllocator: carves blocks for tensors out of one device segment of fixed capacity.
//
// The capacity is the config's `"device": {"memory_mb": N}`. Placement is TwoEndedBestFit (see
// Note [Two-ended pools] in memory/alloc_policy.h): persistent blocks (model states) and saved ones
// (activations kept for backward) grow up from the low end, transient blocks (scratch, gathered
// parameters, communication and offload buffers) grow down from the high end, each pool best fit with
// splitting and coalescing; every block is 64-byte aligned. A block is an RAII handle: it frees
// itself when destroyed.
//
//   CpuBackend backend(capacity);
//   MemoryTracker tracker;
//   DeviceAllocator alloc(backend, capacity, &tracker);
//   DeviceBlock w = alloc.allocate_tensor({d_out, d_in}, DType::kBF16, Category::kParams, Lifetime::kPersistent);
//   Tensor t = w.tensor();                    // (d_out, d_in) bf16 view of the block
//   DeviceBlock act = alloc.allocate(bytes, Category::kActivations, Lifetime::kTransient);
//   Tensor a = act.tensor(DType::kF32, {batch, d});
//
// Out of memory throws OutOfMemoryError naming the request (bytes), its category, its pool, both
// pools' statistics, the largest free block, and what to change (device.memory_mb, a higher ZeRO stage
// or offload). A zero-byte request gives an empty block (data() == nullptr) that uses no memory.
//
// Accounting: the tracker (optional) is told the aligned size of every live block under
// (category, Tier::kDevice); stats() reports the arena (tagged byte sums and counts, ArenaStats).
//
// Thread-safety: allocate, free (a block's destruction), stats and check_invariants may run on any
// thread concurrently: one mutex guards the policy and the recorder. Blocks are placed in microseconds
// (O(log blocks)) and only at tensor granularity, so a single lock is not a bottleneck.
// Lifetime: the allocator must outlive its blocks (a leak is logged at destruction).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "memory/alloc_policy.h"
#include "memory/backend.h"
#include "memory/category.h"
#include "memory/tensor.h"

namespace zs::memory {

class AllocTraceRecorder;
class DeviceAllocator;
class MemoryTracker;

// A live block of a DeviceAllocator. Move-only; frees on destruction or release().
class DeviceBlock {
 public:
  DeviceBlock() = default;
  DeviceBlock(DeviceBlock&& other) noexcept;
  DeviceBlock& operator=(DeviceBlock&& other) noexcept;
  DeviceBlock(const DeviceBlock&) = delete;
  DeviceBlock& operator=(const DeviceBlock&) = delete;
  ~DeviceBlock() { release(); }

  void* data() const { return data_; }
  size_t size() const { return size_; }                         // bytes requested
  size_t reserved_bytes() const { return align_up(size_); }     // bytes taken from the arena
  size_t offset() const { return offset_; }                     // bytes from the arena start
  Category category() const { return category_; }
  Lifetime lifetime() const { return lifetime_; }
  uint64_t id() const { return id_; }                           // unique per allocator; 0 when empty
  bool empty() const { return data_ == nullptr; }

  // A contiguous view of the first numel(shape) * dtype_size(dtype) bytes (must fit in size()).
  Tensor tensor(DType dtype, Shape shape) const;
  // The view given to allocate_tensor (InternalError for blocks from allocate()).
  Tensor tensor() const;

  // Frees now; the handle becomes empty. Idempotent.
  void release();

 private:
  friend class DeviceAllocator;

  DeviceAllocator* owner_ = nullptr;
  void* data_ = nullptr;
  size_t size_ = 0;
  size_t offset_ = 0;
  uint64_t id_ = 0;
  Category category_ = Category::kParams;
  Lifetime lifetime_ = Lifetime::kPersistent;
  bool has_shape_ = false;
  DType dtype_ = DType::kF32;
  Shape shape_;
};

class DeviceAllocator {
 public:
  // Takes one kDevice segment of `capacity_bytes` from `backend` (which must outlive this).
  // `tracker` may be null.
  DeviceAllocator(Backend& backend, size_t capacity_bytes, MemoryTracker* tracker = nullptr);
  ~DeviceAllocator();
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  DeviceBlock allocate(size_t bytes, Category category, Lifetime lifetime);
  DeviceBlock allocate_tensor(Shape shape, DType dtype, Category category, Lifetime lifetime);

  size_t capacity() const { return capacity_; }  // bytes (rounded down to kAllocAlignment)
  void* base() const { return segment_.data(); }
  Backend& backend() const { return backend_; }
  ArenaStats stats() const;
  // "" when the arena is consistent (memory/alloc_policy.h), else the first violation. O(blocks).
  std::string check_invariants() const;
  bool is_valid() const { return check_invariants().empty(); }

  // Every later allocation and free is appended to `recorder` (null stops recording). The recorder
  // must stay alive while attached.
  void set_trace_recorder(AllocTraceRecorder* recorder);

 private:
  friend class DeviceBlock;
  void free_block(const DeviceBlock& block) noexcept;
  [[noreturn]] void throw_oom(size_t bytes, Category category, Lifetime lifetime) const;  // needs mu_ held

  Backend& backend_;
  size_t capacity_;
  Segment segment_;
  MemoryTracker* tracker_;
  mutable std::mutex mu_;  // guards policy_, next_id_, recorder_
  TwoEndedBestFit policy_;
  uint64_t next_id_ = 1;
  AllocTraceRecorder* recorder_ = nullptr;
};

}  // namespace zs::memory
