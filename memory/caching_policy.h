// CachingAllocatorModel: PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp) as an
// AllocatorPolicy, so recorded traces (memory/alloc_trace.h) compare our lifetime pools with what
// PyTorch users run today. A model of its placement rules only: one device, one stream, no events.
//
// Note [Caching allocator rules] (the numbers are PyTorch's constants):
//   - A request is rounded up to a multiple of 512 bytes (at least 512).
//   - Rounded requests of at most 1 MiB go to the small pool, larger ones to the large pool; a block
//     never moves between pools.
//   - Best fit inside the pool: the free block of the smallest size, then lowest address, that holds
//     the request.
//   - No fit: a new segment ("cudaMalloc") of 2 MiB for the small pool, 20 MiB for large requests
//     under 10 MiB, and the request rounded up to 2 MiB for larger ones.
//   - The chosen block is split (the request takes its low end) when the remainder is >= 512 bytes in
//     the small pool, and in the large pool only when the request is below max_split_size and the
//     remainder exceeds 1 MiB; otherwise the request holds the whole block.
//   - A freed block merges with its free neighbours in the same segment; segments are kept cached
//     (no empty_cache()), so reserved bytes only grow - except on a failed segment allocation, where
//     PyTorch frees cached blocks and retries: first oversize blocks (only with max_split_size), then
//     every free block that is a whole segment.
//   - max_split_size (PYTORCH_CUDA_ALLOC_CONF max_split_size_mb, >= 20 MiB; unlimited by default):
//     blocks of at least that size are never split; a request below it never takes such a block, and
//     a request at or above it takes one only when the block exceeds it by less than 20 MiB.
//   - Expandable segments (expandable_segments:True): each pool has one virtual segment (9/8 of the
//     capacity, as PyTorch reserves 9/8 of device memory) mapped on demand in pages of 2 MiB (small
//     pool) or 20 MiB (large pool). Without a fitting free block the request takes the lowest-address
//     run of free and unmapped space that holds it and maps the pages it needs; every pool then
//     splits at a remainder >= 512 bytes, and best fit compares a block's size plus the unmapped space
//     right after it. On a failed map, free pages (whole pages inside free blocks) are unmapped and
//     the request retried.
// Reserved bytes are the segments' bytes (mapped bytes for expandable segments), capped by capacity.
// Offsets returned are virtual addresses (each new segment takes fresh address space), not offsets
// inside [0, capacity); they are only handed back to free().
//
//   CachingAllocatorModel caching(capacity, {.expandable_segments = true});
//   ReplayResult r = replay(trace, caching);
//
// Stats: ArenaStats totals; `allocated_bytes` counts whole blocks (an unsplit remainder included, as
// PyTorch's memory_allocated()); per-lifetime pools carry allocated/live/count fields only.
// Thread-safety: none (a replay model).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "memory/alloc_policy.h"

namespace zs::memory {

struct CachingOptions {
  bool expandable_segments = false;
  // Bytes; PyTorch's max_split_size_mb << 20. Unlimited by default; when set, at least 20 MiB.
  size_t max_split_size = std::numeric_limits<size_t>::max();
};

namespace caching {
inline constexpr size_t kMinBlockSize = 512;            // rounding unit of every request
inline constexpr size_t kSmallSize = size_t{1} << 20;   // largest request of the small pool
inline constexpr size_t kSmallBuffer = size_t{2} << 20; // small pool segment (and its page when expandable)
inline constexpr size_t kLargeBuffer = size_t{20} << 20;// large pool segment for requests under kMinLargeAlloc
inline constexpr size_t kMinLargeAlloc = size_t{10} << 20;
inline constexpr size_t kRoundLarge = size_t{2} << 20;  // larger segments are rounded to this

size_t round_size(size_t bytes);         // to a multiple of kMinBlockSize, at least kMinBlockSize
size_t allocation_size(size_t size);     // the segment a rounded request of `size` gets
}  // namespace caching

class CachingAllocatorModel final : public AllocatorPolicy {
 public:
  // ConfigError when max_split_size is set below 20 MiB (PyTorch refuses it too).
  explicit CachingAllocatorModel(size_t capacity_bytes, CachingOptions options = {});
  std::string_view name() const override { return options_.expandable_segments ? "caching_expandable" : "caching"; }
  size_t capacity() const override { return capacity_; }
  std::optional<size_t> allocate(size_t bytes, Lifetime lifetime) override;
  void free(size_t offset) override;
  ArenaStats stats() const override;
  std::string check_invariants() const override;

  size_t segment_count() const { return segments_.size(); }
  // The size of the live or free block at `offset` (0 when none starts there): tests read splits.
  size_t block_size_at(size_t offset) const;

 private:
  enum PoolId : int { kSmall = 0, kLarge = 1 };
  struct Block {
    size_t size = 0;
    size_t segment = 0;  // base address of its segment
    bool allocated = false;
    bool mapped = true;
    Lifetime lifetime = Lifetime::kPersistent;
  };
  struct Segment {
    size_t size = 0;  // bytes of address space
    PoolId pool = kSmall;
    bool expandable = false;
  };
  using BlockIt = std::map<size_t, Block>::iterator;

  std::optional<size_t> find_free_block(PoolId pool, size_t size);
  std::optional<size_t> alloc_segment(PoolId pool, size_t size);
  std::optional<size_t> alloc_expandable(PoolId pool, size_t size);
  std::optional<size_t> find_expandable_run(PoolId pool, size_t size);
  std::optional<size_t> map_block(size_t addr, size_t size);
  bool release_available_cached_blocks(PoolId pool, size_t size);
  void release_cached_blocks();
  void release_segment(size_t base);
  void unmap_free_pages(size_t addr);
  bool should_split(PoolId pool, size_t block_size, size_t size) const;
  // Merges the block at `it` with its same-state neighbours in its segment; returns the merged block.
  BlockIt merge_neighbours(BlockIt it);
  bool same_segment(BlockIt a, BlockIt b) const { return a->second.segment == b->second.segment; }
  size_t expandable_size(size_t addr) const;
  size_t page_size(PoolId pool) const { return pool == kSmall ? caching::kSmallBuffer : caching::kLargeBuffer; }
  void insert_free(BlockIt it);
  void erase_free(BlockIt it);

  size_t capacity_;
  CachingOptions options_;
  size_t next_address_ = 0;                         // fresh address space for the next segment
  std::map<size_t, Segment> segments_;              // base -> segment
  std::map<size_t, Block> blocks_;                  // address -> block; tiles every segment
  std::set<std::pair<size_t, size_t>> free_[2];     // (size, address) of free mapped blocks, per pool
  std::set<size_t> unmapped_[2];                    // addresses of unmapped blocks, per pool
  size_t reserved_ = 0;
  size_t allocated_ = 0;
  size_t peak_reserved_ = 0;
  size_t peak_allocated_ = 0;
  PoolStats by_lifetime_[2];
};

}  // namespace zs::memory
