#include "memory/guarded_backend.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/errors.h"
#include "memory/detail/host_ops.h"

namespace zs::memory {
namespace {

using detail::kPage;
using detail::page_round;

// Note [guard fault handler]
// A fault in an engine view must say what happened instead of a bare "Segmentation fault". The
// handler is process-wide (signals are), so the guarded ranges live in a fixed table of atomics the
// handler can read without locks; a fault elsewhere is handed to the previous handler.
constexpr size_t kMaxGuarded = 64;
struct GuardedRange {
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
};
std::array<GuardedRange, kMaxGuarded> g_ranges;
struct sigaction g_previous {};
std::once_flag g_install_once;

void on_fault(int sig, siginfo_t* info, void* uctx) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (const GuardedRange& r : g_ranges) {
    const uintptr_t b = r.begin.load(std::memory_order_acquire), e = r.end.load(std::memory_order_acquire);
    if (b != 0 && addr >= b && addr < e) {
      char msg[400];
      const int n = std::snprintf(msg, sizeof msg,
                                  "guarded backend: host code touched device memory at %p (byte %zu of a device "
                                  "segment) outside a backend operation or DeviceAccess scope: device memory is "
                                  "reached only through memory::Backend (docs/design.md, \"Device backends\")\n",
                                  info->si_addr, static_cast<size_t>(addr - b));
      if (n > 0) (void)!::write(STDERR_FILENO, msg, static_cast<size_t>(n));
      std::abort();
    }
  }
  // Not ours: the previous disposition.
  ::sigaction(SIGSEGV, &g_previous, nullptr);
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction != nullptr) g_previous.sa_sigaction(sig, info, uctx);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  }
  // SIG_DFL: returning re-executes the faulting access, which now takes the default action.
}

void install_handler() {
  std::call_once(g_install_once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGSEGV, &sa, &g_previous);
  });
}

void register_range(char* begin, size_t bytes) {
  for (GuardedRange& r : g_ranges) {
    uintptr_t expected = 0;
    if (r.begin.load() == 0 && r.end.compare_exchange_strong(expected, reinterpret_cast<uintptr_t>(begin) + bytes)) {
      r.begin.store(reinterpret_cast<uintptr_t>(begin), std::memory_order_release);
      return;
    }
  }
  // A full table only loses the message, not the protection.
}

void unregister_range(char* begin) {
  for (GuardedRange& r : g_ranges) {
    if (r.begin.load() == reinterpret_cast<uintptr_t>(begin)) {
      r.begin.store(0, std::memory_order_release);
      r.end.store(0, std::memory_order_release);
      return;
    }
  }
}

}  // namespace

GuardedBackend::GuardedBackend(size_t device_capacity_bytes) : device_capacity_(device_capacity_bytes) {
  install_handler();
}

GuardedBackend::~GuardedBackend() {
  ZS_ASSERT(mappings_.empty(), "guarded backend destroyed with {} live device segments", mappings_.size());
}

size_t GuardedBackend::capacity(Tier tier) const {
  if (tier == Tier::kDevice) return device_capacity_;
  if (tier == Tier::kHost) return static_cast<size_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(::sysconf(_SC_PAGE_SIZE));
  return 0;
}

size_t GuardedBackend::allocated(Tier tier) const {
  std::lock_guard lock(mu_);
  return tier == Tier::kDevice ? device_allocated_ : tier == Tier::kHost ? host_allocated_ : 0;
}

