#include "memory/allocator.h"

#include <utility>

#include "core/log.h"
#include "memory/alloc_trace.h"
#include "memory/tracker.h"

namespace zs::memory {
namespace {

std::string mib(size_t bytes) { return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0)); }

std::string pool_line(const PoolStats& p) {
  return fmt::format("allocated {} ({} B) in {} blocks, reserved {} ({} B), largest hole {} B, peak reserved {}",
                     mib(p.allocated_bytes), p.allocated_bytes, p.live_blocks, mib(p.reserved_bytes), p.reserved_bytes,
                     p.largest_free_bytes, mib(p.peak_reserved_bytes));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// DeviceBlock

DeviceBlock::DeviceBlock(DeviceBlock&& other) noexcept { *this = std::move(other); }

DeviceBlock& DeviceBlock::operator=(DeviceBlock&& other) noexcept {
  if (this != &other) {
    release();
    owner_ = std::exchange(other.owner_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    offset_ = std::exchange(other.offset_, 0);
    id_ = std::exchange(other.id_, 0);
    category_ = other.category_;
    lifetime_ = other.lifetime_;
    has_shape_ = std::exchange(other.has_shape_, false);
    dtype_ = other.dtype_;
    shape_ = std::move(other.shape_);
  }
  return *this;
}

void DeviceBlock::release() {
  if (owner_ != nullptr) owner_->free_block(*this);
  owner_ = nullptr;
  data_ = nullptr;
  size_ = 0;
  offset_ = 0;
  id_ = 0;
  has_shape_ = false;
}

Tensor DeviceBlock::tensor(DType dtype, Shape shape) const {
  int64_t n = shape_numel(shape);
  ZS_ASSERT(n >= 0 && static_cast<size_t>(n) * dtype_size(dtype) <= size_,
            "a {} tensor {} needs {} bytes but the block has {}", dtype_name(dtype), shape_string(shape),
            static_cast<size_t>(n) * dtype_size(dtype), size_);
  return Tensor(data_, dtype, std::move(shape));
}

Tensor DeviceBlock::tensor() const {
  ZS_ASSERT(has_shape_, "tensor() without arguments needs a block from allocate_tensor");
  return Tensor(data_, dtype_, shape_);
}

// ---------------------------------------------------------------------------------------------
// DeviceAllocator

DeviceAllocator::DeviceAllocator(Backend& backend, size_t capacity_bytes, MemoryTracker* tracker)
    : backend_(backend),
      capacity_(capacity_bytes / kAllocAlignment * kAllocAlignment),
      tracker_(tracker),
      policy_(capacity_) {
  if (capacity_ == 0) {
    throw ConfigError(fmt::format("device.memory_mb: a device capacity of {} bytes is too small; set at least 1 MiB",
                                  capacity_bytes));
  }
  segment_ = backend_.allocate(capacity_, Tier::kDevice);
}

DeviceAllocator::~DeviceAllocator() {
  ArenaStats s = policy_.stats();
  size_t live = s.persistent.live_blocks + s.transient.live_blocks;
  // A destructor must not throw; a leak is a bug in the owner, reported loudly but not fatally.
  if (live != 0) ZS_LOG_ERROR("DeviceAllocator destroyed with {} live blocks ({} bytes): they now dangle", live, s.allocated_bytes);
}

DeviceBlock DeviceAllocator::allocate(size_t bytes, Category category, Lifetime lifetime) {
  DeviceBlock b;
  b.category_ = category;
  b.lifetime_ = lifetime;
  if (bytes == 0) return b;  // empty: no arena use, nothing to account
  {
    std::lock_guard lock(mu_);
    std::optional<size_t> offset = policy_.allocate(bytes, lifetime);
    if (!offset) [[unlikely]] throw_oom(bytes, category, lifetime);
    b.owner_ = this;
    b.offset_ = *offset;
    b.size_ = bytes;
    b.data_ = static_cast<char*>(segment_.data()) + *offset;
    b.id_ = next_id_++;
    if (recorder_ != nullptr) recorder_->record_alloc(b.id_, bytes, lifetime, category);
  }
  if (tracker_ != nullptr) tracker_->add(category, Tier::kDevice, b.reserved_bytes());
  return b;
}

DeviceBlock DeviceAllocator::allocate_tensor(Shape shape, DType dtype, Category category, Lifetime lifetime) {
  int64_t n = shape_numel(shape);
  for (int64_t d : shape) ZS_ASSERT(d >= 0, "negative dimension in {}", shape_string(shape));
  DeviceBlock b = allocate(static_cast<size_t>(n) * dtype_size(dtype), category, lifetime);
  b.has_shape_ = true;
  b.dtype_ = dtype;
  b.shape_ = std::move(shape);
  return b;
}

void DeviceAllocator::free_block(const DeviceBlock& block) noexcept {
  {
    std::lock_guard lock(mu_);
    // An unknown offset is a bug (double free); policy_.free throws InternalError, and since this runs
    // from destructors that ends the process with the message, which is what a heap corruption deserves.
    policy_.free(block.offset_);
    if (recorder_ != nullptr) recorder_->record_free(block.id_);
  }
  if (tracker_ != nullptr) tracker_->sub(block.category_, Tier::kDevice, block.reserved_bytes());
}

void DeviceAllocator::throw_oom(size_t bytes, Category category, Lifetime lifetime) const {
  ArenaStats s = policy_.stats();
  size_t gap = s.capacity_bytes - s.reserved_bytes;
  throw OutOfMemoryError(fmt::format(
      "device out of memory: cannot allocate {} bytes ({}) for {} ({} block, {} pool). Device capacity {} ({} B); "
      "persistent pool: {}; transient pool: {}; unreserved gap {} B; largest free block {} B; free {} B in total "
      "(fragmentation {:.1f}%). Fix: raise device.memory_mb, use a higher ZeRO stage (zero_optimization.stage) to "
      "shard model states across ranks, or offload them (zero_optimization.offload_optimizer / offload_param); for "
      "activations, lower train_micro_batch_size_per_gpu or enable activation_checkpointing",
      bytes, mib(bytes), category_name(category), lifetime_name(lifetime), lifetime_name(pool_of(lifetime)), mib(s.capacity_bytes), s.capacity_bytes,
      pool_line(s.persistent), pool_line(s.transient), gap, s.largest_free_bytes, s.free_bytes,
      100.0 * s.fragmentation));
}

ArenaStats DeviceAllocator::stats() const {
  std::lock_guard lock(mu_);
  return policy_.stats();
}

std::string DeviceAllocator::check_invariants() const {
  std::lock_guard lock(mu_);
  return policy_.check_invariants();
}

void DeviceAllocator::set_trace_recorder(AllocTraceRecorder* recorder) {
  std::lock_guard lock(mu_);
  recorder_ = recorder;
}

}  // namespace zs::memory
