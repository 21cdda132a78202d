#include "memory/backend.h"

#include <algorithm>
#include <utility>

#include "core/errors.h"
#include "memory/cpu_backend.h"
#include "memory/guarded_backend.h"

namespace zs::memory {

Segment::Segment(Segment&& other) noexcept
    : backend_(std::exchange(other.backend_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      tier_(other.tier_) {}

Segment& Segment::operator=(Segment&& other) noexcept {
  if (this != &other) {
    reset();
    backend_ = std::exchange(other.backend_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    tier_ = other.tier_;
  }
  return *this;
}

Segment::~Segment() { reset(); }

void Segment::reset() {
  if (data_ != nullptr) backend_->free_segment(data_, size_, tier_);
  backend_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

namespace {

void check_tiers(Tier dst_tier, Tier src_tier, const char* op) {
  ZS_ASSERT(dst_tier != Tier::kNvme && src_tier != Tier::kNvme,
            "backend {} {} -> {}: nvme transfers belong to the offload module", op, tier_name(src_tier), tier_name(dst_tier));
}

}  // namespace

void Backend::count(Tier dst_tier, Tier src_tier, size_t bytes) {
  if (src_tier == Tier::kHost && dst_tier == Tier::kDevice) host_to_device_.fetch_add(bytes, std::memory_order_relaxed);
  if (src_tier == Tier::kDevice && dst_tier == Tier::kHost) device_to_host_.fetch_add(bytes, std::memory_order_relaxed);
}

TransferStats Backend::transfers() const {
  return {host_to_device_.load(std::memory_order_relaxed), device_to_host_.load(std::memory_order_relaxed)};
}

void Backend::copy(void* dst, Tier dst_tier, const void* src, Tier src_tier, size_t bytes) {
  check_tiers(dst_tier, src_tier, "copy");
  if (bytes == 0) return;
  ZS_ASSERT(dst != nullptr && src != nullptr, "backend copy of {} bytes with a null pointer", bytes);
  count(dst_tier, src_tier, bytes);
  do_copy(dst, src, bytes);
}

void Backend::convert(void* dst, Tier dst_tier, DType dst_type, const void* src, Tier src_tier, DType src_type, size_t n) {
  check_tiers(dst_tier, src_tier, "convert");
  if (n == 0) return;
  ZS_ASSERT(dst != nullptr && src != nullptr, "backend convert of {} elements with a null pointer", n);
  // The bytes that cross: a device backend converts on the device side of the transfer, so the
  // narrower side is what moves.
  count(dst_tier, src_tier, n * std::min(dtype_size(dst_type), dtype_size(src_type)));
  do_convert(dst, dst_type, src, src_type, n);
}

void Backend::accumulate(void* dst, Tier dst_tier, const void* src, Tier src_tier, DType dtype, size_t n) {
  check_tiers(dst_tier, src_tier, "accumulate");
  if (n == 0) return;
  ZS_ASSERT(dst != nullptr && src != nullptr, "backend accumulate of {} elements with a null pointer", n);
  ZS_ASSERT(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16, "backend accumulate of {}",
            dtype_name(dtype));
  count(dst_tier, src_tier, n * dtype_size(dtype));
  do_accumulate(dst, src, dtype, n);
}

void Backend::fill_zero(void* dst, Tier tier, size_t bytes) {
  check_tiers(tier, tier, "fill");
  if (bytes == 0) return;
  ZS_ASSERT(dst != nullptr, "backend fill of {} bytes with a null pointer", bytes);
  do_fill_zero(dst, bytes);
}

void Backend::fill(float* dst, Tier tier, float value, size_t n) {
  check_tiers(tier, tier, "fill");
  if (n == 0) return;
  ZS_ASSERT(dst != nullptr, "backend fill of {} elements with a null pointer", n);
  do_fill(dst, value, n);
}

std::unique_ptr<Backend> make_backend(std::string_view name, size_t device_capacity_bytes, bool shared_device) {
  // New backends (cuda/, npu/) register here and in kBackendNames: one line each, nothing in the
  // engine changes.
  if (name == "cpu") return std::make_unique<CpuBackend>(device_capacity_bytes, 0, shared_device);
  if (name == "guarded") return std::make_unique<GuardedBackend>(device_capacity_bytes);
  throw ConfigError(fmt::format("device.backend: unknown backend '{}'; available: \"cpu\", \"guarded\"", name));
}

}  // namespace zs::memory
