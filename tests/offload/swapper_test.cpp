// PipelinedSwapper: a randomized stress test against an in-memory model (random sub-group sizes,
// modes, buffer counts, aio settings and injected short transfers, two swap files, repeated runs),
// error propagation with every transfer drained, the host-memory budget and the item checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "core/errors.h"
#include "offload/swapper.h"
#include "tests/offload/offload_test_util.h"

namespace zs::offload {
namespace {

using memory::Category;
using memory::MemoryTracker;
using memory::Tier;
using test::TempDir;

// Floats: x -> 3x + 1 for read-write items; write-only items get a value derived from (run, group,
// index); read-only items are only checked.
float write_only_value(int run, size_t group, size_t i) { return static_cast<float>(run * 1000 + group) + 0.25f * i; }

struct Plan {
  std::vector<std::vector<SwapItem>> groups;
  // The model: the expected float contents of every item's bytes, by (group, item).
  std::vector<std::vector<std::vector<float>>> model;
};

// Builds random sub-groups over two swap spaces; each item is its own region (or a 4096-aligned
// slice of one) and every region starts with known contents.
Plan make_plan(std::mt19937_64& rng, SwapSpace& a, SwapSpace& b, size_t groups) {
  Plan p;
  for (size_t g = 0; g < groups; ++g) {
    std::vector<SwapItem> items;
    std::vector<std::vector<float>> model;
    const size_t n_items = 1 + rng() % 4;
    for (size_t k = 0; k < n_items; ++k) {
      SwapSpace& s = (rng() % 2) ? a : b;
      const size_t floats = 1 + rng() % 30000;
      const bool slice = rng() % 3 == 0;  // an item that is the second half of a larger region
      const size_t lead = slice ? 4096 * (1 + rng() % 3) : 0;
      SwapRegion r = s.allocate(lead + floats * 4);
      const auto mode = static_cast<SwapMode>(rng() % 3);
      std::vector<float> init(floats);
      for (size_t i = 0; i < floats; ++i) init[i] = static_cast<float>(g * 7 + k) + 0.5f * static_cast<float>(i % 97);
      AlignedBuffer buf(floats * 4);
      std::memcpy(buf.data(), init.data(), floats * 4);
      s.write(r, lead, buf.span());
      items.push_back(SwapItem{.region = r, .offset = lead, .bytes = floats * 4, .mode = mode});
      model.push_back(std::move(init));
    }
    p.groups.push_back(std::move(items));
    p.model.push_back(std::move(model));
  }
  return p;
}

void check_against_model(const Plan& p) {
  for (size_t g = 0; g < p.groups.size(); ++g) {
    for (size_t k = 0; k < p.groups[g].size(); ++k) {
      const SwapItem& it = p.groups[g][k];
      AlignedBuffer buf(it.bytes);
      it.region.space->read(it.region, it.offset, buf.span());
      ASSERT_EQ(std::memcmp(buf.data(), p.model[g][k].data(), it.bytes), 0) << "group " << g << " item " << k;
    }
  }
}

// The compute function of run `run`: checks what was read, then transforms it.
PipelinedSwapper::ComputeFn transform(Plan& p, int run, std::vector<size_t>& order, bool& read_ok) {
  return [&p, run, &order, &read_ok](size_t g, std::span<std::span<std::byte>> items) {
    order.push_back(g);
    EXPECT_EQ(items.size(), p.groups[g].size());
    for (size_t k = 0; k < items.size(); ++k) {
      const SwapItem& it = p.groups[g][k];
      EXPECT_EQ(items[k].size(), it.bytes);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(items[k].data()) % kIoAlignment, 0u);
      auto* x = reinterpret_cast<float*>(items[k].data());
      std::vector<float>& m = p.model[g][k];
      if (it.mode != SwapMode::kWriteOnly && std::memcmp(x, m.data(), it.bytes) != 0) read_ok = false;
      for (size_t i = 0; i < m.size(); ++i) {
        if (it.mode == SwapMode::kReadWrite) {
          x[i] = x[i] * 3.0f + 1.0f;
          m[i] = m[i] * 3.0f + 1.0f;
        } else if (it.mode == SwapMode::kWriteOnly) {
          x[i] = m[i] = write_only_value(run, g, i);
        } else {
          x[i] = -1.0f;  // read-only: scribbling on the buffer must not reach the file
        }
      }
    }
  };
}

TEST(PipelinedSwapper, RandomizedStressAgainstAModel) {
  TempDir dir;
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 8; ++trial) {
    AioConfig aio;
    aio.block_size = 4096u << (rng() % 5);
    aio.queue_depth = 1 + static_cast<int>(rng() % 8);
    aio.thread_count = 1 + static_cast<int>(rng() % 2);
    aio.single_submit = rng() % 2;
    aio.overlap_events = rng() % 2;
    const size_t groups = 1 + rng() % 7;
    // Upper bound on what make_plan allocates: per item 3 * 4096 lead + 120000 bytes, rounded.
    const size_t reserve = groups * 4 * (3 * 4096 + io_align_up(30000 * 4));
    SwapSpace a(dir.path(), trial, "a", reserve, aio), b(dir.path(), trial, "b", reserve, aio);
    Plan p = make_plan(rng, a, b, groups);
    MemoryTracker tracker;
    const size_t buffer_count = 1 + rng() % 4;
    PipelinedSwapper swapper(p.groups, {.buffer_count = buffer_count, .tracker = &tracker});
    EXPECT_EQ(swapper.buffer_count(), std::min(buffer_count, groups));
    EXPECT_EQ(tracker.current(Category::kOffloadBuffers, Tier::kHost), swapper.host_buffer_bytes());
    size_t largest = 0;
    for (auto& g : p.groups) largest = std::max(largest, PipelinedSwapper::sub_group_buffer_bytes(g));
    EXPECT_EQ(swapper.host_buffer_bytes(), PipelinedSwapper::host_budget_bytes(largest, swapper.buffer_count()));
    EXPECT_LE(swapper.host_buffer_bytes(), PipelinedSwapper::host_budget_bytes(largest, buffer_count));
    for (int run = 0; run < 3; ++run) {
      FaultPlan faults{.short_every = rng() % 4, .seed = rng()};  // 0: no faults this run
      a.file().set_fault_plan(faults);
      b.file().set_fault_plan(faults);
      std::vector<size_t> order;
      bool read_ok = true;
      // Half the runs start their first reads early (what the engine does during backward); a second
      // prefetch before run() changes nothing.
      if (rng() % 2) {
        swapper.prefetch();
        if (rng() % 2) swapper.prefetch();
      }
      swapper.run(transform(p, run, order, read_ok));
      EXPECT_TRUE(read_ok) << "trial " << trial << " run " << run << ": compute saw wrong data";
      std::vector<size_t> expected(groups);
      for (size_t g = 0; g < groups; ++g) expected[g] = g;
      EXPECT_EQ(order, expected);
      EXPECT_EQ(a.file().requests_in_flight() + b.file().requests_in_flight(), 0u);
      a.file().set_fault_plan({});
      b.file().set_fault_plan({});
      check_against_model(p);
    }
    uint64_t rbytes = 0, wbytes = 0;
    for (auto& g : p.groups) {
      for (auto& it : g) {
        if (it.mode != SwapMode::kWriteOnly) rbytes += io_align_up(it.bytes);
        if (it.mode != SwapMode::kReadOnly) wbytes += io_align_up(it.bytes);
      }
    }
    const SwapperStats& s = swapper.stats();
    EXPECT_EQ(s.runs, 3u);
    EXPECT_EQ(s.sub_groups, 3 * groups);
    EXPECT_EQ(s.bytes_read, 3 * rbytes);
    EXPECT_EQ(s.bytes_written, 3 * wbytes);
    EXPECT_GE(s.run_seconds, s.compute_seconds);
  }
}

