// Allocation traces: text round trip, parse errors, recording from a DeviceAllocator, replay into the
// same policy reproducing the allocator's statistics exactly, and a policy comparison on a pattern
// where mixing lifetimes fragments the arena.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <sstream>
#include <vector>

#include "core/errors.h"
#include "memory/alloc_trace.h"
#include "memory/allocator.h"
#include "memory/cpu_backend.h"

namespace zs::memory {
namespace {

constexpr size_t kMiB = 1024 * 1024;

TEST(AllocTrace, TextRoundTrip) {
  AllocTrace t;
  t.capacity_bytes = 12345678;
  t.events = {{TraceEvent::Op::kAlloc, 1, 100, Lifetime::kPersistent, Category::kParams},
              {TraceEvent::Op::kAlloc, 2, 7, Lifetime::kTransient, Category::kCommBuffers},
              {TraceEvent::Op::kAlloc, 3, 64, Lifetime::kSaved, Category::kActivations},
              {TraceEvent::Op::kAlloc, 4, 640, Lifetime::kSpanning, Category::kGrads},
              {TraceEvent::Op::kFree, 1, 0, Lifetime::kPersistent, Category::kParams}};
  std::stringstream ss;
  write_trace(t, ss);
  EXPECT_EQ(ss.str(),
            "zeroshard-alloc-trace 1 12345678\n"
            "a 1 100 persistent params\n"
            "a 2 7 transient comm_buffers\n"
            "a 3 64 saved activations\n"
            "a 4 640 spanning grads\n"
            "f 1\n");
  EXPECT_EQ(read_trace(ss, "mem"), t);

  std::string path = ::testing::TempDir() + "/zs_alloc_trace_test.trace";
  save_trace(t, path);
  EXPECT_EQ(load_trace(path), t);
  std::remove(path.c_str());
}

TEST(AllocTrace, ParseErrorsNameSourceAndLine) {
  auto expect_error = [](const std::string& text, const std::string& needle) {
    std::istringstream in(text);
    try {
      read_trace(in, "bad.trace");
      ADD_FAILURE() << "no error for: " << text;
    } catch (const IoError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("bad.trace"), std::string::npos) << m;
      EXPECT_NE(m.find(needle), std::string::npos) << m;
    }
  };
  expect_error("", "empty");
  expect_error("not-a-trace 1 10\n", "line 1");
  expect_error("zeroshard-alloc-trace 2 10\n", "version");
  expect_error("zeroshard-alloc-trace 1 10\n# comment\na 1 64 forever params\n", "line 3");
  expect_error("zeroshard-alloc-trace 1 10\na 1 64 transient weights\n", "category");
  expect_error("zeroshard-alloc-trace 1 10\nf\n", "free");
  expect_error("zeroshard-alloc-trace 1 10\nf 1 2\n", "trailing");
  expect_error("zeroshard-alloc-trace 1 10\nx 1\n", "tag");
  EXPECT_THROW(load_trace("/nonexistent/dir/x.trace"), IoError);

