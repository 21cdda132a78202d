// The caching-allocator model (memory/caching_policy.h) against hand-worked cases of each of
// PyTorch's rules - rounding, pool choice, segment sizes, best fit, split thresholds, merging,
// max_split_size, the out-of-memory release, expandable segments - and a seeded stress under the
// invariant checker in both modes.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/errors.h"
#include "memory/caching_policy.h"

namespace zs::memory {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kGiB = size_t{1} << 30;
constexpr auto kT = Lifetime::kTransient;

size_t take(CachingAllocatorModel& m, size_t bytes) {
  std::optional<size_t> off = m.allocate(bytes, kT);
  EXPECT_TRUE(off.has_value()) << bytes;
  EXPECT_EQ(m.check_invariants(), "");
  return off.value_or(0);
}

TEST(CachingPolicy, RoundsTo512AndSizesSegmentsByPool) {
  EXPECT_EQ(caching::round_size(1), 512u);
  EXPECT_EQ(caching::round_size(512), 512u);
  EXPECT_EQ(caching::round_size(513), 1024u);
  EXPECT_EQ(caching::allocation_size(kMiB), 2 * kMiB);            // small pool
  EXPECT_EQ(caching::allocation_size(kMiB + 512), 20 * kMiB);     // large, under 10 MiB
  EXPECT_EQ(caching::allocation_size(10 * kMiB - 512), 20 * kMiB);
  EXPECT_EQ(caching::allocation_size(10 * kMiB), 10 * kMiB);      // own segment, 2 MiB multiple
  EXPECT_EQ(caching::allocation_size(11 * kMiB), 12 * kMiB);

  CachingAllocatorModel m(kGiB);
  size_t a = take(m, 1);
  EXPECT_EQ(m.block_size_at(a), 512u);
  EXPECT_EQ(m.stats().reserved_bytes, 2 * kMiB);
  size_t b = take(m, 513);  // same small segment, right after a
  EXPECT_EQ(b, a + 512);
  EXPECT_EQ(m.block_size_at(b), 1024u);
  take(m, kMiB);  // still the small pool: fits the 2 MiB segment's remainder
  EXPECT_EQ(m.segment_count(), 1u);
  take(m, kMiB + 1);  // large pool: a 20 MiB segment
  EXPECT_EQ(m.segment_count(), 2u);
  EXPECT_EQ(m.stats().reserved_bytes, 22 * kMiB);
  take(m, 11 * kMiB);  // best fit: the large segment's free 19 MiB - 512
  EXPECT_EQ(m.segment_count(), 2u);
  take(m, 21 * kMiB);  // 10 MiB or more: its own segment, rounded up to 2 MiB
  EXPECT_EQ(m.stats().reserved_bytes, 44 * kMiB);
}

TEST(CachingPolicy, SplitsOnlyAboveThePoolThreshold) {
  CachingAllocatorModel m(kGiB);
  size_t a = take(m, 19 * kMiB);  // 20 MiB segment, remainder exactly 1 MiB: not split
  EXPECT_EQ(m.block_size_at(a), 20 * kMiB);
  EXPECT_EQ(m.stats().allocated_bytes, 20 * kMiB);
  size_t b = take(m, 19 * kMiB - 512);  // remainder 1 MiB + 512: split
  EXPECT_EQ(m.block_size_at(b), 19 * kMiB - 512);
  EXPECT_EQ(m.block_size_at(b + 19 * kMiB - 512), kMiB + 512);
  size_t c = take(m, 2 * kMiB - 1024);  // over 1 MiB: the large pool, where the free 1 MiB + 512 is too small
  EXPECT_EQ(m.segment_count(), 3u);
  EXPECT_EQ(m.block_size_at(c), 2 * kMiB - 1024);
  size_t s = take(m, kMiB - 512);  // the small pool: a 2 MiB segment, 1 MiB + 512 left
  size_t t = take(m, kMiB);  // the small segment's remainder is 1 MiB + 512: split leaving 512
  EXPECT_EQ(t, s + kMiB - 512);
  EXPECT_EQ(m.block_size_at(t + kMiB), 512u);
}

TEST(CachingPolicy, BestFitBySizeThenAddressAndMerges) {
  CachingAllocatorModel m(kGiB);
  size_t a = take(m, 4 * kMiB);  // one 20 MiB segment: a [0,4) b [4,6) c [6,12) d [12,14), 6 MiB free at 14
  size_t b = take(m, 2 * kMiB);
  size_t c = take(m, 6 * kMiB);
  size_t d = take(m, 2 * kMiB);
  EXPECT_EQ(m.segment_count(), 1u);
  EXPECT_EQ(d, a + 12 * kMiB);
  m.free(a);
  m.free(c);
  EXPECT_EQ(m.check_invariants(), "");
  // Two 6 MiB holes (c's and the tail): the lower address wins.
  EXPECT_EQ(take(m, 5 * kMiB), c);
  EXPECT_EQ(m.block_size_at(c), 6 * kMiB);  // remainder 1 MiB: not split
  // 3 MiB: the 4 MiB hole is the smallest fit.
  EXPECT_EQ(take(m, 3 * kMiB), a);
  m.free(a);
  m.free(c);
  m.free(b);  // a + b + c merge
  EXPECT_EQ(m.block_size_at(a), 12 * kMiB);
  m.free(d);  // and with d and the tail: the whole segment, kept cached
  EXPECT_EQ(m.block_size_at(a), 20 * kMiB);
  EXPECT_EQ(m.stats().reserved_bytes, 20 * kMiB);
  EXPECT_EQ(m.stats().allocated_bytes, 0u);
  EXPECT_EQ(m.segment_count(), 1u);
  EXPECT_EQ(m.check_invariants(), "");
}

TEST(CachingPolicy, LargeSegmentsAreReusedAndReleasedOnlyWhenOutOfMemory) {
  CachingAllocatorModel m(40 * kMiB);
  size_t a = take(m, 12 * kMiB);
  m.free(a);
  size_t b = take(m, 11 * kMiB);  // reuses the 12 MiB segment whole (remainder 1 MiB)
  EXPECT_EQ(b, a);
  EXPECT_EQ(m.block_size_at(b), 12 * kMiB);
  m.free(b);
  // 30 MiB does not fit the cached 12 MiB, and 12 + 30 > 40: the cached segment is freed, then it fits.
  take(m, 30 * kMiB);
  EXPECT_EQ(m.segment_count(), 1u);
  EXPECT_EQ(m.stats().reserved_bytes, 30 * kMiB);
  EXPECT_EQ(m.stats().peak_reserved_bytes, 30 * kMiB);
  EXPECT_FALSE(m.allocate(12 * kMiB, kT).has_value());  // 30 + 12 > 40, nothing cached to free
  EXPECT_EQ(m.stats().transient.failed_count, 1u);
}

TEST(CachingPolicy, MaxSplitSizeKeepsOversizeBlocksWhole) {
  EXPECT_THROW(CachingAllocatorModel(kGiB, {.max_split_size = 16 * kMiB}), ConfigError);
  CachingAllocatorModel m(kGiB, {.max_split_size = 40 * kMiB});
  size_t big = take(m, 64 * kMiB);
  m.free(big);
  // A request below max_split_size never takes an oversize block: a new 30 MiB segment.
  size_t small = take(m, 30 * kMiB);
  EXPECT_NE(small, big);
  EXPECT_EQ(m.stats().reserved_bytes, 94 * kMiB);
  // At or above it: only when the block exceeds the request by less than 20 MiB, and never split.
  size_t close = take(m, 50 * kMiB);
  EXPECT_EQ(close, big);
  EXPECT_EQ(m.block_size_at(close), 64 * kMiB);
  m.free(close);
  size_t far = take(m, 44 * kMiB);  // 64 >= 44 + 20: a new segment
  EXPECT_NE(far, big);
  EXPECT_EQ(m.stats().reserved_bytes, 138 * kMiB);

  // Without max_split_size the 64 MiB block is split for 30 MiB.
  CachingAllocatorModel plain(kGiB);
  size_t p = take(plain, 64 * kMiB);
  plain.free(p);
  EXPECT_EQ(take(plain, 30 * kMiB), p);
  EXPECT_EQ(plain.block_size_at(p + 30 * kMiB), 34 * kMiB);

  // Out of memory with max_split_size: the oversize cached block is released first.
  CachingAllocatorModel tight(100 * kMiB, {.max_split_size = 40 * kMiB});
  tight.free(take(tight, 64 * kMiB));
  take(tight, 30 * kMiB);  // 94 MiB reserved
  take(tight, 30 * kMiB);  // 124 > 100: the 64 MiB block goes
  EXPECT_EQ(tight.stats().reserved_bytes, 60 * kMiB);
  EXPECT_EQ(tight.segment_count(), 2u);
}

TEST(CachingPolicy, ExpandableSegmentsGrowOneVirtualSegmentByPages) {
  CachingAllocatorModel m(kGiB, {.expandable_segments = true});
  size_t a = take(m, 5 * kMiB);  // maps one 20 MiB page; splits at any remainder >= 512
  EXPECT_EQ(m.stats().reserved_bytes, 20 * kMiB);
  EXPECT_EQ(m.block_size_at(a), 5 * kMiB);
  size_t b = take(m, 16 * kMiB);  // the free 15 MiB grows into a second page
  EXPECT_EQ(b, a + 5 * kMiB);
  EXPECT_EQ(m.stats().reserved_bytes, 40 * kMiB);
  size_t c = take(m, 30 * kMiB);  // 19 MiB free + a third page
  EXPECT_EQ(c, a + 21 * kMiB);
  EXPECT_EQ(m.stats().reserved_bytes, 60 * kMiB);
  EXPECT_EQ(m.segment_count(), 1u);
  take(m, 1000);  // the small pool: its own virtual segment, one 2 MiB page
  EXPECT_EQ(m.segment_count(), 2u);
  EXPECT_EQ(m.stats().reserved_bytes, 62 * kMiB);

  // The same requests in ordinary segments: 20 + 16 + 30 + 2.
  CachingAllocatorModel plain(kGiB);
  for (size_t bytes : {5 * kMiB, 16 * kMiB, 30 * kMiB, size_t{1000}}) take(plain, bytes);
  EXPECT_EQ(plain.stats().reserved_bytes, 68 * kMiB);
}

TEST(CachingPolicy, ExpandableUnmapsFreePagesWhenOutOfMemory) {
  CachingAllocatorModel m(60 * kMiB, {.expandable_segments = true});
  m.free(take(m, 50 * kMiB));  // three 20 MiB pages mapped, all free
  EXPECT_EQ(m.stats().reserved_bytes, 60 * kMiB);
  take(m, 100);  // a small page does not fit: the free large pages are unmapped first
  EXPECT_EQ(m.stats().reserved_bytes, 2 * kMiB);
  EXPECT_EQ(m.segment_count(), 1u);  // the emptied large segment is released
  EXPECT_EQ(m.stats().peak_reserved_bytes, 60 * kMiB);
}

void stress(CachingOptions options, size_t capacity) {
  CachingAllocatorModel m(capacity, options);
  std::mt19937_64 rng(42);
  std::vector<size_t> live;
  size_t failures = 0;
  for (int i = 0; i < 4000; ++i) {
    if (!live.empty() && rng() % 5 < 2) {
      size_t k = rng() % live.size();
      m.free(live[k]);
      live[k] = live.back();
      live.pop_back();
    } else {
      size_t bytes = rng() % 3 == 0 ? 1 + rng() % (2 * kMiB) : 1 + rng() % (48 * kMiB);
      auto off = m.allocate(bytes, rng() % 2 ? kT : Lifetime::kPersistent);
      if (off) live.push_back(*off); else ++failures;
    }
    ASSERT_EQ(m.check_invariants(), "") << "event " << i;
  }
  EXPECT_GT(failures, 0u);  // the capacity was reached, so the release paths ran
  for (size_t off : live) m.free(off);
  EXPECT_EQ(m.check_invariants(), "");
  EXPECT_EQ(m.stats().allocated_bytes, 0u);
}

TEST(CachingPolicy, StressKeepsInvariants) {
  stress({}, 512 * kMiB);
  stress({.max_split_size = 64 * kMiB}, 512 * kMiB);
  stress({.expandable_segments = true}, 512 * kMiB);
}

}  // namespace
}  // namespace zs::memory
