// MemoryTracker: bytes by category (params, grads, ...) and tier (device, host, nvme), current and peak.
//
// Every owner of memory reports into one tracker: the DeviceAllocator for its blocks (aligned sizes,
// tier kDevice), host buffers and swap files through TrackedBytes. The run summary and the progress line
// read snapshots; nothing here allocates memory for anyone.
//
//   MemoryTracker tracker;
//   TrackedBytes staging(&tracker, Category::kOffloadBuffers, Tier::kHost, bytes);  // counted while alive
//   size_t peak = tracker.tier_peak(Tier::kDevice);
//
// Peaks: peak(c, t) is the maximum of that one counter; tier_peak(t) is the maximum of the tier's sum
// over categories at any moment (not a sum of the categories' peaks); likewise category_peak(c).
// All values are byte sums. Thread-safety: every method is safe from any thread (one mutex; updates
// happen per allocation, not per element, so contention is negligible).
#pragma once

#include <array>
#include <cstddef>
#include <mutex>

#include <boost/json/object.hpp>

#include "memory/category.h"

namespace zs::memory {

struct MemorySnapshot {
  using Table = std::array<std::array<size_t, kNumTiers>, kNumCategories>;  // [category][tier], bytes
  Table current{};
  Table peak{};
  std::array<size_t, kNumTiers> tier_current{};
  std::array<size_t, kNumTiers> tier_peak{};
  std::array<size_t, kNumCategories> category_current{};  // over all tiers
  std::array<size_t, kNumCategories> category_peak{};
  // What the tier's peak was made of: bytes by category at the moment tier_peak was last raised
  // ([tier][category]; the device arena's peak split into params, grads, activations, ...).
  std::array<std::array<size_t, kNumCategories>, kNumTiers> at_tier_peak{};

  size_t at(Category c, Tier t) const { return current[static_cast<size_t>(c)][static_cast<size_t>(t)]; }
  size_t peak_at(Category c, Tier t) const { return peak[static_cast<size_t>(c)][static_cast<size_t>(t)]; }

  // {"device": {"current": {"params": ..., ...}, "peak": {...}, "total_current": .., "total_peak": ..},
  //  "at_peak": {"params": ..., ...}, "host": {...}, "nvme": {...}}
  boost::json::object to_json() const;
};

class MemoryTracker {
 public:
  MemoryTracker() = default;
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  void add(Category c, Tier t, size_t bytes);
  // InternalError when more is subtracted than was added.
  void sub(Category c, Tier t, size_t bytes);

  size_t current(Category c, Tier t) const;
  size_t peak(Category c, Tier t) const;
  size_t tier_current(Tier t) const;
  size_t tier_peak(Tier t) const;
  // Bytes of category c on tier t at the moment of the tier's peak (see MemorySnapshot::at_tier_peak).
  size_t at_tier_peak(Category c, Tier t) const;
  size_t category_current(Category c) const;
  size_t category_peak(Category c) const;
  MemorySnapshot snapshot() const;
  // Sets every peak to the current value (e.g. after warm-up).
  void reset_peaks();

 private:
  mutable std::mutex mu_;  // guards s_
  MemorySnapshot s_;
};

// RAII: counts `bytes` under (category, tier) from construction to destruction. Move-only.
// A null tracker makes it a no-op. The tracker must outlive it.
class TrackedBytes {
 public:
  TrackedBytes() = default;
  TrackedBytes(MemoryTracker* tracker, Category c, Tier t, size_t bytes);
  TrackedBytes(TrackedBytes&& other) noexcept;
  TrackedBytes& operator=(TrackedBytes&& other) noexcept;
  TrackedBytes(const TrackedBytes&) = delete;
  TrackedBytes& operator=(const TrackedBytes&) = delete;
  ~TrackedBytes() { reset(); }

  size_t bytes() const { return bytes_; }
  void reset();

 private:
  MemoryTracker* tracker_ = nullptr;
  Category category_ = Category::kParams;
  Tier tier_ = Tier::kHost;
  size_t bytes_ = 0;
};

}  // namespace zs::memory
