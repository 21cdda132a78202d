#include "memory/cpu_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "core/errors.h"
#include "memory/detail/host_ops.h"

namespace zs::memory {
namespace {

constexpr size_t kSegmentAlign = 4096;  // page: also what O_DIRECT needs for offload staging
constexpr size_t kHugePage = size_t{2} << 20;  // x86-64's transparent huge page

size_t physical_memory_bytes() {
  long pages = ::sysconf(_SC_PHYS_PAGES);
  long page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
}

}  // namespace

CpuBackend::CpuBackend(size_t device_capacity_bytes, size_t host_capacity_bytes, bool shared_device)
    : device_capacity_(device_capacity_bytes),
      host_capacity_(host_capacity_bytes != 0 ? host_capacity_bytes : physical_memory_bytes()),
      shared_device_(shared_device) {}

const SharedMapping* CpuBackend::shared_mapping(const void* segment_data) const {
  std::lock_guard lock(shared_mu_);
  auto it = shared_.find(segment_data);
  return it == shared_.end() ? nullptr : it->second.get();
}

size_t CpuBackend::capacity(Tier tier) const {
  switch (tier) {
    case Tier::kDevice: return device_capacity_;
    case Tier::kHost: return host_capacity_;
    case Tier::kNvme: return 0;
  }
  return 0;
}

std::atomic<size_t>& CpuBackend::allocated_ref(Tier tier) {
  ZS_ASSERT(tier != Tier::kNvme, "the cpu backend does not serve the nvme tier (the offload module does)");
  return tier == Tier::kDevice ? device_allocated_ : host_allocated_;
}

size_t CpuBackend::allocated(Tier tier) const {
  if (tier == Tier::kNvme) return 0;
  return (tier == Tier::kDevice ? device_allocated_ : host_allocated_).load(std::memory_order_relaxed);
}

Segment CpuBackend::allocate(size_t bytes, Tier tier) {
  ZS_ASSERT(bytes > 0, "cpu backend: zero-byte segment requested");
  std::atomic<size_t>& used = allocated_ref(tier);
  size_t cap = capacity(tier);
  // Reserve first, so concurrent callers cannot both pass the check.
  size_t before = used.fetch_add(bytes, std::memory_order_relaxed);
  if (before + bytes > cap) [[unlikely]] {
    used.fetch_sub(bytes, std::memory_order_relaxed);
    throw OutOfMemoryError(fmt::format(
        "cpu backend: a {} segment of {} bytes does not fit: {} of {} bytes already held. Fix: raise "
        "device.memory_mb (device tier) or free host memory / lower offload buffer sizes (host tier)",
        tier_name(tier), bytes, before, cap));
  }
  size_t rounded = (bytes + kSegmentAlign - 1) / kSegmentAlign * kSegmentAlign;
  if (shared_device_ && tier == Tier::kDevice) {
    std::unique_ptr<SharedMapping> m;
    try {
      m = std::make_unique<SharedMapping>(SharedMapping::create(rounded));
    } catch (...) {
      used.fetch_sub(bytes, std::memory_order_relaxed);
      throw;
    }
    void* data = m->data();
    std::lock_guard lock(shared_mu_);
    shared_.emplace(data, std::move(m));
    return make_segment(data, bytes, tier);
  }
  const bool huge = rounded >= 2 * kHugePage;
  void* p = std::aligned_alloc(huge ? kHugePage : kSegmentAlign, huge ? (rounded + kHugePage - 1) / kHugePage * kHugePage : rounded);
  if (p == nullptr) [[unlikely]] {
    used.fetch_sub(bytes, std::memory_order_relaxed);
    throw OutOfMemoryError(fmt::format("cpu backend: the OS refused a {} segment of {} bytes. Fix: lower "
                                       "device.memory_mb or run fewer ranks per node",
                                       tier_name(tier), bytes));
  }
  // Note [huge pages]: a large segment asks for transparent huge pages (Debian's default THP mode is
  // "madvise": nothing without the ask). Advice only: refused, the pages stay 4 KiB and nothing changes.
  if (huge) ::madvise(p, rounded, MADV_HUGEPAGE);
  return make_segment(p, bytes, tier);
}

void CpuBackend::free_segment(void* data, size_t bytes, Tier tier) noexcept {
  std::unique_ptr<SharedMapping> shared;  // unmapped outside the lock
  {
    std::lock_guard lock(shared_mu_);
    auto it = shared_.find(data);
    if (it != shared_.end()) {
      shared = std::move(it->second);
      shared_.erase(it);
    }
  }
  if (!shared) std::free(data);
  (tier == Tier::kDevice ? device_allocated_ : host_allocated_).fetch_sub(bytes, std::memory_order_relaxed);
}

void CpuBackend::do_copy(void* dst, const void* src, size_t bytes) { detail::host_copy(dst, src, bytes, threads()); }

void CpuBackend::do_convert(void* dst, DType dst_type, const void* src, DType src_type, size_t n) {
  detail::host_convert(dst, dst_type, src, src_type, n, threads());
}

void CpuBackend::do_accumulate(void* dst, const void* src, DType dtype, size_t n) {
  detail::host_accumulate(dst, src, dtype, n, threads());
}

void CpuBackend::do_fill_zero(void* dst, size_t bytes) { detail::host_fill_zero(dst, bytes, threads()); }

void CpuBackend::do_fill(float* dst, float value, size_t n) { detail::host_fill(dst, value, n, threads()); }

}  // namespace zs::memory