Segment GuardedBackend::allocate(size_t bytes, Tier tier) {
  ZS_ASSERT(bytes > 0, "guarded backend: zero-byte segment requested");
  ZS_ASSERT(tier != Tier::kNvme, "the guarded backend does not serve the nvme tier (the offload module does)");
  std::lock_guard lock(mu_);
  if (tier == Tier::kHost) {
    void* p = std::aligned_alloc(kPage, page_round(bytes));
    if (p == nullptr) throw OutOfMemoryError(fmt::format("guarded backend: the OS refused a host segment of {} bytes", bytes));
    host_allocated_ += bytes;
    return make_segment(p, bytes, tier);
  }
  if (device_allocated_ + bytes > device_capacity_) {
    throw OutOfMemoryError(fmt::format("guarded backend: a device segment of {} bytes does not fit: {} of {} bytes "
                                       "already held. Fix: raise device.memory_mb",
                                       bytes, device_allocated_, device_capacity_));
  }
  const size_t mapped = page_round(bytes);
  const int fd = ::memfd_create("zeroshard-guarded-device", MFD_CLOEXEC);
  if (fd < 0) throw OutOfMemoryError(fmt::format("guarded backend: memfd_create failed: {}", std::strerror(errno)));
  DeviceMapping m{.mapped = mapped, .bytes = bytes};
  bool ok = ::ftruncate(fd, static_cast<off_t>(mapped)) == 0;
  if (ok) {
    void* priv = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    void* eng = ::mmap(nullptr, mapped, depth_ > 0 ? PROT_READ | PROT_WRITE : PROT_NONE, MAP_SHARED, fd, 0);
    if (priv != MAP_FAILED) m.private_view = static_cast<char*>(priv);
    if (eng != MAP_FAILED) m.engine_view = static_cast<char*>(eng);
    ok = m.private_view != nullptr && m.engine_view != nullptr;
  }
  const int err = errno;
  ::close(fd);  // the mappings keep the object alive
  if (!ok) {
    if (m.private_view != nullptr) ::munmap(m.private_view, mapped);
    if (m.engine_view != nullptr) ::munmap(m.engine_view, mapped);
    throw OutOfMemoryError(fmt::format("guarded backend: mapping a device segment of {} bytes failed: {}", bytes, std::strerror(err)));
  }
  register_range(m.engine_view, mapped);
  mappings_.push_back(m);
  device_allocated_ += bytes;
  return make_segment(m.engine_view, bytes, tier);
}

void GuardedBackend::free_segment(void* data, size_t bytes, Tier tier) noexcept {
  std::lock_guard lock(mu_);
  if (tier == Tier::kHost) {
    std::free(data);
    host_allocated_ -= bytes;
    return;
  }
  for (auto it = mappings_.begin(); it != mappings_.end(); ++it) {
    if (it->engine_view != data) continue;
    unregister_range(it->engine_view);
    ::munmap(it->engine_view, it->mapped);
    ::munmap(it->private_view, it->mapped);
    device_allocated_ -= it->bytes;
    mappings_.erase(it);
    return;
  }
}

void GuardedBackend::protect(const DeviceMapping& m, bool accessible) const {
  ZS_ASSERT(::mprotect(m.engine_view, m.mapped, accessible ? PROT_READ | PROT_WRITE : PROT_NONE) == 0,
            "guarded backend: mprotect failed: {}", std::strerror(errno));
}

void GuardedBackend::begin_device_access() {
  std::lock_guard lock(mu_);
  if (depth_++ == 0) {
    for (const auto& m : mappings_) protect(m, true);
  }
}

void GuardedBackend::end_device_access() noexcept {
  std::lock_guard lock(mu_);
  if (--depth_ == 0) {
    for (const auto& m : mappings_) ::mprotect(m.engine_view, m.mapped, PROT_NONE);
  }
}

bool GuardedBackend::accessible() const {
  std::lock_guard lock(mu_);
  return depth_ > 0;
}

void* GuardedBackend::translate(const void* p) const {
  const char* c = static_cast<const char*>(p);
  std::lock_guard lock(mu_);
  for (const auto& m : mappings_) {
    if (c >= m.engine_view && c < m.engine_view + m.mapped) return m.private_view + (c - m.engine_view);
  }
  return const_cast<void*>(p);
}

void GuardedBackend::do_copy(void* dst, const void* src, size_t bytes) {
  detail::host_copy(translate(dst), translate(src), bytes, threads());
}

void GuardedBackend::do_convert(void* dst, DType dst_type, const void* src, DType src_type, size_t n) {
  detail::host_convert(translate(dst), dst_type, translate(src), src_type, n, threads());
}

void GuardedBackend::do_accumulate(void* dst, const void* src, DType dtype, size_t n) {
  detail::host_accumulate(translate(dst), translate(src), dtype, n, threads());
}

void GuardedBackend::do_fill_zero(void* dst, size_t bytes) { detail::host_fill_zero(translate(dst), bytes, threads()); }

void GuardedBackend::do_fill(float* dst, float value, size_t n) {
  detail::host_fill(static_cast<float*>(translate(dst)), value, n, threads());
}

}  // namespace zs::memory
