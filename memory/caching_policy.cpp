#include "memory/caching_policy.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "core/errors.h"

namespace zs::memory {

namespace caching {

size_t round_size(size_t bytes) {
  if (bytes < kMinBlockSize) return kMinBlockSize;
  return (bytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

size_t allocation_size(size_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

}  // namespace caching

using namespace caching;

namespace {

constexpr size_t kUnlimited = std::numeric_limits<size_t>::max();

}  // namespace

CachingAllocatorModel::CachingAllocatorModel(size_t capacity_bytes, CachingOptions options)
    : capacity_(capacity_bytes), options_(options) {
  if (options_.max_split_size != kUnlimited && options_.max_split_size < kLargeBuffer) {
    throw ConfigError(fmt::format("caching allocator model: max_split_size {} bytes is below 20 MiB; PyTorch refuses "
                                  "max_split_size_mb under 20 too: raise it or leave it unset",
                                  options_.max_split_size));
  }
}

void CachingAllocatorModel::insert_free(BlockIt it) {
  PoolId pool = segments_.at(it->second.segment).pool;
  if (it->second.mapped) {
    free_[pool].insert({it->second.size, it->first});
  } else {
    unmapped_[pool].insert(it->first);
  }
}

void CachingAllocatorModel::erase_free(BlockIt it) {
  PoolId pool = segments_.at(it->second.segment).pool;
  if (it->second.mapped) {
    free_[pool].erase({it->second.size, it->first});
  } else {
    unmapped_[pool].erase(it->first);
  }
}

CachingAllocatorModel::BlockIt CachingAllocatorModel::merge_neighbours(BlockIt it) {
  auto mergeable = [&](BlockIt other) {
    return same_segment(it, other) && !other->second.allocated && other->second.mapped == it->second.mapped;
  };
  auto next = std::next(it);
  if (next != blocks_.end() && mergeable(next)) {
    erase_free(next);
    it->second.size += next->second.size;
    blocks_.erase(next);
  }
  if (it != blocks_.begin()) {
    auto prev = std::prev(it);
    if (mergeable(prev)) {
      erase_free(prev);
      prev->second.size += it->second.size;
      blocks_.erase(it);
      it = prev;
    }
  }
  return it;
}

size_t CachingAllocatorModel::expandable_size(size_t addr) const {
  auto it = blocks_.find(addr);
  auto next = std::next(it);
  bool unmapped_after = next != blocks_.end() && next->second.segment == it->second.segment && !next->second.mapped;
  return it->second.size + (unmapped_after ? next->second.size : 0);
}

bool CachingAllocatorModel::should_split(PoolId pool, size_t block_size, size_t size) const {
  size_t remaining = block_size - size;
  if (pool == kSmall || options_.expandable_segments) return remaining >= kMinBlockSize;
  return size < options_.max_split_size && remaining > kSmallSize;
}

std::optional<size_t> CachingAllocatorModel::find_free_block(PoolId pool, size_t size) {
  auto& index = free_[pool];
  auto it = index.lower_bound({size, 0});
  if (it == index.end()) return std::nullopt;
  if (options_.expandable_segments) {
    // Best fit counts the unmapped space a block can grow into (PyTorch's expandable_size).
    for (auto next = std::next(it); next != index.end() && expandable_size(next->second) < expandable_size(it->second);
         ++next) {
      it = next;
    }
  }
  const size_t max_split = options_.max_split_size;
  if (size < max_split && it->first >= max_split) return std::nullopt;  // no oversize block for a small request
  if (size >= max_split && it->first >= size + kLargeBuffer) return std::nullopt;  // only a close fit
  return it->second;
}

std::optional<size_t> CachingAllocatorModel::alloc_segment(PoolId pool, size_t size) {
  size_t bytes = allocation_size(size);
  if (bytes > capacity_ - reserved_) return std::nullopt;
  size_t base = next_address_;
  next_address_ += bytes;
  segments_.emplace(base, Segment{bytes, pool, false});
  auto it = blocks_.emplace(base, Block{bytes, base, false, true}).first;
  insert_free(it);
  reserved_ += bytes;
  return base;
}

std::optional<size_t> CachingAllocatorModel::find_expandable_run(PoolId pool, size_t size) {
  // The lowest-address unmapped block (with the free block right before it) whose run of free and
  // unmapped blocks holds `size`.
  for (size_t addr : unmapped_[pool]) {
    auto c = blocks_.find(addr);
    if (c != blocks_.begin()) {
      auto prev = std::prev(c);
      if (same_segment(prev, c) && !prev->second.allocated) c = prev;
    }
    size_t bytes = 0;
    for (auto b = c; bytes < size && b != blocks_.end() && same_segment(b, c) && !b->second.allocated; ++b) {
      bytes += b->second.size;
    }
    if (bytes >= size) return c->first;
  }
  const size_t page = page_size(pool);
  const size_t virtual_bytes = (capacity_ + capacity_ / 8 + page - 1) / page * page;
  size_t base = next_address_;
  next_address_ += virtual_bytes;
  segments_.emplace(base, Segment{virtual_bytes, pool, true});
  auto it = blocks_.emplace(base, Block{virtual_bytes, base, false, false}).first;
  insert_free(it);
  return base;
}

std::optional<size_t> CachingAllocatorModel::map_block(size_t addr, size_t size) {
  auto it = blocks_.find(addr);
  Block& b = it->second;
  const size_t page = page_size(segments_.at(b.segment).pool);
  const size_t bytes = (size + page - 1) / page * page;  // unmapped blocks start on a page
  ZS_ASSERT(!b.mapped && bytes <= b.size, "map of {} bytes at {}: not an unmapped block that large", bytes, addr);
  if (bytes > capacity_ - reserved_) return std::nullopt;
  erase_free(it);
  if (bytes < b.size) {
    auto rest = blocks_.emplace(addr + bytes, Block{b.size - bytes, b.segment, false, false}).first;
    insert_free(rest);
    b.size = bytes;
  }
  b.mapped = true;
  reserved_ += bytes;
  it = merge_neighbours(it);
  insert_free(it);
  return it->first;
}

std::optional<size_t> CachingAllocatorModel::alloc_expandable(PoolId pool, size_t size) {
  std::optional<size_t> c = find_expandable_run(pool, size);
  auto it = blocks_.find(*c);
  if (!it->second.mapped) {
    c = map_block(*c, std::min(it->second.size, size));
    if (!c) return std::nullopt;
    it = blocks_.find(*c);
  }
  while (it->second.size < size) {  // free mapped block followed by unmapped space: map more of it
    auto next = std::next(it);
    ZS_ASSERT(next != blocks_.end() && same_segment(next, it) && !next->second.mapped,
              "expandable run at {} ends before {} bytes", it->first, size);
    c = map_block(next->first, std::min(size - it->second.size, next->second.size));
    if (!c) return std::nullopt;
    it = blocks_.find(*c);
  }
  return it->first;
}

void CachingAllocatorModel::release_segment(size_t base) {
  const Segment& seg = segments_.at(base);
  auto it = blocks_.find(base);
  ZS_ASSERT(it != blocks_.end() && it->second.size == seg.size && !it->second.allocated,
            "release of segment {} that is not one free block", base);
  if (!seg.expandable) reserved_ -= seg.size;
  erase_free(it);
  blocks_.erase(it);
  segments_.erase(base);
}

void CachingAllocatorModel::unmap_free_pages(size_t addr) {
  auto it = blocks_.find(addr);
  const size_t base = it->second.segment;
  const size_t page = page_size(segments_.at(base).pool);
  const size_t end_addr = addr + it->second.size;
  const size_t begin = base + (addr - base + page - 1) / page * page;
  const size_t end = base + (end_addr - base) / page * page;
  if (begin >= end) return;
  erase_free(it);
  if (begin > addr) {  // the free part before the first whole page stays mapped
    it->second.size = begin - addr;
    insert_free(it);
    it = blocks_.emplace(begin, Block{}).first;
  }
  it->second = Block{end - begin, base, false, false};
  if (end < end_addr) insert_free(blocks_.emplace(end, Block{end_addr - end, base, false, true}).first);
  reserved_ -= end - begin;
  it = merge_neighbours(it);
  insert_free(it);
  if (it->first == base && it->second.size == segments_.at(base).size) release_segment(base);
}

bool CachingAllocatorModel::release_available_cached_blocks(PoolId pool, size_t size) {
  const size_t max_split = options_.max_split_size;
  if (max_split == kUnlimited) return false;
  auto release = [&](size_t addr) {
    const Segment& seg = segments_.at(blocks_.at(addr).segment);
    if (seg.expandable) {
      unmap_free_pages(addr);
    } else if (blocks_.at(addr).size == seg.size) {
      release_segment(addr);
    }
  };
  const size_t key = std::max(size, max_split);
  auto& index = free_[pool];
  auto it = index.lower_bound({key, 0});
  if (it != index.end()) {
    release(it->second);
    return true;
  }
  // No single block is large enough: free oversize blocks, largest first, until `key` bytes are.
  std::vector<std::pair<size_t, size_t>> oversize(index.rbegin(), index.rend());
  size_t released = 0;
  for (const auto& [bytes, addr] : oversize) {
    if (released >= key || bytes < max_split) break;
    released += bytes;
    release(addr);
  }
  return released >= key;
}

void CachingAllocatorModel::release_cached_blocks() {
  std::vector<size_t> cached;
  for (const auto& index : free_) {
    for (const auto& [bytes, addr] : index) cached.push_back(addr);
  }
  for (size_t addr : cached) {
    auto it = blocks_.find(addr);
    const Segment& seg = segments_.at(it->second.segment);
    if (seg.expandable) {
      unmap_free_pages(addr);
    } else if (it->second.size == seg.size) {
      release_segment(addr);
    }
  }
}

std::optional<size_t> CachingAllocatorModel::allocate(size_t bytes, Lifetime lifetime) {
  ZS_ASSERT(bytes > 0, "zero-byte block requested");
  PoolStats& by = by_lifetime_[static_cast<int>(pool_of(lifetime))];
  const size_t size = round_size(bytes);
  const PoolId pool = size <= kSmallSize ? kSmall : kLarge;
  auto grow = [&] { return options_.expandable_segments ? alloc_expandable(pool, size) : alloc_segment(pool, size); };
  std::optional<size_t> addr;
  if (size >= bytes) {
    addr = find_free_block(pool, size);
    if (!addr) addr = grow();
    // PyTorch's out-of-memory path: free cached memory and retry.
    if (!addr && release_available_cached_blocks(pool, size)) addr = grow();
    if (!addr) {
      release_cached_blocks();
      addr = grow();
    }
  }
  if (!addr) {
    ++by.failed_count;
    return std::nullopt;
  }
  auto it = blocks_.find(*addr);
  erase_free(it);
  Block& b = it->second;
  if (should_split(pool, b.size, size)) {  // the request takes the low end
    insert_free(blocks_.emplace(*addr + size, Block{b.size - size, b.segment, false, true}).first);
    b.size = size;
  }
  b.allocated = true;
  b.lifetime = lifetime;
  allocated_ += b.size;
  peak_allocated_ = std::max(peak_allocated_, allocated_);
  peak_reserved_ = std::max(peak_reserved_, reserved_);
  by.allocated_bytes += b.size;
  by.peak_allocated_bytes = std::max(by.peak_allocated_bytes, by.allocated_bytes);
  ++by.live_blocks;
  ++by.alloc_count;
  return *addr;
}

void CachingAllocatorModel::free(size_t offset) {
  auto it = blocks_.find(offset);
  ZS_ASSERT(it != blocks_.end() && it->second.allocated, "free of address {}: no live block starts there", offset);
  Block& b = it->second;
  PoolStats& by = by_lifetime_[static_cast<int>(pool_of(b.lifetime))];
  b.allocated = false;
  allocated_ -= b.size;
  by.allocated_bytes -= b.size;
  --by.live_blocks;
  ++by.free_count;
  insert_free(merge_neighbours(it));
}

size_t CachingAllocatorModel::block_size_at(size_t offset) const {
  auto it = blocks_.find(offset);
  return it == blocks_.end() ? 0 : it->second.size;
}

ArenaStats CachingAllocatorModel::stats() const {
  ArenaStats s;
  s.capacity_bytes = capacity_;
  s.persistent = by_lifetime_[0];
  s.transient = by_lifetime_[1];
  s.allocated_bytes = allocated_;
  s.reserved_bytes = reserved_;
  s.peak_allocated_bytes = peak_allocated_;
  s.peak_reserved_bytes = peak_reserved_;
  s.free_bytes = capacity_ - allocated_;
  size_t largest = capacity_ - reserved_;
  for (const auto& index : free_) {
    if (!index.empty()) largest = std::max(largest, index.rbegin()->first);
  }
  s.largest_free_bytes = largest;
  s.fragmentation = s.free_bytes == 0 ? 0.0 : 1.0 - static_cast<double>(largest) / static_cast<double>(s.free_bytes);
  return s;
}

std::string CachingAllocatorModel::check_invariants() const {
  size_t allocated = 0, reserved = 0, blocks = 0, free_count[2] = {0, 0}, unmapped_count[2] = {0, 0};
  for (const auto& [base, seg] : segments_) {
    const size_t page = page_size(seg.pool);
    size_t expected = base;
    bool prev_free = false, prev_mapped = true;
    for (auto it = blocks_.find(base); it != blocks_.end() && it->second.segment == base; ++it) {
      const auto& [addr, b] = *it;
      ++blocks;
      if (addr != expected) return fmt::format("segment {}: block at {} but the previous one ends at {}", base, addr, expected);
      if (b.size == 0 || b.size % kMinBlockSize != 0) return fmt::format("block at {}: size {} not a multiple of 512", addr, b.size);
      bool is_free = !b.allocated;
      if (is_free && prev_free && b.mapped == prev_mapped) {
        return fmt::format("segment {}: free blocks at {} and before it are not merged", base, addr);
      }
      if (!b.mapped) {
        if (!seg.expandable) return fmt::format("block at {}: unmapped in a segment that is not expandable", addr);
        if (b.allocated) return fmt::format("block at {}: allocated but unmapped", addr);
        if ((addr - base) % page != 0) return fmt::format("unmapped block at {} does not start on a page", addr);
        if (!unmapped_[seg.pool].contains(addr)) return fmt::format("unmapped block at {} missing from its index", addr);
        ++unmapped_count[seg.pool];
      } else {
        if (seg.expandable) reserved += b.size;
        if (b.allocated) {
          allocated += b.size;
        } else {
          if (!free_[seg.pool].contains({b.size, addr})) return fmt::format("free block at {} missing from its index", addr);
          ++free_count[seg.pool];
        }
      }
      prev_free = is_free;
      prev_mapped = b.mapped;
      expected = addr + b.size;
    }
    if (expected != base + seg.size) return fmt::format("segment {}: blocks end at {}, not at its end", base, expected);
    if (!seg.expandable) reserved += seg.size;
  }
  if (blocks != blocks_.size()) return fmt::format("{} blocks outside every segment", blocks_.size() - blocks);
  for (int p = 0; p < 2; ++p) {
    if (free_count[p] != free_[p].size() || unmapped_count[p] != unmapped_[p].size()) {
      return fmt::format("pool {}: indexes hold blocks that are not free", p);
    }
  }
  if (allocated != allocated_ || reserved != reserved_) {
    return fmt::format("blocks sum to {} allocated / {} reserved bytes, stats say {} / {}", allocated, reserved,
                       allocated_, reserved_);
  }
  if (reserved_ > capacity_) return fmt::format("reserved {} bytes above the capacity {}", reserved_, capacity_);
  if (by_lifetime_[0].allocated_bytes + by_lifetime_[1].allocated_bytes != allocated_) {
    return "per-lifetime sums disagree with the blocks";
  }
  return {};
}

}  // namespace zs::memory
