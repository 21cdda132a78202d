// MeasuringBackend: memory without bytes, for predicting what a run will allocate. Segments are
// reserved address space (MAP_NORESERVE: no physical memory until a page is touched), every
// operation only counts its transfer bytes, and runs_kernels() is false, so code written against
// Backend runs its real allocation logic - the DeviceAllocator, the engine's placement, the ZeRO-3
// gatherer and the gradient reducer - and skips the arithmetic, the way ggml sizes its graph
// allocator by running it on a worst-case graph. The memory estimator (estimate/) runs the engine
// over it.
//
//   MeasuringBackend backend(/*device_capacity_bytes=*/size_t{1} << 40);   // a 1 TiB "device"
//   DeviceAllocator arena(backend, backend.capacity(Tier::kDevice), &tracker);
//   ... run the engine ...; arena.stats().peak_allocated_bytes is the prediction.
//
// Code that touches device memory anyway (a user's loss written as a plain loop) works: the pages it
// touches are committed then, and only those. Thread-safety: as Backend.
#pragma once

#include <atomic>

#include "memory/backend.h"

namespace zs::memory {

class MeasuringBackend final : public Backend {
 public:
  explicit MeasuringBackend(size_t device_capacity_bytes);

  std::string_view name() const override { return "measuring"; }
  size_t capacity(Tier tier) const override;
  size_t allocated(Tier tier) const override;
  Segment allocate(size_t bytes, Tier tier) override;
  void synchronize() override {}
  bool runs_kernels() const override { return false; }

 protected:
  void free_segment(void* data, size_t bytes, Tier tier) noexcept override;
  void do_copy(void*, const void*, size_t) override {}
  void do_convert(void*, DType, const void*, DType, size_t) override {}
  void do_accumulate(void*, const void*, DType, size_t) override {}
  void do_fill_zero(void*, size_t) override {}
  void do_fill(float*, float, size_t) override {}

 private:
  size_t device_capacity_;
  std::atomic<size_t> device_allocated_{0};
  std::atomic<size_t> host_allocated_{0};
};

}  // namespace zs::memory
