// GuardedBackend: the cpu backend with a tripwire. Device memory is a shared-memory object mapped
// twice: the engine's addresses (what allocate() returns) and a private view the backend's own
// operations use. Outside DeviceAccess scopes the engine's mapping is PROT_NONE, so host code that
// reads or writes device memory without going through the backend (a memcpy into a parameter
// between steps, a stray pointer) faults at once, and the fault handler names the address, the
// segment offset and the rule before the process aborts. That is what a GPU does to host code that
// dereferences a device pointer, made visible on a CPU: the test that runs the engine over this
// backend proves the seam (every device access is a backend operation or inside a kernel scope).
//
//   "device": {"memory_mb": 64, "backend": "guarded"}    // or GuardedBackend backend(64 << 20);
//
// Same results as the cpu backend, bit for bit. Slower: each scope boundary is an mprotect. For tests
// and debugging; mprotect is process-wide, so access is granted to every thread during a scope.
// Thread-safety: as Backend.
#pragma once

#include <mutex>
#include <vector>

#include "memory/backend.h"

namespace zs::memory {

class GuardedBackend final : public Backend {
 public:
  explicit GuardedBackend(size_t device_capacity_bytes);
  ~GuardedBackend() override;

  std::string_view name() const override { return "guarded"; }
  size_t capacity(Tier tier) const override;
  size_t allocated(Tier tier) const override;
  Segment allocate(size_t bytes, Tier tier) override;
  void synchronize() override {}
  void begin_device_access() override;
  void end_device_access() noexcept override;
  // True while host code may touch device memory (inside a scope).
  bool accessible() const;

 protected:
  void free_segment(void* data, size_t bytes, Tier tier) noexcept override;
  void do_copy(void* dst, const void* src, size_t bytes) override;
  void do_convert(void* dst, DType dst_type, const void* src, DType src_type, size_t n) override;
  void do_accumulate(void* dst, const void* src, DType dtype, size_t n) override;
  void do_fill_zero(void* dst, size_t bytes) override;
  void do_fill(float* dst, float value, size_t n) override;

 private:
  struct DeviceMapping {
    char* engine_view = nullptr;   // returned to callers; PROT_NONE outside scopes
    char* private_view = nullptr;  // always read-write; used by this backend's operations
    size_t mapped = 0;             // bytes of both mappings (page-rounded)
    size_t bytes = 0;              // bytes asked for
  };
  // The private-view address of `p` when it lies in a device mapping, else p.
  void* translate(const void* p) const;
  void protect(const DeviceMapping& m, bool accessible) const;

  size_t device_capacity_;
  size_t device_allocated_ = 0;
  size_t host_allocated_ = 0;
  mutable std::mutex mu_;  // guards the mappings, counters and depth
  std::vector<DeviceMapping> mappings_;
  int depth_ = 0;
};

}  // namespace zs::memory
