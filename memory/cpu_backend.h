// The CPU backend: kDevice and kHost are both host RAM; kDevice is capped at a configured capacity
// (`"device": {"memory_mb": N}`) so that a CPU run shows the memory pressure a device would have.
//
//   CpuBackend backend(64 << 20);                            // a 64 MiB "device"
//   Segment s = backend.allocate(4 << 20, Tier::kDevice);
//
// Segments are page-aligned and come straight from the OS for large sizes (so an unused part of a
// large segment costs no physical memory). Operations are synchronous host loops (memory/detail/
// host_ops.h) on up to threads() threads, and synchronize() returns at once. Thread-safe.
// With `shared_device`, kDevice segments are SharedMappings (memory/shared_mapping.h) that the other
// ranks of a node can map: the direct shared-memory collectives read them (comm/shared_arena.h).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>

#include "memory/backend.h"
#include "memory/shared_mapping.h"

namespace zs::memory {

class CpuBackend final : public Backend {
 public:
  // `host_capacity_bytes` 0 means the machine's physical memory.
  explicit CpuBackend(size_t device_capacity_bytes, size_t host_capacity_bytes = 0, bool shared_device = false);

  std::string_view name() const override { return "cpu"; }
  size_t capacity(Tier tier) const override;
  size_t allocated(Tier tier) const override;
  Segment allocate(size_t bytes, Tier tier) override;
  const SharedMapping* shared_mapping(const void* segment_data) const override;
  void synchronize() override {}

 protected:
  void free_segment(void* data, size_t bytes, Tier tier) noexcept override;
  void do_copy(void* dst, const void* src, size_t bytes) override;
  void do_convert(void* dst, DType dst_type, const void* src, DType src_type, size_t n) override;
  void do_accumulate(void* dst, const void* src, DType dtype, size_t n) override;
  void do_fill_zero(void* dst, size_t bytes) override;
  void do_fill(float* dst, float value, size_t n) override;

 private:
  std::atomic<size_t>& allocated_ref(Tier tier);

  size_t device_capacity_;
  size_t host_capacity_;
  std::atomic<size_t> device_allocated_{0};
  std::atomic<size_t> host_allocated_{0};
  bool shared_device_ = false;
  mutable std::mutex shared_mu_;  // guards shared_
  std::map<const void*, std::unique_ptr<SharedMapping>> shared_;  // live shared segments by address
};

}  // namespace zs::memory
