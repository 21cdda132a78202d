#include "memory/alloc_policy.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/errors.h"

namespace zs::memory {

std::string_view lifetime_name(Lifetime l) {
  switch (l) {
    case Lifetime::kPersistent: return "persistent";
    case Lifetime::kTransient: return "transient";
    case Lifetime::kSaved: return "saved";
    case Lifetime::kSpanning: return "spanning";
  }
  return "?";
}

namespace detail {

void PoolRegion::add_hole(size_t offset, size_t size) { holes_.insert(key(offset, size)); }

std::optional<size_t> PoolRegion::take_hole(size_t size) {
  auto it = holes_.lower_bound({size, 0});
  if (it == holes_.end()) return std::nullopt;
  size_t hole_size = it->first;
  size_t offset = key_offset(*it);
  holes_.erase(it);
  Block& hole = blocks_.at(offset);
  // The block takes the hole's end nearest the pool's base (Note [Two-ended pools]); the rest stays
  // free on the gap's side of it.
  if (hole_size != size) {
    if (grows_up_) {
      hole.size = size;
      hole.free = false;
      blocks_.emplace(offset + size, Block{hole_size - size, true});
      add_hole(offset + size, hole_size - size);
    } else {
      hole.size = hole_size - size;
      add_hole(offset, hole_size - size);
      offset += hole_size - size;
      blocks_.emplace(offset, Block{size, false});
    }
  } else {
    hole.free = false;
  }
  allocated_ += size;
  ++live_;
  ++allocs_;
  return offset;
}

std::optional<size_t> PoolRegion::take_deepest_hole(size_t size) {
  auto fits = [&](const auto& entry) { return entry.second.free && entry.second.size >= size; };
  // Blocks tile the region from the base: the low end for the low pool, the high end for the high one.
  std::map<size_t, Block>::iterator it;
  if (grows_up_) {
    it = std::find_if(blocks_.begin(), blocks_.end(), fits);
  } else {
    auto r = std::find_if(blocks_.rbegin(), blocks_.rend(), fits);
    it = r == blocks_.rend() ? blocks_.end() : std::prev(r.base());
  }
  if (it == blocks_.end()) return std::nullopt;
  size_t offset = it->first;
  const size_t hole_size = it->second.size;
  holes_.erase(key(offset, hole_size));
  if (hole_size == size) {
    it->second.free = false;
  } else if (grows_up_) {
    // The gap is above: the block takes the hole's top, the rest stays free below it.
    it->second.size = hole_size - size;
    add_hole(offset, hole_size - size);
    offset += hole_size - size;
    blocks_.emplace(offset, Block{size, false});
  } else {
    it->second.size = size;
    it->second.free = false;
    blocks_.emplace(offset + size, Block{hole_size - size, true});
    add_hole(offset + size, hole_size - size);
  }
  allocated_ += size;
  ++live_;
  ++allocs_;
  return offset;
}

size_t PoolRegion::take_from_gap(size_t size) {
  size_t offset;
  if (grows_up_) {
    offset = edge_;
    edge_ += size;
  } else {
    edge_ -= size;
    offset = edge_;
  }
  blocks_.emplace(offset, Block{size, false});
  allocated_ += size;
  ++live_;
  ++allocs_;
  return offset;
}

bool PoolRegion::owns(size_t offset) const { return grows_up_ ? offset >= base_ && offset < edge_ : offset >= edge_ && offset < base_; }

bool PoolRegion::release(size_t offset) {
  auto it = blocks_.find(offset);
  if (it == blocks_.end() || it->second.free) return false;
  it->second.free = true;
  allocated_ -= it->second.size;
  --live_;
  ++frees_;
  // Coalesce with the free neighbours (blocks tile the region, so map neighbours are adjacent).
  auto next = std::next(it);
  if (next != blocks_.end() && next->second.free) {
    holes_.erase(key(next->first, next->second.size));
    it->second.size += next->second.size;
    blocks_.erase(next);
  }
  if (it != blocks_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.free) {
      holes_.erase(key(prev->first, prev->second.size));
      prev->second.size += it->second.size;
      blocks_.erase(it);
      it = prev;
    }
  }
  // A hole touching the gap goes back to the gap, so the shared gap is as large as it can be.
  size_t hole_offset = it->first;
  size_t hole_size = it->second.size;
  if (grows_up_ && hole_offset + hole_size == edge_) {
    edge_ = hole_offset;
    blocks_.erase(it);
  } else if (!grows_up_ && hole_offset == edge_) {
    edge_ += hole_size;
    blocks_.erase(it);
  } else {
    add_hole(hole_offset, hole_size);
  }
  return true;
}

void PoolRegion::note_change() {
  peak_allocated_ = std::max(peak_allocated_, allocated_);
  peak_reserved_ = std::max(peak_reserved_, region_bytes());
}

PoolStats PoolRegion::stats() const {
  PoolStats s;
  s.allocated_bytes = allocated_;
  s.reserved_bytes = region_bytes();
  s.peak_allocated_bytes = peak_allocated_;
  s.peak_reserved_bytes = peak_reserved_;
  s.free_bytes = region_bytes() - allocated_;
  s.largest_free_bytes = holes_.empty() ? 0 : holes_.rbegin()->first;
  s.live_blocks = live_;
  s.free_blocks = holes_.size();
  s.alloc_count = allocs_;
  s.free_count = frees_;
  s.failed_count = failed_;
  return s;
}

std::string PoolRegion::check_invariants(std::string_view pool_name) const {
  size_t expected = grows_up_ ? base_ : edge_;
  size_t end = grows_up_ ? edge_ : base_;
  size_t allocated = 0, live = 0, holes = 0;
  bool prev_free = false;
  for (const auto& [offset, b] : blocks_) {
    if (offset != expected) {
      return fmt::format("{} pool: block at {} but the previous one ends at {} (gap or overlap)", pool_name, offset,
                         expected);
    }
    if (b.size == 0 || offset % kAllocAlignment != 0 || b.size % kAllocAlignment != 0) {
      return fmt::format("{} pool: block at {} of {} bytes is empty or not {}-byte aligned", pool_name, offset, b.size,
                         kAllocAlignment);
    }
    if (b.free) {
      if (prev_free) return fmt::format("{} pool: free blocks at {} and before it are not coalesced", pool_name, offset);
      if (!holes_.contains(key(offset, b.size))) {
        return fmt::format("{} pool: free block at {} ({} bytes) missing from the free index", pool_name, offset, b.size);
      }
      ++holes;
    } else {
      allocated += b.size;
      ++live;
    }
    prev_free = b.free;
    expected = offset + b.size;
  }
  if (expected != end) return fmt::format("{} pool: blocks end at {} but the region ends at {}", pool_name, expected, end);
  if (!blocks_.empty()) {
    const Block& at_gap = grows_up_ ? blocks_.rbegin()->second : blocks_.begin()->second;
    if (at_gap.free) return fmt::format("{} pool: a free block touches the gap and was not given back", pool_name);
  }
  if (holes != holes_.size()) return fmt::format("{} pool: {} free blocks but {} index entries", pool_name, holes, holes_.size());
  if (allocated != allocated_ || live != live_) {
    return fmt::format("{} pool: blocks sum to {} bytes in {} blocks, stats say {} bytes in {}", pool_name, allocated, live,
                       allocated_, live_);
  }
  if (peak_allocated_ < allocated_ || peak_reserved_ < region_bytes()) {
    return fmt::format("{} pool: a peak is below the current value", pool_name);
  }
  return {};
}

}  // namespace detail

