// DeviceAllocator: exact placement against a reference model of Note [Two-ended pools], invariants
// after every operation, byte patterns proving blocks never overlap in real memory, the tracker
// integration, the out-of-memory message, and a multi-threaded stress run. Seeds are fixed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "core/errors.h"
#include "memory/allocator.h"
#include "memory/cpu_backend.h"
#include "memory/tracker.h"

namespace zs::memory {
namespace {

constexpr size_t kMiB = 1024 * 1024;

// The reference: live blocks only. Region edges, holes and placements are derived from them alone.
class ReferenceModel {
 public:
  explicit ReferenceModel(size_t capacity) : capacity_(capacity) {}

  struct Placed {
    size_t offset, size;
    Lifetime lifetime;
  };

  size_t top() const {  // end of the low pool's region (persistent and saved blocks)
    size_t t = 0;
    for (const auto& [id, b] : live_) {
      if (pool_of(b.lifetime) == Lifetime::kPersistent) t = std::max(t, b.offset + b.size);
    }
    return t;
  }
  size_t bottom() const {  // start of the transient region
    size_t t = capacity_;
    for (const auto& [id, b] : live_) {
      if (pool_of(b.lifetime) == Lifetime::kTransient) t = std::min(t, b.offset);
    }
    return t;
  }
  // Holes (offset, size) inside a pool's region (l: kPersistent or kTransient), in address order.
  std::vector<std::pair<size_t, size_t>> holes(Lifetime l) const {
    std::vector<std::pair<size_t, size_t>> blocks;
    for (const auto& [id, b] : live_) {
      if (pool_of(b.lifetime) == l) blocks.emplace_back(b.offset, b.size);
    }
    std::sort(blocks.begin(), blocks.end());
    std::vector<std::pair<size_t, size_t>> out;
    size_t cursor = l == Lifetime::kPersistent ? 0 : bottom();
    for (auto [o, s] : blocks) {
      if (o > cursor) out.emplace_back(cursor, o - cursor);
      cursor = o + s;
    }
    // The transient region ends at the capacity, so a hole may also sit above its last live block.
    if (l == Lifetime::kTransient && cursor < capacity_ && !blocks.empty()) out.emplace_back(cursor, capacity_ - cursor);
    return out;
  }
  // Where the policy must put a request of `size` aligned bytes, or nullopt when it must fail.
  std::optional<size_t> predict(size_t size, Lifetime lifetime) const {
    const Lifetime l = pool_of(lifetime);
    if (lifetime == Lifetime::kSpanning) {
      // The deepest fitting hole (the high pool's base is the capacity), at its end nearest the gap.
      std::optional<size_t> deepest;
      for (auto h : holes(l)) {
        if (h.second >= size) deepest = h.first;
      }
      if (deepest) return deepest;
      if (bottom() - top() < size) return std::nullopt;
      return bottom() - size;
    }
    std::optional<std::pair<size_t, size_t>> best;
    for (auto h : holes(l)) {
      if (h.second < size) continue;
      bool better = !best || h.second < best->second ||
                    (h.second == best->second &&
                     (l == Lifetime::kPersistent ? h.first < best->first : h.first > best->first));
      if (better) best = h;
    }
    // A block takes the hole's end nearest its pool's base: the low end in the low pool, the high end
    // in the high pool.
    if (best) return l == Lifetime::kPersistent ? best->first : best->first + best->second - size;
    if (bottom() - top() < size) return std::nullopt;
    return l == Lifetime::kPersistent ? top() : bottom() - size;
  }
  void add(uint64_t id, Placed p) { live_.emplace(id, p); }
  void remove(uint64_t id) { live_.erase(id); }
  size_t allocated(Lifetime pool) const {
    size_t s = 0;
    for (const auto& [id, b] : live_) {
      if (pool_of(b.lifetime) == pool) s += b.size;
    }
    return s;
  }
  size_t count(Lifetime pool) const {
    size_t n = 0;
    for (const auto& [id, b] : live_) n += pool_of(b.lifetime) == pool;
    return n;
  }
  size_t capacity() const { return capacity_; }

