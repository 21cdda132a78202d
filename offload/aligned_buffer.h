// AlignedBuffer: host memory for direct I/O, aligned to 4096 bytes, owned (RAII, move-only).
//
// O_DIRECT transfers need the buffer address, the file offset and the length aligned to the device's
// logical block; zeroshard uses 4096 everywhere (the largest common logical block), so every offload
// buffer comes from here. The memory is an anonymous mapping: page aligned, zero filled on first touch,
// returned to the system when the buffer dies.
//
//   AlignedBuffer buf(64 << 20, &tracker);        // counted as offload_buffers on the host tier
//   std::span<std::byte> all = buf.span();         // size() bytes; capacity() is size() rounded to 4096
//
// Accounting: with a tracker, capacity() bytes are counted under (category, Tier::kHost) while the
// buffer lives (default category kOffloadBuffers). `pin` locks the pages in RAM (mlock), as
// DeepSpeed's pin_memory does; a refused lock (RLIMIT_MEMLOCK) is an OutOfMemoryError saying how to fix
// it. An allocation that fails is an OutOfMemoryError naming the bytes and the category.
// Thread-safety: a buffer is a plain owner; share its bytes, not the object, across threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "memory/category.h"
#include "memory/tracker.h"

namespace zs::offload {

inline constexpr size_t kIoAlignment = 4096;  // bytes: offsets, addresses and O_DIRECT lengths

// Rounds `bytes` up to a multiple of kIoAlignment.
constexpr size_t io_align_up(size_t bytes) { return (bytes + kIoAlignment - 1) / kIoAlignment * kIoAlignment; }
constexpr bool io_aligned(size_t value) { return value % kIoAlignment == 0; }

// The aligned stretch of a file that covers bytes [begin, begin + bytes): read `bytes` at `offset`
// (both multiples of kIoAlignment), and the wanted bytes start `skip` bytes into what was read.
struct IoWindow {
  uint64_t offset = 0;
  size_t bytes = 0;
  size_t skip = 0;
};
constexpr IoWindow io_window(uint64_t begin, size_t bytes) {
  const uint64_t offset = begin / kIoAlignment * kIoAlignment;
  return {offset, static_cast<size_t>(io_align_up(begin + bytes) - offset), static_cast<size_t>(begin - offset)};
}

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // `bytes` may be 0 (an empty buffer, data() == nullptr).
  explicit AlignedBuffer(size_t bytes, memory::MemoryTracker* tracker = nullptr,
                         memory::Category category = memory::Category::kOffloadBuffers, bool pin = false);
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { reset(); }

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }          // bytes asked for
  size_t capacity() const { return capacity_; }  // bytes mapped: size() rounded up to 4096
  bool pinned() const { return pinned_; }
  bool empty() const { return data_ == nullptr; }
  std::span<std::byte> span() const { return {data_, size_}; }
  // The first `bytes` bytes (<= capacity(), so a rounded-up I/O length fits).
  std::span<std::byte> prefix(size_t bytes) const;

  // Frees now; the buffer becomes empty. Idempotent.
  void reset();

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
  bool pinned_ = false;
  memory::TrackedBytes tracked_;
};

}  // namespace zs::offload