namespace {

double fragmentation_of(size_t largest_free, size_t free) {
  return free == 0 ? 0.0 : 1.0 - static_cast<double>(largest_free) / static_cast<double>(free);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// TwoEndedBestFit

TwoEndedBestFit::TwoEndedBestFit(size_t capacity_bytes)
    : capacity_(capacity_bytes / kAllocAlignment * kAllocAlignment),  // the high end must stay aligned
      persistent_(0, true),
      transient_(capacity_, false) {}

std::optional<size_t> TwoEndedBestFit::allocate(size_t bytes, Lifetime lifetime) {
  ZS_ASSERT(bytes > 0, "zero-byte block requested from the {} pool", lifetime_name(lifetime));
  detail::PoolRegion& pool = pool_of(lifetime) == Lifetime::kPersistent ? persistent_ : transient_;
  size_t size = align_up(bytes);
  if (size < bytes || size > capacity_) [[unlikely]] {
    pool.note_failure();
    return std::nullopt;
  }
  std::optional<size_t> offset = lifetime == Lifetime::kSpanning ? pool.take_deepest_hole(size) : pool.take_hole(size);
  if (!offset) {
    if (transient_.edge() - persistent_.edge() < size) {
      pool.note_failure();
      return std::nullopt;
    }
    offset = pool.take_from_gap(size);
  }
  pool.note_change();
  note_totals();
  return offset;
}

void TwoEndedBestFit::free(size_t offset) {
  bool ok = persistent_.owns(offset) ? persistent_.release(offset) : transient_.release(offset);
  ZS_ASSERT(ok, "free of offset {}: no live block starts there (double free?)", offset);
}

void TwoEndedBestFit::note_totals() {
  peak_allocated_ = std::max(peak_allocated_, persistent_.allocated_bytes() + transient_.allocated_bytes());
  peak_reserved_ = std::max(peak_reserved_, persistent_.region_bytes() + transient_.region_bytes());
}

ArenaStats TwoEndedBestFit::stats() const {
  ArenaStats s;
  s.capacity_bytes = capacity_;
  s.persistent = persistent_.stats();
  s.transient = transient_.stats();
  s.allocated_bytes = s.persistent.allocated_bytes + s.transient.allocated_bytes;
  s.reserved_bytes = s.persistent.reserved_bytes + s.transient.reserved_bytes;
  s.peak_allocated_bytes = peak_allocated_;
  s.peak_reserved_bytes = peak_reserved_;
  s.free_bytes = capacity_ - s.allocated_bytes;
  size_t gap = transient_.edge() - persistent_.edge();
  s.largest_free_bytes = std::max({gap, s.persistent.largest_free_bytes, s.transient.largest_free_bytes});
  s.fragmentation = fragmentation_of(s.largest_free_bytes, s.free_bytes);
  return s;
}

std::string TwoEndedBestFit::check_invariants() const {
  if (persistent_.edge() > transient_.edge()) {
    return fmt::format("persistent region ends at {} above the transient region start {}", persistent_.edge(),
                       transient_.edge());
  }
  std::string err = persistent_.check_invariants("persistent");
  if (err.empty()) err = transient_.check_invariants("transient");
  if (err.empty() && (peak_allocated_ < persistent_.allocated_bytes() + transient_.allocated_bytes() ||
                      peak_reserved_ < persistent_.region_bytes() + transient_.region_bytes())) {
    err = "arena peak below the current value";
  }
  return err;
}

// ---------------------------------------------------------------------------------------------
// SinglePoolBestFit

SinglePoolBestFit::SinglePoolBestFit(size_t capacity_bytes)
    : capacity_(capacity_bytes / kAllocAlignment * kAllocAlignment), pool_(0, true) {}

std::optional<size_t> SinglePoolBestFit::allocate(size_t bytes, Lifetime lifetime) {
  ZS_ASSERT(bytes > 0, "zero-byte block requested");
  PoolStats& by = by_lifetime_[static_cast<int>(pool_of(lifetime))];
  size_t size = align_up(bytes);
  std::optional<size_t> offset;
  if (size >= bytes && size <= capacity_) {
    offset = pool_.take_hole(size);
    if (!offset && capacity_ - pool_.edge() >= size) offset = pool_.take_from_gap(size);
  }
  if (!offset) {
    pool_.note_failure();
    ++by.failed_count;
    return std::nullopt;
  }
  pool_.note_change();
  lifetimes_.emplace(*offset, std::pair{size, lifetime});
  by.allocated_bytes += size;
  by.peak_allocated_bytes = std::max(by.peak_allocated_bytes, by.allocated_bytes);
  ++by.live_blocks;
  ++by.alloc_count;
  peak_allocated_ = std::max(peak_allocated_, pool_.allocated_bytes());
  return offset;
}

void SinglePoolBestFit::free(size_t offset) {
  auto it = lifetimes_.find(offset);
  ZS_ASSERT(it != lifetimes_.end(), "free of offset {}: no live block starts there (double free?)", offset);
  bool released = pool_.release(offset);
  ZS_ASSERT(released, "free of offset {}: the block index and the pool disagree", offset);
  PoolStats& by = by_lifetime_[static_cast<int>(pool_of(it->second.second))];
  by.allocated_bytes -= it->second.first;
  --by.live_blocks;
  ++by.free_count;
  lifetimes_.erase(it);
}

ArenaStats SinglePoolBestFit::stats() const {
  ArenaStats s;
  PoolStats region = pool_.stats();
  s.capacity_bytes = capacity_;
  s.persistent = by_lifetime_[0];
  s.persistent.reserved_bytes = region.reserved_bytes;
  s.persistent.peak_reserved_bytes = region.peak_reserved_bytes;
  s.persistent.free_bytes = region.free_bytes;
  s.persistent.largest_free_bytes = region.largest_free_bytes;
  s.persistent.free_blocks = region.free_blocks;
  s.transient = by_lifetime_[1];
  s.allocated_bytes = region.allocated_bytes;
  s.reserved_bytes = region.reserved_bytes;
  s.peak_allocated_bytes = peak_allocated_;
  s.peak_reserved_bytes = region.peak_reserved_bytes;
  s.free_bytes = capacity_ - s.allocated_bytes;
  s.largest_free_bytes = std::max(capacity_ - pool_.edge(), region.largest_free_bytes);
  s.fragmentation = fragmentation_of(s.largest_free_bytes, s.free_bytes);
  return s;
}

std::string SinglePoolBestFit::check_invariants() const {
  std::string err = pool_.check_invariants("single");
  if (!err.empty()) return err;
  size_t sums[2] = {0, 0};
  for (const auto& [offset, v] : lifetimes_) sums[static_cast<int>(pool_of(v.second))] += v.first;
  if (sums[0] != by_lifetime_[0].allocated_bytes || sums[1] != by_lifetime_[1].allocated_bytes ||
      sums[0] + sums[1] != pool_.allocated_bytes()) {
    return "single pool: per-lifetime sums disagree with the blocks";
  }
  return {};
}

}  // namespace zs::memory