 private:
  size_t capacity_;
  std::map<uint64_t, Placed> live_;
};

// Writes the block id into the first and last 8 bytes (blocks of >= 16 bytes); a later mismatch means another block overlapped.
void stamp(const DeviceBlock& b) {
  uint64_t id = b.id();
  auto* p = static_cast<char*>(b.data());
  std::memcpy(p, &id, 8);
  std::memcpy(p + b.size() - 8, &id, 8);
}
bool stamp_intact(const DeviceBlock& b) {
  uint64_t head, tail;
  auto* p = static_cast<const char*>(b.data());
  std::memcpy(&head, p, 8);
  std::memcpy(&tail, p + b.size() - 8, 8);
  return head == b.id() && tail == b.id();
}

size_t random_size(std::mt19937_64& rng) {
  int kind = static_cast<int>(rng() % 10);
  if (kind < 5) return 16 + rng() % 4096;           // small, mostly unaligned (>= 16: see stamp)
  if (kind < 9) return 4096 + rng() % (256 * 1024);  // medium
  return 256 * 1024 + rng() % (4 * kMiB);            // large
}

void check_against_reference(const DeviceAllocator& alloc, const ReferenceModel& ref, size_t peak_alloc,
                             size_t peak_reserved) {
  std::string err = alloc.check_invariants();
  ASSERT_TRUE(err.empty()) << err;
  ArenaStats s = alloc.stats();
  size_t top = ref.top(), bottom = ref.bottom();
  ASSERT_EQ(s.persistent.allocated_bytes, ref.allocated(Lifetime::kPersistent));
  ASSERT_EQ(s.transient.allocated_bytes, ref.allocated(Lifetime::kTransient));
  ASSERT_EQ(s.persistent.live_blocks, ref.count(Lifetime::kPersistent));
  ASSERT_EQ(s.transient.live_blocks, ref.count(Lifetime::kTransient));
  ASSERT_EQ(s.persistent.reserved_bytes, top);
  ASSERT_EQ(s.transient.reserved_bytes, ref.capacity() - bottom);
  ASSERT_EQ(s.allocated_bytes, s.persistent.allocated_bytes + s.transient.allocated_bytes);
  ASSERT_EQ(s.free_bytes, ref.capacity() - s.allocated_bytes);
  size_t largest = bottom - top;
  for (Lifetime l : {Lifetime::kPersistent, Lifetime::kTransient}) {
    size_t pool_largest = 0;
    for (auto h : ref.holes(l)) pool_largest = std::max(pool_largest, h.second);
    ASSERT_EQ(s.pool(l).largest_free_bytes, pool_largest);
    largest = std::max(largest, pool_largest);
  }
  ASSERT_EQ(s.largest_free_bytes, largest);
  if (s.free_bytes > 0) {
    ASSERT_DOUBLE_EQ(s.fragmentation, 1.0 - static_cast<double>(largest) / static_cast<double>(s.free_bytes));
  }
  ASSERT_EQ(s.peak_allocated_bytes, peak_alloc);
  ASSERT_EQ(s.peak_reserved_bytes, peak_reserved);
}

class AllocatorStress : public ::testing::TestWithParam<uint64_t> {};

TEST_P(AllocatorStress, MatchesReferenceModel) {
  constexpr size_t kCapacity = 48 * kMiB;
  CpuBackend backend(kCapacity);
  MemoryTracker tracker;
  DeviceAllocator alloc(backend, kCapacity, &tracker);
  ReferenceModel ref(alloc.capacity());
  std::mt19937_64 rng(GetParam());
  std::vector<DeviceBlock> live;
  size_t peak_alloc = 0, peak_reserved = 0, ooms = 0;
  for (int op = 0; op < 6000; ++op) {
    // Phases: filling (alloc-biased) and draining, so the arena often nears full and runs out.
    bool filling = (op / 500) % 2 == 0;
    bool do_alloc = live.empty() || rng() % 100 < (filling ? 70u : 35u);
    if (do_alloc) {
      size_t bytes = random_size(rng);
      const uint64_t draw = rng() % 10;
      Lifetime l = draw < 2   ? Lifetime::kPersistent
                   : draw < 4 ? Lifetime::kSaved
                   : draw < 5 ? Lifetime::kSpanning
                              : Lifetime::kTransient;
      Category c = kAllCategories[rng() % kNumCategories];
      std::optional<size_t> expect = ref.predict(align_up(bytes), l);
      try {
        DeviceBlock b = alloc.allocate(bytes, c, l);
        ASSERT_TRUE(expect.has_value()) << "allocated where the reference says it cannot fit";
        ASSERT_EQ(b.offset(), *expect) << "op " << op << ": " << bytes << " bytes " << lifetime_name(l);
        ASSERT_EQ(b.offset() % kAllocAlignment, 0u);
        ASSERT_EQ(reinterpret_cast<uintptr_t>(b.data()) % kAllocAlignment, 0u);
        ref.add(b.id(), {b.offset(), align_up(bytes), l});
        stamp(b);
        live.push_back(std::move(b));
      } catch (const OutOfMemoryError&) {
        ASSERT_FALSE(expect.has_value()) << "op " << op << ": OOM but the reference places it at " << *expect;
        ++ooms;
      }
    } else {
      // Transient blocks are mostly freed newest-first (like activations), the rest at random.
      size_t i = rng() % 4 == 0 ? live.size() - 1 : rng() % live.size();
      ASSERT_TRUE(stamp_intact(live[i])) << "block " << live[i].id() << " was overwritten";
      ref.remove(live[i].id());
      std::swap(live[i], live.back());
      live.pop_back();  // the handle's destructor frees the block
    }
    ArenaStats now = alloc.stats();
    peak_alloc = std::max(peak_alloc, now.allocated_bytes);
    peak_reserved = std::max(peak_reserved, now.reserved_bytes);
    check_against_reference(alloc, ref, peak_alloc, peak_reserved);
    size_t tracked = 0;
    for (const auto& b : live) tracked += b.reserved_bytes();
    ASSERT_EQ(tracker.tier_current(Tier::kDevice), tracked);
  }
  EXPECT_GT(ooms, 0u) << "the run should reach out-of-memory at least once";
  live.clear();
  ArenaStats end = alloc.stats();
  EXPECT_EQ(end.allocated_bytes, 0u);
  EXPECT_EQ(end.reserved_bytes, 0u);  // every hole went back to the gap
  EXPECT_EQ(end.largest_free_bytes, alloc.capacity());
  EXPECT_EQ(end.fragmentation, 0.0);
  EXPECT_EQ(tracker.tier_current(Tier::kDevice), 0u);
  EXPECT_EQ(end.persistent.failed_count + end.transient.failed_count, ooms);
}

INSTANTIATE_TEST_SUITE_P(Seeds, AllocatorStress, ::testing::Values(1u, 2u, 3u, 42u));

TEST(Allocator, MultiThreadedStress) {
  constexpr size_t kCapacity = 64 * kMiB;
  CpuBackend backend(kCapacity);
  MemoryTracker tracker;
  DeviceAllocator alloc(backend, kCapacity, &tracker);
  constexpr int kThreads = 4;
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1000 + static_cast<uint64_t>(t));
      std::vector<std::pair<DeviceBlock, unsigned char>> mine;
      for (int op = 0; op < 3000 && !failed; ++op) {
        if (mine.empty() || rng() % 100 < 55) {
          size_t bytes = 1 + rng() % (128 * 1024);
          Lifetime l = rng() % 4 == 0 ? Lifetime::kPersistent : Lifetime::kTransient;
          try {
            DeviceBlock b = alloc.allocate(bytes, Category::kActivations, l);
            auto fill = static_cast<unsigned char>(rng());
            std::memset(b.data(), fill, b.size());  // whole block: any overlap corrupts another's bytes
            mine.emplace_back(std::move(b), fill);
          } catch (const OutOfMemoryError&) {
          }
        } else {
          size_t i = rng() % mine.size();
          auto* p = static_cast<const unsigned char*>(mine[i].first.data());
          for (size_t k = 0; k < mine[i].first.size(); ++k) {
            if (p[k] != mine[i].second) failed = true;
          }
          std::swap(mine[i], mine.back());
          mine.pop_back();
        }
        if (op % 500 == 0 && !alloc.is_valid()) failed = true;  // concurrent checker
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_FALSE(failed) << "a block's bytes were overwritten or an invariant broke";
  EXPECT_TRUE(alloc.is_valid()) << alloc.check_invariants();
  ArenaStats s = alloc.stats();
  EXPECT_EQ(s.allocated_bytes, 0u);
  EXPECT_EQ(s.reserved_bytes, 0u);
  EXPECT_EQ(tracker.tier_current(Tier::kDevice), 0u);
  EXPECT_GT(tracker.tier_peak(Tier::kDevice), 0u);
  EXPECT_EQ(s.persistent.alloc_count + s.transient.alloc_count, s.persistent.free_count + s.transient.free_count);
}

TEST(Allocator, OutOfMemoryMessageNamesEverything) {
  CpuBackend backend(4 * kMiB);
  DeviceAllocator alloc(backend, 4 * kMiB);
  DeviceBlock p = alloc.allocate(3 * kMiB, Category::kParams, Lifetime::kPersistent);
  try {
    DeviceBlock g = alloc.allocate(2 * kMiB, Category::kCommBuffers, Lifetime::kTransient);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    std::string m = e.what();
    for (const char* part : {"2097152 bytes", "comm_buffers", "transient pool", "persistent pool", "largest free block",
                             "1048576 B", "device.memory_mb", "ZeRO stage", "offload"}) {
      EXPECT_NE(m.find(part), std::string::npos) << "missing '" << part << "' in: " << m;
    }
  }
  EXPECT_TRUE(alloc.is_valid());
  EXPECT_EQ(alloc.stats().transient.failed_count, 1u);
}

TEST(Allocator, PoolsGrowFromOppositeEnds) {
  CpuBackend backend(kMiB);
  DeviceAllocator alloc(backend, kMiB);
  DeviceBlock a = alloc.allocate(100, Category::kParams, Lifetime::kPersistent);
  DeviceBlock b = alloc.allocate(100, Category::kActivations, Lifetime::kTransient);
  DeviceBlock c = alloc.allocate(64, Category::kGrads, Lifetime::kPersistent);
  EXPECT_EQ(a.offset(), 0u);
  EXPECT_EQ(c.offset(), 128u);
  EXPECT_EQ(b.offset(), kMiB - 128);
  EXPECT_EQ(b.data(), static_cast<char*>(alloc.base()) + kMiB - 128);
  EXPECT_EQ(a.size(), 100u);
  EXPECT_EQ(a.reserved_bytes(), 128u);
  // Freeing the lower persistent block leaves a hole; a fitting request reuses it (best fit).
  a.release();
  EXPECT_TRUE(a.empty());
  ArenaStats s = alloc.stats();
  EXPECT_EQ(s.persistent.free_blocks, 1u);
  EXPECT_EQ(s.persistent.largest_free_bytes, 128u);
  DeviceBlock d = alloc.allocate(64, Category::kParams, Lifetime::kPersistent);
  EXPECT_EQ(d.offset(), 0u);
  a.release();  // idempotent
}

TEST(Allocator, SavedBlocksGoToTheLowPoolAndHolesFillFromTheBase) {
  CpuBackend backend(kMiB);
  DeviceAllocator alloc(backend, kMiB);
  DeviceBlock p = alloc.allocate(128, Category::kParams, Lifetime::kPersistent);
  DeviceBlock s1 = alloc.allocate(64, Category::kActivations, Lifetime::kSaved);
  DeviceBlock s2 = alloc.allocate(64, Category::kActivations, Lifetime::kSaved);
  EXPECT_EQ(s1.offset(), 128u);  // stacked on the model states
  EXPECT_EQ(s2.offset(), 192u);
  EXPECT_EQ(s1.lifetime(), Lifetime::kSaved);
  ArenaStats s = alloc.stats();
  EXPECT_EQ(s.persistent.live_blocks, 3u);  // the low pool's stats count saved blocks
  EXPECT_EQ(s.persistent.reserved_bytes, 256u);
  // In the high pool a block placed in a hole takes the hole's end nearest the capacity.
  DeviceBlock t1 = alloc.allocate(256, Category::kParams, Lifetime::kTransient);
  DeviceBlock t2 = alloc.allocate(64, Category::kGrads, Lifetime::kTransient);
  EXPECT_EQ(t1.offset(), kMiB - 256);
  EXPECT_EQ(t2.offset(), kMiB - 320);
  t1.release();
  DeviceBlock t3 = alloc.allocate(64, Category::kActivations, Lifetime::kTransient);
  EXPECT_EQ(t3.offset(), kMiB - 64);
  EXPECT_EQ(alloc.stats().transient.largest_free_bytes, 192u);  // the rest of the hole, beside t2
  EXPECT_TRUE(alloc.is_valid()) << alloc.check_invariants();
}

TEST(Allocator, SpanningBlocksTakeTheDeepestHoleAtItsGapEnd) {
  CpuBackend backend(kMiB);
  DeviceAllocator alloc(backend, kMiB);
  // The high pool from the capacity down: a (512) b (64) c (256) d (64) e (128).
  DeviceBlock a = alloc.allocate(512, Category::kParams, Lifetime::kTransient);
  DeviceBlock b = alloc.allocate(64, Category::kActivations, Lifetime::kTransient);
  DeviceBlock c = alloc.allocate(256, Category::kActivations, Lifetime::kTransient);
  DeviceBlock d = alloc.allocate(64, Category::kActivations, Lifetime::kTransient);
  DeviceBlock e = alloc.allocate(128, Category::kActivations, Lifetime::kTransient);
  a.release();  // a 512-byte hole at the base
  c.release();  // a 256-byte hole nearer the gap
  // Best fit would take c's hole for 192 bytes; a spanning block takes the deepest hole that fits,
  // at its end nearest the gap...
  DeviceBlock s1 = alloc.allocate(192, Category::kGrads, Lifetime::kSpanning);
  EXPECT_EQ(s1.offset(), kMiB - 512);
  EXPECT_EQ(s1.lifetime(), Lifetime::kSpanning);
  // ... so the rest of that hole stays whole at the base.
  DeviceBlock t = alloc.allocate(320, Category::kActivations, Lifetime::kTransient);
  EXPECT_EQ(t.offset(), kMiB - 320);
  // One too large for every hole extends the region.
  DeviceBlock s2 = alloc.allocate(1024, Category::kGrads, Lifetime::kSpanning);
  EXPECT_EQ(s2.offset(), kMiB - 1024 - 1024);
  ArenaStats st = alloc.stats();
  EXPECT_EQ(st.transient.live_blocks, 6u);  // spanning blocks count in the transient pool
  EXPECT_EQ(st.persistent.live_blocks, 0u);
  EXPECT_TRUE(alloc.is_valid()) << alloc.check_invariants();
}

TEST(Allocator, TensorViewsAndEmptyBlocks) {
  MemoryTracker tracker;
  CpuBackend backend(kMiB);
  DeviceAllocator alloc(backend, kMiB, &tracker);
  DeviceBlock w = alloc.allocate_tensor({3, 5}, DType::kBF16, Category::kParams, Lifetime::kPersistent);
  Tensor t = w.tensor();
  EXPECT_EQ(t.shape(), (Shape{3, 5}));
  EXPECT_EQ(t.dtype(), DType::kBF16);
  EXPECT_EQ(t.raw(), w.data());
  EXPECT_EQ(w.size(), 30u);
  EXPECT_EQ(tracker.current(Category::kParams, Tier::kDevice), 64u);
  Tensor flat = w.tensor(DType::kF16, {15});
  EXPECT_EQ(flat.numel(), 15);
  EXPECT_THROW(w.tensor(DType::kF32, {8}), InternalError);
  DeviceBlock raw = alloc.allocate(256, Category::kActivations, Lifetime::kTransient);
  EXPECT_THROW(raw.tensor(), InternalError);
  DeviceBlock moved = std::move(w);
  EXPECT_TRUE(w.empty());
  EXPECT_EQ(moved.tensor().raw(), t.raw());
  DeviceBlock zero = alloc.allocate(0, Category::kGrads, Lifetime::kPersistent);
  EXPECT_TRUE(zero.empty());
  EXPECT_EQ(zero.tensor(DType::kF32, {0}).numel(), 0);
  EXPECT_EQ(alloc.stats().persistent.live_blocks, 1u);
  moved = DeviceBlock();  // move-assigning frees the old block
  EXPECT_EQ(alloc.stats().persistent.live_blocks, 0u);
  EXPECT_EQ(tracker.current(Category::kParams, Tier::kDevice), 0u);
}

TEST(Allocator, CapacityComesFromTheBackend) {
  CpuBackend backend(kMiB);
  DeviceAllocator alloc(backend, kMiB);
  EXPECT_EQ(backend.allocated(Tier::kDevice), kMiB);
  EXPECT_THROW(DeviceAllocator(backend, kMiB), OutOfMemoryError);  // the device is already full
  EXPECT_THROW(DeviceAllocator(backend, 10), ConfigError);
}

TEST(Policy, SinglePoolMixesLifetimes) {
  SinglePoolBestFit single(kMiB);
  auto a = single.allocate(1000, Lifetime::kTransient);
  auto b = single.allocate(1000, Lifetime::kPersistent);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*a, 0u);
  EXPECT_EQ(*b, 1024u);
  single.free(*a);
  ArenaStats s = single.stats();
  EXPECT_EQ(s.persistent.allocated_bytes, 1024u);
  EXPECT_EQ(s.transient.allocated_bytes, 0u);
  EXPECT_EQ(s.reserved_bytes, 2048u);
  EXPECT_GT(s.fragmentation, 0.0);
  EXPECT_TRUE(single.is_valid()) << single.check_invariants();
  EXPECT_THROW(single.free(*a), InternalError);
  EXPECT_FALSE(single.allocate(2 * kMiB, Lifetime::kPersistent).has_value());
}

}  // namespace
}  // namespace zs::memory