TEST(PipelinedSwapper, PrefetchedReadsAreDrainedWhenRunNeverComes) {
  TempDir dir;
  SwapSpace a(dir.path(), 0, "a", 1 << 20, AioConfig{});
  std::vector<std::vector<SwapItem>> groups;
  for (size_t g = 0; g < 4; ++g) groups.push_back({{a.allocate(64 << 10), 0, 64 << 10, SwapMode::kReadWrite}});
  {
    PipelinedSwapper swapper(groups, {.buffer_count = 3});
    swapper.prefetch();
  }  // the destructor waits for the reads before freeing the buffers (ASan would see a late write)
  EXPECT_EQ(a.file().requests_in_flight(), 0u);
}

TEST(PipelinedSwapper, IoErrorMidRunIsRaisedAfterEverythingDrained) {
  TempDir dir;
  for (FaultOp op : {FaultOp::kWrite, FaultOp::kRead}) {
    for (uint64_t nth : {1, 3, 7}) {
      AioConfig aio;
      aio.block_size = 16 << 10;
      aio.queue_depth = 4;
      SwapSpace s(dir.path(), 0, "err", 8 * 4 * io_align_up(50000), aio);
      std::vector<std::vector<SwapItem>> groups(8);
      for (auto& g : groups) {
        for (int k = 0; k < 4; ++k) g.push_back(SwapItem{.region = s.allocate(50000), .bytes = 50000});
      }
      PipelinedSwapper swapper(groups, {.buffer_count = 3});
      s.file().set_fault_plan(FaultPlan{.fail_nth = nth, .fail_errno = EIO, .fail_op = op});
      size_t computed = 0;
      std::string msg;
      try {
        swapper.run([&](size_t, std::span<std::span<std::byte>>) { ++computed; });
        ADD_FAILURE() << "run() must fail";
      } catch (const IoError& e) {
        msg = e.what();
      }
      EXPECT_HAS(msg, s.path());
      EXPECT_HAS(msg, op == FaultOp::kWrite ? "write of" : "read of");
      EXPECT_HAS(msg, "Input/output error");
      EXPECT_LT(computed, groups.size());
      EXPECT_EQ(s.file().requests_in_flight(), 0u) << "every transfer waited for before run() returned";
      // The swapper is usable again once the fault is gone.
      s.file().set_fault_plan({});
      EXPECT_NO_THROW(swapper.run([](size_t, std::span<std::span<std::byte>>) {}));
    }
  }
}

