#include "memory/tracker.h"

#include <algorithm>
#include <utility>

#include "core/errors.h"

namespace zs::memory {

boost::json::object MemorySnapshot::to_json() const {
  boost::json::object out;
  for (Tier t : kAllTiers) {
    auto ti = static_cast<size_t>(t);
    boost::json::object cur, pk, at_pk;
    for (Category c : kAllCategories) {
      auto ci = static_cast<size_t>(c);
      cur[category_name(c)] = current[ci][ti];
      pk[category_name(c)] = peak[ci][ti];
      at_pk[category_name(c)] = at_tier_peak[ti][ci];
    }
    boost::json::object tier;
    tier["current"] = std::move(cur);
    tier["peak"] = std::move(pk);
    tier["at_peak"] = std::move(at_pk);
    tier["total_current"] = tier_current[ti];
    tier["total_peak"] = tier_peak[ti];
    out[tier_name(t)] = std::move(tier);
  }
  return out;
}

void MemoryTracker::add(Category c, Tier t, size_t bytes) {
  auto ci = static_cast<size_t>(c);
  auto ti = static_cast<size_t>(t);
  std::lock_guard lock(mu_);
  size_t& cur = s_.current[ci][ti];
  cur += bytes;
  s_.peak[ci][ti] = std::max(s_.peak[ci][ti], cur);
  s_.tier_current[ti] += bytes;
  if (s_.tier_current[ti] > s_.tier_peak[ti]) {
    s_.tier_peak[ti] = s_.tier_current[ti];
    for (size_t k = 0; k < kNumCategories; ++k) s_.at_tier_peak[ti][k] = s_.current[k][ti];
  }
  s_.category_current[ci] += bytes;
  s_.category_peak[ci] = std::max(s_.category_peak[ci], s_.category_current[ci]);
}

void MemoryTracker::sub(Category c, Tier t, size_t bytes) {
  auto ci = static_cast<size_t>(c);
  auto ti = static_cast<size_t>(t);
  std::lock_guard lock(mu_);
  size_t& cur = s_.current[ci][ti];
  ZS_ASSERT(cur >= bytes, "memory tracker: releasing {} bytes of {} on {} but only {} are counted", bytes,
            category_name(c), tier_name(t), cur);
  cur -= bytes;
  s_.tier_current[ti] -= bytes;
  s_.category_current[ci] -= bytes;
}

size_t MemoryTracker::current(Category c, Tier t) const {
  std::lock_guard lock(mu_);
  return s_.at(c, t);
}

size_t MemoryTracker::peak(Category c, Tier t) const {
  std::lock_guard lock(mu_);
  return s_.peak_at(c, t);
}

size_t MemoryTracker::tier_current(Tier t) const {
  std::lock_guard lock(mu_);
  return s_.tier_current[static_cast<size_t>(t)];
}

size_t MemoryTracker::tier_peak(Tier t) const {
  std::lock_guard lock(mu_);
  return s_.tier_peak[static_cast<size_t>(t)];
}

size_t MemoryTracker::at_tier_peak(Category c, Tier t) const {
  std::lock_guard lock(mu_);
  return s_.at_tier_peak[static_cast<size_t>(t)][static_cast<size_t>(c)];
}

size_t MemoryTracker::category_current(Category c) const {
  std::lock_guard lock(mu_);
  return s_.category_current[static_cast<size_t>(c)];
}

size_t MemoryTracker::category_peak(Category c) const {
  std::lock_guard lock(mu_);
  return s_.category_peak[static_cast<size_t>(c)];
}

MemorySnapshot MemoryTracker::snapshot() const {
  std::lock_guard lock(mu_);
  return s_;
}

void MemoryTracker::reset_peaks() {
  std::lock_guard lock(mu_);
  s_.peak = s_.current;
  s_.tier_peak = s_.tier_current;
  for (size_t t = 0; t < kNumTiers; ++t) {
    for (size_t k = 0; k < kNumCategories; ++k) s_.at_tier_peak[t][k] = s_.current[k][t];
  }
  s_.category_peak = s_.category_current;
}

TrackedBytes::TrackedBytes(MemoryTracker* tracker, Category c, Tier t, size_t bytes)
    : tracker_(tracker), category_(c), tier_(t), bytes_(bytes) {
  if (tracker_ != nullptr) tracker_->add(c, t, bytes);
}

TrackedBytes::TrackedBytes(TrackedBytes&& other) noexcept
    : tracker_(std::exchange(other.tracker_, nullptr)),
      category_(other.category_),
      tier_(other.tier_),
      bytes_(std::exchange(other.bytes_, 0)) {}

TrackedBytes& TrackedBytes::operator=(TrackedBytes&& other) noexcept {
  if (this != &other) {
    reset();
    tracker_ = std::exchange(other.tracker_, nullptr);
    category_ = other.category_;
    tier_ = other.tier_;
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void TrackedBytes::reset() {
  if (tracker_ != nullptr) tracker_->sub(category_, tier_, bytes_);
  tracker_ = nullptr;
  bytes_ = 0;
}

}  // namespace zs::memory
