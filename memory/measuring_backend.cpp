#include "memory/measuring_backend.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "core/errors.h"
#include "memory/detail/host_ops.h"

namespace zs::memory {

using detail::page_round;

MeasuringBackend::MeasuringBackend(size_t device_capacity_bytes) : device_capacity_(device_capacity_bytes) {}

size_t MeasuringBackend::capacity(Tier tier) const {
  if (tier == Tier::kDevice) return device_capacity_;
  if (tier == Tier::kHost) return ~size_t{0};  // the host tier is measured, not limited
  return 0;
}

size_t MeasuringBackend::allocated(Tier tier) const {
  if (tier == Tier::kDevice) return device_allocated_.load(std::memory_order_relaxed);
  if (tier == Tier::kHost) return host_allocated_.load(std::memory_order_relaxed);
  return 0;
}

Segment MeasuringBackend::allocate(size_t bytes, Tier tier) {
  ZS_ASSERT(bytes > 0, "measuring backend: zero-byte segment requested");
  ZS_ASSERT(tier != Tier::kNvme, "the measuring backend does not serve the nvme tier");
  if (tier == Tier::kDevice && device_allocated_.load() + bytes > device_capacity_) {
    throw OutOfMemoryError(fmt::format("measuring backend: a device segment of {} bytes exceeds its {} bytes", bytes,
                                       device_capacity_));
  }
  void* p = ::mmap(nullptr, page_round(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    throw OutOfMemoryError(fmt::format("measuring backend: reserving {} bytes of address space failed: {}", bytes,
                                       std::strerror(errno)));
  }
  (tier == Tier::kDevice ? device_allocated_ : host_allocated_).fetch_add(bytes, std::memory_order_relaxed);
  return make_segment(p, bytes, tier);
}

void MeasuringBackend::free_segment(void* data, size_t bytes, Tier tier) noexcept {
  ::munmap(data, page_round(bytes));
  (tier == Tier::kDevice ? device_allocated_ : host_allocated_).fetch_sub(bytes, std::memory_order_relaxed);
}

}  // namespace zs::memory