TEST(PipelinedSwapper, ComputeExceptionPropagatesAfterDraining) {
  TempDir dir;
  SwapSpace s(dir.path(), 0, "cx", 6 * 4096 * 16, AioConfig{});
  std::vector<std::vector<SwapItem>> groups(6);
  for (auto& g : groups) g.push_back(SwapItem{.region = s.allocate(4096 * 16), .bytes = 4096 * 16});
  PipelinedSwapper swapper(groups, {.buffer_count = 4});
  EXPECT_THROW(swapper.run([](size_t g, std::span<std::span<std::byte>>) {
    if (g == 2) throw std::logic_error("bad step");
  }),
               std::logic_error);
  EXPECT_EQ(s.file().requests_in_flight(), 0u);
}

TEST(PipelinedSwapper, WriteOnlyItemsAreNeverRead) {
  TempDir dir;
  SwapSpace s(dir.path(), 0, "wo", 4 * 8192, AioConfig{});
  std::vector<std::vector<SwapItem>> groups(4);
  for (auto& g : groups) g.push_back(SwapItem{.region = s.allocate(8000), .bytes = 8000, .mode = SwapMode::kWriteOnly});
  PipelinedSwapper swapper(groups);
  swapper.run([](size_t g, std::span<std::span<std::byte>> items) {
    std::memset(items[0].data(), static_cast<int>(g + 1), items[0].size());
  });
  EXPECT_EQ(swapper.stats().bytes_read, 0u);
  EXPECT_EQ(s.file().stats().bytes_read, 0u);
  EXPECT_EQ(swapper.stats().bytes_written, 4u * 8192u);
  AlignedBuffer back(8000);
  s.read(groups[3][0].region, 0, back.span());
  EXPECT_EQ(back.data()[7999], std::byte{4});
}

TEST(PipelinedSwapper, BudgetAndItemChecks) {
  EXPECT_EQ(PipelinedSwapper::host_budget_bytes(10000, 3), 3u * 12288u);
  const size_t items[] = {1, 4096, 4097};
  EXPECT_EQ(PipelinedSwapper::sub_group_buffer_bytes(items), 4096u + 4096u + 8192u);

  TempDir dir;
  SwapSpace s(dir.path(), 0, "chk", 8 * 4096, AioConfig{});
  SwapRegion r = s.allocate(4 * 4096);
  auto make = [](std::vector<std::vector<SwapItem>> g) { PipelinedSwapper p(std::move(g)); };
  EXPECT_THROW(make({{SwapItem{.region = r, .offset = 100, .bytes = 10}}}), InternalError);
  EXPECT_THROW(make({{SwapItem{.region = r, .offset = 4096, .bytes = 4 * 4096}}}), InternalError);
  EXPECT_THROW(make({{SwapItem{.region = SwapRegion{}, .bytes = 10}}}), InternalError);
  EXPECT_THROW(make({{SwapItem{.region = r, .bytes = 5000}}, {SwapItem{.region = r, .offset = 4096, .bytes = 10}}}),
               InternalError)
      << "the first item's rounded range [0, 8192) overlaps the second";
  EXPECT_NO_THROW(make({{SwapItem{.region = r, .bytes = 4096}}, {SwapItem{.region = r, .offset = 4096, .bytes = 10}}}));
  EXPECT_THROW(PipelinedSwapper({}, {.buffer_count = 0}), ConfigError);
  PipelinedSwapper none({});
  EXPECT_NO_THROW(none.run([](size_t, std::span<std::span<std::byte>>) { ADD_FAILURE(); }));
  EXPECT_EQ(none.host_buffer_bytes(), 0u);
}

}  // namespace
}  // namespace zs::offload
