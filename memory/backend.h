// Backend: where the bytes of a memory tier come from, how they move between tiers, and when host
// code may touch device memory.
//
// The engine never calls malloc, memset, memcpy or a device API on device memory itself: it asks a
// Backend for segments (large, page-aligned ranges; the DeviceAllocator carves tensors out of them),
// for the data movement on them (fill, copy, convert, accumulate: every transfer between tiers is
// counted, as a GPU user watches PCIe traffic), and it runs its compute kernels (nn layers, the
// optimizer step, initialisation) inside a DeviceAccess scope. Backends (docs/design.md, "Device
// backends"):
//   cpu        memory/cpu_backend.h: kDevice is a capped region of host RAM.
//   guarded    memory/guarded_backend.h: the cpu backend with device memory mapped inaccessible
//              outside backend operations and access scopes, so a stray host access faults (tests).
//   measuring  memory/measuring_backend.h: hands out addresses without committing memory and skips
//              every operation and kernel: running the engine over it measures the device peak
//              (the memory estimator).
// A CUDA or NPU backend is a new folder implementing this interface plus one line in make_backend(),
// with no change to the engine (in the spirit of ggml's backend interface and flashlight's swappable
// backends).
//
//   auto backend = make_backend("cpu", device_bytes);
//   Segment seg = backend->allocate(1 << 20, Tier::kDevice);   // freed when `seg` goes out of scope
//   backend->copy(seg.data(), Tier::kDevice, host_ptr, Tier::kHost, 1 << 20);   // counted: host -> device
//   backend->fill_zero(seg.data(), Tier::kDevice, 1 << 20);
//   run_kernel(*backend, [&] { my_cpu_kernel(static_cast<float*>(seg.data())); });  // skipped when measuring
//   backend->synchronize();                                     // operations are complete after this
// (tests/docs/usage_snippets_test.cpp compiles and runs the same lines.)
//
// NVMe is not a backend tier: the offload module moves bytes to and from files. A backend serves
// kDevice and kHost; capacity(Tier::kNvme) is 0 and allocating or copying there throws.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "memory/category.h"
#include "memory/dtype.h"

namespace zs::memory {

class Backend;
class SharedMapping;

// A segment of one tier, owned: move-only, returned to its backend on destruction. The backend must
// outlive its segments.
class Segment {
 public:
  Segment() = default;
  Segment(Segment&& other) noexcept;
  Segment& operator=(Segment&& other) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();

  void* data() const { return data_; }
  size_t size() const { return size_; }  // bytes
  Tier tier() const { return tier_; }
  explicit operator bool() const { return data_ != nullptr; }
  // Frees now (no-op when empty).
  void reset();

 private:
  friend class Backend;
  Segment(Backend* backend, void* data, size_t size, Tier tier) : backend_(backend), data_(data), size_(size), tier_(tier) {}

  Backend* backend_ = nullptr;
  void* data_ = nullptr;
  size_t size_ = 0;
  Tier tier_ = Tier::kHost;
};

// Bytes moved between tiers by Backend operations (byte sums since the backend was made).
struct TransferStats {
  uint64_t host_to_device_bytes = 0;
  uint64_t device_to_host_bytes = 0;
  uint64_t total() const { return host_to_device_bytes + device_to_host_bytes; }
};

// Thread-safety: every method may be called from any thread concurrently, except begin/end of a
// DeviceAccess scope, which belong to the one thread that drives the engine.
class Backend {
 public:
  virtual ~Backend() = default;

  // Short name: "cpu".
  virtual std::string_view name() const = 0;
  // Total bytes the tier can hold (live segments included); 0 for a tier this backend does not serve.
  virtual size_t capacity(Tier tier) const = 0;
  // Bytes held by live segments of the tier.
  virtual size_t allocated(Tier tier) const = 0;
  // A segment of `bytes` (> 0), aligned to at least 4096 bytes, contents unspecified. Throws
  // OutOfMemoryError naming the tier, the request and the capacity when it does not fit.
  virtual Segment allocate(size_t bytes, Tier tier) = 0;
  // The shareable mapping behind the live kDevice segment starting at `segment_data`, or null when
  // its memory is private (every backend but a cpu backend made with shared_device).
  virtual const SharedMapping* shared_mapping(const void* segment_data) const {
    static_cast<void>(segment_data);
    return nullptr;
  }

