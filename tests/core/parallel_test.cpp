#include "core/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace zs {
namespace {

TEST(Parallel, ChunkCountIsBoundedByThreadsAndGrain) {
  EXPECT_EQ(parallel_chunks(4, 100, 10), 4);
  EXPECT_EQ(parallel_chunks(4, 25, 10), 3);
  EXPECT_EQ(parallel_chunks(4, 5, 10), 1);
  EXPECT_EQ(parallel_chunks(1, 1000, 1), 1);
  EXPECT_EQ(parallel_chunks(0, 1000, 1), 1);
  EXPECT_EQ(parallel_chunks(3, 0, 1), 1);
}

TEST(Parallel, RangesTileTheIndexSpaceInOrder) {
  for (int threads : {1, 2, 3, 5}) {
    for (int64_t n : {1, 2, 7, 100, 1001}) {
      const int chunks = parallel_chunks(threads, n, 1);
      std::vector<std::pair<int64_t, int64_t>> ranges(chunks, {-1, -1});
      std::vector<std::atomic<int>> hits(n);
      parallel_for_threads(threads, n, 1, [&](int64_t b, int64_t e, int c) {
        ranges[c] = {b, e};
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " index " << i;
      int64_t at = 0;
      for (int c = 0; c < chunks; ++c) {
        EXPECT_EQ(ranges[c].first, at);
        EXPECT_EQ(ranges[c].first, n * c / chunks);
        at = ranges[c].second;
      }
      EXPECT_EQ(at, n);
    }
  }
}

TEST(Parallel, UsesSeveralThreadsAndNestedCallsRunInline) {
  std::mutex mu;
  std::set<std::thread::id> ids;
  std::atomic<int64_t> inner{0};
  parallel_for_threads(2, 2, 1, [&](int64_t, int64_t, int) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ids.insert(std::this_thread::get_id());
    }
    // Keep both ranges busy long enough that a worker takes one.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    parallel_for_threads(2, 100, 1, [&](int64_t b, int64_t e, int) { inner += e - b; });
  });
  EXPECT_EQ(inner.load(), 200);
  EXPECT_GE(ids.size(), 1u);  // a worker may wake late; the caller then runs both ranges
}

TEST(Parallel, TheCallerRunsTheFirstChunk) {
  // The caller claims chunks from the front and workers from the back, a 2-chunk region only by the
  // first worker (the earlier tests started more), so a worker reaches chunk 0 only after chunk 1
  // (core/parallel.cpp, Note [worker pool]); chunk 1 here holds its thread until chunk 0 has begun,
  // so chunk 0 runs on the caller in every region, however early a worker wakes.
  const std::thread::id caller = std::this_thread::get_id();
  for (int region = 0; region < 200; ++region) {
    std::atomic<bool> first_began{false};
    std::thread::id first_on;
    parallel_for_threads(2, 2, 1, [&](int64_t, int64_t, int chunk) {
      if (chunk == 0) {
        first_on = std::this_thread::get_id();
        first_began.store(true);
      } else {
        while (!first_began.load()) std::this_thread::yield();
      }
    });
    ASSERT_EQ(first_on, caller) << "region " << region;
  }
}

TEST(Parallel, ConcurrentCallersTakeTurns) {
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 3; ++t) {
    callers.emplace_back([&] {
      for (int r = 0; r < 50; ++r) parallel_for_threads(2, 1000, 10, [&](int64_t b, int64_t e, int) { total += e - b; });
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(total.load(), 3 * 50 * 1000);
}

// A worker's chunk that outlasts the caller's spin: the caller sleeps on the futex (Note [pool waits])
// and must wake when the last chunk ends, seeing everything the chunks wrote; many regions in a row,
// so a late wake-up of one region cannot leak into the next.
TEST(Parallel, CallerWaitsPastItsSpinForSlowChunks) {
  for (int r = 0; r < 30; ++r) {
    std::vector<int64_t> out(4, -1);
    parallel_for_threads(4, 4, 1, [&](int64_t b, int64_t e, int chunk) {
      if (chunk % 2 == 1) std::this_thread::sleep_for(std::chrono::microseconds(300 + (100 * r) % 700));
      for (int64_t i = b; i < e; ++i) out[static_cast<size_t>(i)] = i * 10 + r;
    });
    for (int64_t i = 0; i < 4; ++i) ASSERT_EQ(out[static_cast<size_t>(i)], i * 10 + r) << "region " << r;
  }
}

// Workers poll for the next region, sleep after it, or are parked (Note [worker spin]): regions
// right after one another, after a park from inside and outside a region, and after a gap longer
// than the poll all run every chunk once, with every write seen by the caller.
TEST(Parallel, RegionsRunWhetherWorkersPollSleepOrAreParked) {
  for (int r = 0; r < 60; ++r) {
    std::vector<int64_t> out(3, -1);
    parallel_for_threads(3, 3, 1, [&](int64_t b, int64_t e, int chunk) {
      if (chunk == 1 && r % 3 == 0) park_pool_workers();
      for (int64_t i = b; i < e; ++i) out[static_cast<size_t>(i)] = i * 10 + r;
    });
    for (int64_t i = 0; i < 3; ++i) ASSERT_EQ(out[static_cast<size_t>(i)], i * 10 + r) << "region " << r;
    if (r % 4 == 1) park_pool_workers();
    if (r % 10 == 5) std::this_thread::sleep_for(std::chrono::microseconds(600));  // past the poll: asleep
  }
}

}  // namespace
}  // namespace zs