  AllocTrace bad;
  bad.capacity_bytes = kMiB;
  bad.events = {{TraceEvent::Op::kFree, 9, 0, Lifetime::kPersistent, Category::kParams}};
  TwoEndedBestFit policy(kMiB);
  EXPECT_THROW(replay(bad, policy), IoError);
}

// Random alloc/free sequence on a real allocator with a recorder attached.
AllocTrace record_random_run(uint64_t seed, ArenaStats* final_stats) {
  CpuBackend backend(16 * kMiB);
  DeviceAllocator alloc(backend, 16 * kMiB);
  AllocTraceRecorder rec(alloc.capacity());
  alloc.set_trace_recorder(&rec);
  std::mt19937_64 rng(seed);
  std::vector<DeviceBlock> live;
  for (int op = 0; op < 3000; ++op) {
    if (live.empty() || rng() % 100 < 55) {
      Lifetime l = rng() % 3 == 0 ? Lifetime::kPersistent : Lifetime::kTransient;
      try {
        live.push_back(alloc.allocate(1 + rng() % (256 * 1024), Category::kActivations, l));
      } catch (const OutOfMemoryError&) {
      }
    } else {
      size_t i = rng() % live.size();
      std::swap(live[i], live.back());
      live.pop_back();
    }
  }
  *final_stats = alloc.stats();
  alloc.set_trace_recorder(nullptr);
  live.clear();  // not recorded: the recorder is detached
  return rec.trace();
}

TEST(AllocTrace, ReplayReproducesTheRecordedRun) {
  ArenaStats recorded;
  AllocTrace trace = record_random_run(7, &recorded);
  ASSERT_GT(trace.events.size(), 2000u);
  EXPECT_EQ(trace.capacity_bytes, 16 * kMiB);

  // Through the text format, into a fresh instance of the allocator's own policy: identical stats.
  std::stringstream ss;
  write_trace(trace, ss);
  AllocTrace parsed = read_trace(ss, "memory");
  TwoEndedBestFit same(parsed.capacity_bytes);
  ReplayResult r = replay(parsed, same, /*check_each_step=*/true);
  EXPECT_EQ(r.events, trace.events.size());
  EXPECT_EQ(r.failed_allocs, 0u);
  EXPECT_EQ(r.final_stats.allocated_bytes, recorded.allocated_bytes);
  EXPECT_EQ(r.final_stats.reserved_bytes, recorded.reserved_bytes);
  EXPECT_EQ(r.peak_reserved_bytes, recorded.peak_reserved_bytes);
  EXPECT_EQ(r.peak_allocated_bytes, recorded.peak_allocated_bytes);
  EXPECT_EQ(r.final_stats.largest_free_bytes, recorded.largest_free_bytes);
  EXPECT_DOUBLE_EQ(r.final_stats.fragmentation, recorded.fragmentation);

  // Another policy takes the same sequence; invariants hold at every step.
  SinglePoolBestFit single(parsed.capacity_bytes);
  ReplayResult rs = replay(parsed, single, /*check_each_step=*/true);
  EXPECT_EQ(rs.events, trace.events.size());
  EXPECT_EQ(rs.peak_allocated_bytes, rs.final_stats.peak_allocated_bytes);
  EXPECT_GE(rs.peak_reserved_bytes, rs.peak_allocated_bytes);
  // A tighter arena makes some requests fail; their frees are skipped, not errors.
  TwoEndedBestFit small(2 * kMiB);
  ReplayResult rf = replay(parsed, small, /*check_each_step=*/true);
  EXPECT_GT(rf.failed_allocs, 0u);
}

// Model-state blocks interleaved with activations (as layers build up), then the activations freed:
// mixed in one pool, the freed activations leave holes between parameters; two-ended pools leave none.
TEST(AllocTrace, TwoEndedPoolsAvoidLifetimeFragmentation) {
  AllocTrace t;
  t.capacity_bytes = 64 * kMiB;
  uint64_t id = 1;
  std::vector<uint64_t> acts;
  for (int layer = 0; layer < 16; ++layer) {
    t.events.push_back({TraceEvent::Op::kAlloc, id++, kMiB, Lifetime::kPersistent, Category::kParams});
    t.events.push_back({TraceEvent::Op::kAlloc, id, 2 * kMiB, Lifetime::kTransient, Category::kActivations});
    acts.push_back(id++);
  }
  // Backward frees activations newest first.
  for (auto it = acts.rbegin(); it != acts.rend(); ++it) t.events.push_back({TraceEvent::Op::kFree, *it, 0, Lifetime::kTransient, Category::kActivations});
  // The next step wants one large transient buffer (e.g. a gradient bucket) of 40 MiB.
  t.events.push_back({TraceEvent::Op::kAlloc, id++, 40 * kMiB, Lifetime::kTransient, Category::kCommBuffers});

  TwoEndedBestFit two(t.capacity_bytes);
  SinglePoolBestFit one(t.capacity_bytes);
  ReplayResult r2 = replay(t, two, true);
  ReplayResult r1 = replay(t, one, true);
  EXPECT_EQ(r2.failed_allocs, 0u);
  EXPECT_EQ(r2.max_fragmentation, 0.0);
  EXPECT_EQ(r2.final_stats.persistent.reserved_bytes, 16 * kMiB);
  EXPECT_EQ(r2.final_stats.transient.reserved_bytes, 40 * kMiB);
  // One pool: 48 MiB are free but only 18 MiB in one piece (15 holes of 2 MiB between parameters),
  // so the 40 MiB buffer fails.
  EXPECT_EQ(r1.failed_allocs, 1u);
  EXPECT_DOUBLE_EQ(r1.max_fragmentation, 1.0 - 18.0 / 48.0);
  EXPECT_EQ(r1.final_stats.reserved_bytes, 46 * kMiB);
}

// A forward whose layers each use a scratch buffer larger than the last (i MiB) and save 1 MiB for
// backward, then a backward that frees the saved blocks newest first (Note [Saved blocks]).
TEST(AllocTrace, SavedBlocksStackBesideTheModelStates) {
  AllocTrace t;
  t.capacity_bytes = 64 * kMiB;
  uint64_t id = 1;
  t.events.push_back({TraceEvent::Op::kAlloc, id++, 4 * kMiB, Lifetime::kPersistent, Category::kParams});
  std::vector<uint64_t> saved;
  for (int layer = 1; layer <= 4; ++layer) {
    const uint64_t scratch = id++;
    t.events.push_back({TraceEvent::Op::kAlloc, scratch, layer * kMiB, Lifetime::kTransient, Category::kActivations});
    t.events.push_back({TraceEvent::Op::kAlloc, id, kMiB, Lifetime::kSaved, Category::kActivations});
    saved.push_back(id++);
    t.events.push_back({TraceEvent::Op::kFree, scratch, 0, Lifetime::kTransient, Category::kActivations});
  }
  for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
    t.events.push_back({TraceEvent::Op::kFree, *it, 0, Lifetime::kSaved, Category::kActivations});
  }
  TwoEndedBestFit pools(t.capacity_bytes);
  ReplayResult r = replay(t, pools, true);
  // The saved blocks stack on the parameters; each scratch buffer returns to the gap when freed, so
  // nothing is reserved beyond the live bytes: 4 MiB params + 4 saved + the 4 MiB scratch.
  EXPECT_EQ(r.failed_allocs, 0u);
  EXPECT_EQ(r.peak_allocated_bytes, 12 * kMiB);
  EXPECT_EQ(r.peak_reserved_bytes, 12 * kMiB);
  EXPECT_EQ(r.final_stats.persistent.reserved_bytes, 4 * kMiB);
  EXPECT_EQ(r.final_stats.transient.reserved_bytes, 0u);

  // Saved blocks placed as transient ones (the pools before kSaved): the third layer's saved block
  // lands beyond its 3 MiB scratch buffer, whose hole the next layer's 4 MiB scratch cannot use, so
  // the region reaches 10 MiB with 8 live.
  AllocTrace mixed = t;
  for (TraceEvent& e : mixed.events) {
    if (e.lifetime == Lifetime::kSaved) e.lifetime = Lifetime::kTransient;
  }
  TwoEndedBestFit old_pools(mixed.capacity_bytes);
  ReplayResult m = replay(mixed, old_pools, true);
  EXPECT_EQ(m.peak_allocated_bytes, 12 * kMiB);
  EXPECT_EQ(m.peak_reserved_bytes, 14 * kMiB);
}

}  // namespace
}  // namespace zs::memory
