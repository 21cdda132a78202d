// One-sided gathers (comm/shared_shards.h, Note [One-sided gathers]): the same bytes as the
// allgatherv they replace and counted as it (bytes, tallies, shared-memory and direct counts); the
// write guard (a writer waits until every peer has finished reading the version it overwrites); a
// stalled peer ends the reader with a CommError naming it after comm.timeout_s; inactive on every rank
// alike where it cannot work. A killed or stopped peer ending the job: comm_shards_stop / _kill
// (tests/comm/mismatch_main.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "memory/shared_mapping.h"
#include "tests/comm/test_util.h"
#include "tests/support/mpi_test_env.h"

using namespace zs;
using memory::DType;
using memory::Tensor;

namespace {

// Shards of a flat buffer of `total` elements: rank r owns [start(r), start(r) + size(r)), uneven.
struct Layout {
  std::vector<size_t> start, size;
  size_t total = 0;
  explicit Layout(int n, int empty = -1) {  // `empty`: a rank that owns nothing (a small layout's tail)
    for (int r = 0; r < n; ++r) {
      start.push_back(total);
      size.push_back(r == empty ? 0 : size_t{300000} + 4099 * static_cast<size_t>(r));
      total += size.back();
    }
  }
  // The counts and in-shard offsets of range [a, b) of the flat buffer.
  void split(size_t a, size_t b, std::vector<size_t>& counts, std::vector<size_t>& offsets) const {
    counts.assign(start.size(), 0);
    offsets.assign(start.size(), 0);
    for (size_t r = 0; r < start.size(); ++r) {
      const size_t lo = std::max(a, start[r]), hi = std::min(b, start[r] + size[r]);
      if (hi > lo) {
        counts[r] = hi - lo;
        offsets[r] = lo - start[r];
      }
    }
  }
};

// This rank's shard in a shared mapping registered over the group, holding version `v`'s values.
struct Shard {
  memory::SharedMapping mapping = memory::SharedMapping::create(size_t{8} << 20);
  Tensor values;
  Shard(const Layout& l, int rank, DType t) {
    values = Tensor(static_cast<char*>(mapping.data()) + 4096, t, {static_cast<int64_t>(l.size[static_cast<size_t>(rank)])});
    fill(l, rank, 1);
  }
  void fill(const Layout& l, int rank, int v) {
    const Tensor x = test::random_values(values.dtype(), static_cast<size_t>(values.numel()), rank * 16 + v,
                                         l.start[static_cast<size_t>(rank)]);
    std::memcpy(values.raw(), x.raw(), static_cast<size_t>(x.numel()) * memory::dtype_size(x.dtype()));
  }
  size_t bytes() const { return static_cast<size_t>(values.numel()) * memory::dtype_size(values.dtype()); }
};

// What the gather of [a, b) must hold: each owner's version-v values.
Tensor expected(const Layout& l, DType t, size_t a, size_t b, int v) {
  Tensor out = test::empty(b - a, t);
  const size_t es = memory::dtype_size(t);
  for (size_t r = 0; r < l.start.size(); ++r) {
    const size_t lo = std::max(a, l.start[r]), hi = std::min(b, l.start[r] + l.size[r]);
    if (hi <= lo) continue;
    const Tensor x = test::random_values(t, hi - lo, static_cast<int>(r) * 16 + v, lo);
    std::memcpy(static_cast<char*>(out.raw()) + (lo - a) * es, x.raw(), (hi - lo) * es);
  }
  return out;
}

comm::OpStats allgatherv_stats(const comm::Group& g) {
  for (const comm::OpStats& s : g.op_stats()) {
    if (s.name == "allgatherv") return s;
  }
  return {};
}

TEST(SharedShards, GathersAndCountsWhatAllgathervDoes) {
  comm::Group g = test::world_with_shared_memory(comm::SharedMemory::kAuto, "shards_ag");
  const int n = g.size(), me = g.rank();
  const Layout l(n);
  for (DType t : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(memory::dtype_name(t));
    Shard shard(l, me, t);
    comm::SharedArena arena(g, &shard.mapping);
    comm::SharedShards shards(g, shard.values.raw(), shard.bytes());
    ASSERT_EQ(shards.active(), n > 1) << shards.inactive_reason();
    if (!shards.active()) continue;
    // Ranges: inside one shard (small path, under 4 KiB per rank), across every shard (direct path,
    // past the streaming threshold), one rank's block empty, the whole buffer.
    const size_t last = l.start.back();
    const std::vector<std::pair<size_t, size_t>> ranges = {
        {10, 900}, {l.size[0] - 700, l.size[0] + 500}, {1000, l.total - 1000}, {last + 5, l.total}, {0, l.total}};
    for (const auto& [a, b] : ranges) {
      SCOPED_TRACE(std::to_string(a) + ".." + std::to_string(b));
      std::vector<size_t> counts, offsets;
      l.split(a, b, counts, offsets);
      const comm::CommCounters c0 = g.counters();
      const comm::OpStats s0 = allgatherv_stats(g);
      Tensor one_sided = test::empty(b - a, t);
      shards.allgatherv(offsets, one_sided, counts);
      const comm::CommCounters c1 = g.counters();
      const comm::OpStats s1 = allgatherv_stats(g);
      Tensor collective = test::empty(b - a, t);
      const size_t es = memory::dtype_size(t);
      g.allgatherv(shard.values.slice(0, static_cast<int64_t>(offsets[static_cast<size_t>(me)]),
                                      static_cast<int64_t>(offsets[static_cast<size_t>(me)] + counts[static_cast<size_t>(me)])),
                   collective, counts);
      const comm::CommCounters c2 = g.counters();
      const comm::OpStats s2 = allgatherv_stats(g);
      EXPECT_TRUE(test::same_bits(one_sided, collective));
      EXPECT_TRUE(test::same_bits(one_sided, expected(l, t, a, b, 1)));
      EXPECT_EQ(c1.bytes_sent - c0.bytes_sent, c2.bytes_sent - c1.bytes_sent);
      EXPECT_EQ(c1.bytes_sent - c0.bytes_sent, (b - a - counts[static_cast<size_t>(me)]) * es);
      EXPECT_EQ(c1.bytes_received - c0.bytes_received, c2.bytes_received - c1.bytes_received);
      EXPECT_EQ(c1.collectives - c0.collectives, 1u);
      EXPECT_EQ(c2.collectives - c1.collectives, 1u);
      EXPECT_EQ(c1.shared_memory_collectives - c0.shared_memory_collectives, c2.shared_memory_collectives - c1.shared_memory_collectives);
      EXPECT_EQ(c1.direct_collectives - c0.direct_collectives, c2.direct_collectives - c1.direct_collectives);
      EXPECT_EQ(s1.count - s0.count, 1u);
      EXPECT_EQ(s1.bytes_sent - s0.bytes_sent, s2.bytes_sent - s1.bytes_sent);
    }
  }
}

TEST(SharedShards, InactiveAlikeOnEveryRankWhereItCannotWork) {
  comm::Group g = test::world_with_shared_memory(comm::SharedMemory::kAuto, "shards_off");
  comm::Group mpi = test::world_with_shared_memory(comm::SharedMemory::kOff, "shards_off_mpi");
  const Layout l(g.size());
  Shard shard(l, g.rank(), DType::kBF16);
  comm::SharedArena arena(g, &shard.mapping);
  comm::SharedShards on_mpi(mpi, shard.values.raw(), shard.bytes());  // MPI's collectives: never
  EXPECT_FALSE(on_mpi.active());
  // One rank's shard in private memory: inactive on every rank, saying why.
  Tensor private_shard = test::random_values(DType::kBF16, 100, g.rank());
  comm::SharedShards partly(g, g.rank() == 0 ? private_shard.raw() : shard.values.raw(), g.rank() == 0 ? 200 : shard.bytes());
  EXPECT_FALSE(partly.active());
  if (g.size() > 1) {
    EXPECT_NE(partly.inactive_reason().find("shared arena"), std::string::npos) << partly.inactive_reason();
  }
}

// A rank whose shard is empty takes part (it is never read from; its pointer need not be in the arena).
TEST(SharedShards, EmptyShardTakesPart) {
  comm::Group g = test::world_with_shared_memory(comm::SharedMemory::kAuto, "shards_empty");
  const int n = g.size(), me = g.rank();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  const Layout l(n, 1);
  Shard shard(l, me, DType::kBF16);
  comm::SharedArena arena(g, &shard.mapping);
  comm::SharedShards shards(g, me == 1 ? nullptr : shard.values.raw(), shard.bytes());
  ASSERT_TRUE(shards.active()) << shards.inactive_reason();
  std::vector<size_t> counts, offsets;
  l.split(0, l.total, counts, offsets);
  Tensor out = test::empty(l.total, DType::kBF16);
  shards.allgatherv(offsets, out, counts);
  EXPECT_TRUE(test::same_bits(out, expected(l, DType::kBF16, 0, l.total, 1)));
  test::world().group().barrier();
}

// The writer waits for a late reader; the reader sees the old version, then (after the write) the new.
TEST(SharedShards, WriterWaitsUntilEveryPeerHasRead) {
  comm::Group g = test::world_with_shared_memory(comm::SharedMemory::kAuto, "shards_guard");
  const int n = g.size(), me = g.rank();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  const Layout l(n);
  Shard shard(l, me, DType::kBF16);
  comm::SharedArena arena(g, &shard.mapping);
  comm::SharedShards shards(g, shard.values.raw(), shard.bytes());
  ASSERT_TRUE(shards.active()) << shards.inactive_reason();
  std::vector<size_t> counts, offsets;
  l.split(0, l.total, counts, offsets);
  Tensor out = test::empty(l.total, DType::kBF16);
  if (me == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the peers are in begin_write by now
    shards.allgatherv(offsets, out, counts);
    EXPECT_TRUE(test::same_bits(out, expected(l, DType::kBF16, 0, l.total, 1))) << "a peer wrote before rank 0 had read";
  }
  shards.begin_write();  // the peers wait here for rank 0's reads (checked by what rank 0 read)
  shard.fill(l, me, 2);
  shards.end_write();
  EXPECT_EQ(shards.version(), 2u);
  shards.allgatherv(offsets, out, counts);  // waits for every peer's version 2
  EXPECT_TRUE(test::same_bits(out, expected(l, DType::kBF16, 0, l.total, 2)));
  test::world().group().barrier();  // nobody unmaps a shard a peer still reads
}

TEST(SharedShards, StalledPeerIsACommErrorNamingIt) {
  comm::Group g = test::world_with_shared_memory(comm::SharedMemory::kAuto, "shards_stall", 0.5);
  const int n = g.size(), me = g.rank();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  const Layout l(n);
  Shard shard(l, me, DType::kBF16);
  comm::SharedArena arena(g, &shard.mapping);
  comm::SharedShards shards(g, shard.values.raw(), shard.bytes());
  ASSERT_TRUE(shards.active()) << shards.inactive_reason();
  std::vector<size_t> counts, offsets;
  l.split(0, l.total, counts, offsets);
  Tensor out = test::empty(l.total, DType::kBF16);
  shards.begin_write();
  if (me == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // stalls in its "optimizer step"
  shards.end_write();
  if (me == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      shards.allgatherv(offsets, out, counts);
      FAIL() << "expected a timeout";
    } catch (const CommError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("timed out after 0.5 s waiting for rank 1 (world rank 1) to publish version 2"), std::string::npos) << m;
      EXPECT_NE(m.find("group 'shards_stall'"), std::string::npos) << m;
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.15);
    try {  // the group is unusable afterwards, and says so at once
      shards.allgatherv(offsets, out, counts);
      FAIL() << "expected CommError";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("unusable"), std::string::npos) << e.what();
    }
  }
  test::world().group().barrier();
}

}  // namespace