  // ---- Data movement. Pointers lie in memory of the tier named beside them (a segment of this
  // backend, or any host memory for kHost). Operations may run asynchronously on a real device: they
  // are ordered, and complete after synchronize(). Bytes between different tiers are counted.
  // Copies `bytes` from `src` to `dst`; the ranges must not overlap.
  void copy(void* dst, Tier dst_tier, const void* src, Tier src_tier, size_t bytes);
  // n elements of `src_type` at src to `dst_type` at dst (round to nearest even; a copy for equal types).
  void convert(void* dst, Tier dst_tier, DType dst_type, const void* src, Tier src_tier, DType src_type, size_t n);
  // dst[i] += src[i] for n elements of `dtype` (fp32, bf16, fp16), added in fp32 and rounded once.
  void accumulate(void* dst, Tier dst_tier, const void* src, Tier src_tier, DType dtype, size_t n);
  // `bytes` zero bytes at dst.
  void fill_zero(void* dst, Tier tier, size_t bytes);
  // n copies of `value` at dst.
  void fill(float* dst, Tier tier, float value, size_t n);
  // Waits for every operation issued so far (by any thread).
  virtual void synchronize() = 0;
  TransferStats transfers() const;
  // Threads the host-side operations may use (the rank's share of the cores); default 1.
  void set_threads(int threads) { threads_ = threads < 1 ? 1 : threads; }
  int threads() const { return threads_; }

  // ---- Kernels: host code that reads or writes device memory directly (nn layers, the optimizer
  // step, initialisation; a CUDA backend would launch device kernels there instead) runs between
  // begin_device_access() and end_device_access() (DeviceAccess, run_kernel), and only when
  // runs_kernels(); the measuring backend skips them. Scopes nest.
  virtual bool runs_kernels() const { return true; }
  virtual void begin_device_access() {}
  virtual void end_device_access() noexcept {}

 protected:
  // The operations above, after the checks and the transfer count.
  virtual void do_copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void do_convert(void* dst, DType dst_type, const void* src, DType src_type, size_t n) = 0;
  virtual void do_accumulate(void* dst, const void* src, DType dtype, size_t n) = 0;
  virtual void do_fill_zero(void* dst, size_t bytes) = 0;
  virtual void do_fill(float* dst, float value, size_t n) = 0;

  // Wraps memory this backend allocated into an owning Segment.
  Segment make_segment(void* data, size_t bytes, Tier tier) { return Segment(this, data, bytes, tier); }
  // Returns a segment's memory; called once per segment by ~Segment / Segment::reset.
  virtual void free_segment(void* data, size_t bytes, Tier tier) noexcept = 0;

  friend class Segment;

 private:
  void count(Tier dst_tier, Tier src_tier, size_t bytes);

  int threads_ = 1;
  std::atomic<uint64_t> host_to_device_{0};
  std::atomic<uint64_t> device_to_host_{0};
};

// RAII scope in which host code may touch device memory (see Backend). Engine thread only.
class DeviceAccess {
 public:
  explicit DeviceAccess(Backend& backend) : backend_(backend) { backend_.begin_device_access(); }
  ~DeviceAccess() { backend_.end_device_access(); }
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;

 private:
  Backend& backend_;
};

// Runs `kernel` with device access, unless the backend only measures (then it does nothing).
template <typename F>
void run_kernel(Backend& backend, F&& kernel) {
  if (!backend.runs_kernels()) return;
  DeviceAccess access(backend);
  kernel();
}

// The backend named `name`, with `device_capacity_bytes` of kDevice memory. Throws ConfigError
// listing the known names for an unknown one. `shared_device`: kDevice segments in shareable memory
// (memory/shared_mapping.h) where the backend supports it ("cpu"; the others ignore it).
std::unique_ptr<Backend> make_backend(std::string_view name, size_t device_capacity_bytes, bool shared_device = false);

}  // namespace zs::memory
