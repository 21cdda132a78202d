#include "offload/aligned_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <utility>

#include <fmt/format.h>

#include "core/errors.h"

namespace zs::offload {

AlignedBuffer::AlignedBuffer(size_t bytes, memory::MemoryTracker* tracker, memory::Category category, bool pin) {
  if (bytes == 0) return;
  const size_t cap = io_align_up(bytes);
  // An anonymous mapping rather than posix_memalign: always page aligned, and munmap gives large
  // buffers back to the system at once instead of leaving them in the heap.
  void* p = ::mmap(nullptr, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    throw OutOfMemoryError(fmt::format("cannot allocate a {}-byte offload buffer ({}) on the host: {}; lower "
                                       "sub_group_size or buffer_count, or free host memory",
                                       cap, memory::category_name(category), zs::detail::errno_text(errno)));
  }
  if (pin && ::mlock(p, cap) != 0) {
    const int err = errno;
    ::munmap(p, cap);
    throw OutOfMemoryError(fmt::format("cannot pin (mlock) a {}-byte offload buffer: {}; raise the locked-memory "
                                       "limit (ulimit -l, RLIMIT_MEMLOCK) or set pin_memory to false",
                                       cap, zs::detail::errno_text(err)));
  }
  data_ = static_cast<std::byte*>(p);
  size_ = bytes;
  capacity_ = cap;
  pinned_ = pin;
  tracked_ = memory::TrackedBytes(tracker, category, memory::Tier::kHost, cap);
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      capacity_(std::exchange(other.capacity_, 0)),
      pinned_(std::exchange(other.pinned_, false)),
      tracked_(std::move(other.tracked_)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
    pinned_ = std::exchange(other.pinned_, false);
    tracked_ = std::move(other.tracked_);
  }
  return *this;
}

std::span<std::byte> AlignedBuffer::prefix(size_t bytes) const {
  ZS_ASSERT(bytes <= capacity_, "prefix of {} bytes of a buffer of capacity {}", bytes, capacity_);
  return {data_, bytes};
}

void AlignedBuffer::reset() {
  if (data_ != nullptr) ::munmap(data_, capacity_);  // also unlocks pinned pages
  data_ = nullptr;
  size_ = capacity_ = 0;
  pinned_ = false;
  tracked_.reset();
}

}  // namespace zs::offload
