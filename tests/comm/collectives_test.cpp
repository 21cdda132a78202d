// Every collective against a naive reference, for each dtype, uneven and zero-size shards, in-place
// forms and the byte counters. Runs at np 1, 2, 3, 4.
#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <thread>

#include "comm/comm.h"
#include "memory/shard.h"
#include "tests/comm/test_util.h"
#include "tests/support/mpi_test_env.h"

using namespace zs;
using memory::DType;
using memory::Tensor;

namespace {

const comm::Group& group() { return test::world().group(); }
constexpr DType kFloatTypes[] = {DType::kF32, DType::kBF16, DType::kF16};
constexpr size_t kSizes[] = {0, 1, 7, 1000, 4099};

TEST(Allreduce, SumAndAverageMatchReferenceForEveryDtype) {
  const auto& g = group();
  for (DType t : kFloatTypes) {
    for (size_t n : kSizes) {
      for (auto op : {comm::ReduceOp::kSum, comm::ReduceOp::kAverage}) {
        Tensor x = test::filled(t, n, g.rank());
        g.allreduce(x, op);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(test::as_float(x, i), test::reduced(t, g.size(), i, op == comm::ReduceOp::kAverage))
              << memory::dtype_name(t) << " n=" << n << " i=" << i;
        }
      }
    }
  }
}

TEST(Allreduce, Int32Sum) {
  const auto& g = group();
  Tensor x = test::filled(DType::kI32, 100, g.rank());
  g.allreduce(x);
  for (size_t i = 0; i < 100; ++i) ASSERT_EQ(test::as_float(x, i), test::reduced(DType::kI32, g.size(), i, false));
  EXPECT_THROW(g.allreduce(x, comm::ReduceOp::kAverage), CommError);
}

TEST(Allreduce, Bf16AccumulatesInFp32) {
  // 256 + 1 per extra rank: a bf16 running sum rounds every +1 away (spacing 2 at 256); fp32 keeps them.
  const auto& g = group();
  Tensor x = Tensor::empty({1}, DType::kBF16);
  x.data<uint16_t>()[0] = memory::f32_to_bf16(g.rank() == 0 ? 256.0f : 1.0f);
  g.allreduce(x);
  const float exact = 256.0f + static_cast<float>(g.size() - 1);
  EXPECT_EQ(test::as_float(x, 0), memory::bf16_to_f32(memory::f32_to_bf16(exact)));
}

// Note [16-bit reductions]: values whose sums round (unlike test::value's), reduced through shared
// memory ("auto", 20000 elements) and through MPI (shared_memory false): the same bits either way, and
// each the rank-order fp32 sum rounded once.
TEST(Reduce16Bit, SharedMemoryAndMpiPathsGiveTheSameBits) {
  const auto& g = group();
  comm::CommConfig off = g.config();
  off.shared_memory = comm::SharedMemory::kOff;
  const comm::Group g_mpi = g.dup("mpi_16bit", off);
  const size_t n = 20000;
  auto make = [&](DType t, int rank) {
    Tensor x = Tensor::empty({static_cast<int64_t>(n)}, t);
    for (size_t i = 0; i < n; ++i) {
      const float v = 1.0f + 0.37f * static_cast<float>((i * 13 + static_cast<size_t>(rank) * 7) % 101) / 7.0f;
      x.data<uint16_t>()[i] = t == DType::kBF16 ? memory::f32_to_bf16(v) : memory::f32_to_f16(v);
    }
    return x;
  };
  for (DType t : {DType::kBF16, DType::kF16}) {
    auto round16 = [t](float v) {
      return t == DType::kBF16 ? memory::bf16_to_f32(memory::f32_to_bf16(v)) : memory::f16_to_f32(memory::f32_to_f16(v));
    };
    Tensor a = make(t, g.rank()), b = make(t, g.rank());
    g.allreduce(a, comm::ReduceOp::kAverage);
    g_mpi.allreduce(b, comm::ReduceOp::kAverage);
    auto shards = memory::partition(n, g.size());
    const auto& mine = shards[static_cast<size_t>(g.rank())];
    Tensor c = make(t, g.rank()), d = make(t, g.rank());
    Tensor c_out = Tensor::empty({static_cast<int64_t>(mine.size)}, t), d_out = Tensor::empty({static_cast<int64_t>(mine.size)}, t);
    g.reduce_scatter(c, c_out, std::span<const memory::ShardRange>(shards));
    g_mpi.reduce_scatter(d, d_out, std::span<const memory::ShardRange>(shards));
    std::vector<Tensor> inputs;
    for (int r = 0; r < g.size(); ++r) inputs.push_back(make(t, r));
    for (size_t i = 0; i < n; ++i) {
      float sum = 0;
      for (int r = 0; r < g.size(); ++r) sum += test::as_float(inputs[static_cast<size_t>(r)], i);
      ASSERT_EQ(a.data<uint16_t>()[i], b.data<uint16_t>()[i]) << memory::dtype_name(t) << " i=" << i;
      ASSERT_EQ(test::as_float(a, i), round16(sum / static_cast<float>(g.size()))) << memory::dtype_name(t) << " i=" << i;
    }
    for (size_t i = 0; i < mine.size; ++i) {
      float sum = 0;
      for (int r = 0; r < g.size(); ++r) sum += test::as_float(inputs[static_cast<size_t>(r)], mine.offset + i);
      ASSERT_EQ(c_out.data<uint16_t>()[i], d_out.data<uint16_t>()[i]) << memory::dtype_name(t) << " i=" << i;
      ASSERT_EQ(test::as_float(c_out, i), round16(sum)) << memory::dtype_name(t) << " i=" << i;
    }
  }
}

std::vector<std::vector<size_t>> uneven_counts(int n) {
  std::vector<std::vector<size_t>> out;
  for (size_t total : {size_t{0}, size_t{1}, size_t{10}, size_t{1001}}) {
    std::vector<size_t> c;
    for (const auto& s : memory::partition(total, n)) c.push_back(s.size);
    out.push_back(c);
  }
  std::vector<size_t> zeros(static_cast<size_t>(n));  // every other rank empty
  for (int r = 0; r < n; ++r) zeros[static_cast<size_t>(r)] = r % 2 ? 0 : static_cast<size_t>(3 + 5 * r);
  out.push_back(zeros);
  out.push_back(std::vector<size_t>(static_cast<size_t>(n), 64));  // equal counts (block path)
  return out;
}

TEST(ReduceScatter, UnevenCountsAndZeroShards) {
  const auto& g = group();
  const size_t me = static_cast<size_t>(g.rank());
  for (DType t : kFloatTypes) {
    for (const auto& counts : uneven_counts(g.size())) {
      const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
      const size_t displ = std::accumulate(counts.begin(), counts.begin() + static_cast<long>(me), size_t{0});
      for (auto op : {comm::ReduceOp::kSum, comm::ReduceOp::kAverage}) {
        Tensor in = test::filled(t, total, g.rank());
        Tensor out = Tensor::empty({static_cast<int64_t>(counts[me])}, t);
        g.reduce_scatter(in, out, counts, op);
        for (size_t i = 0; i < counts[me]; ++i) {
          ASSERT_EQ(test::as_float(out, i), test::reduced(t, g.size(), displ + i, op == comm::ReduceOp::kAverage))
              << memory::dtype_name(t) << " total=" << total << " i=" << i;
        }
        // In place: the output is the input's own block.
        Tensor buf = test::filled(t, total, g.rank());
        g.reduce_scatter(buf, buf.range({displ, counts[me]}), counts, op);
        for (size_t i = 0; i < counts[me]; ++i) {
          ASSERT_EQ(test::as_float(buf, displ + i), test::reduced(t, g.size(), displ + i, op == comm::ReduceOp::kAverage));
        }
      }
    }
  }
}

TEST(ReduceScatter, ShardRangesFromPartition) {
  const auto& g = group();
  auto shards = memory::partition(1003, g.size(), 4);
  Tensor in = test::filled(DType::kF32, 1003, g.rank());
  const auto& mine = shards[static_cast<size_t>(g.rank())];
  Tensor out = Tensor::empty({static_cast<int64_t>(mine.size)}, DType::kF32);
  g.reduce_scatter(in, out, std::span<const memory::ShardRange>(shards));
  for (size_t i = 0; i < mine.size; ++i) ASSERT_EQ(out.data<float>()[i], test::reduced(DType::kF32, g.size(), mine.offset + i, false));
  // Shards that do not tile the buffer are rejected.
  auto bad = shards;
  bad[0].offset = 1;
  EXPECT_THROW(g.reduce_scatter(in, out, std::span<const memory::ShardRange>(bad)), CommError);
}

TEST(ReduceScatter, WrongSizesThrowNamingTheCollective) {
  const auto& g = group();
  Tensor in = Tensor::empty({10}, DType::kF32);
  Tensor out = Tensor::empty({3}, DType::kF32);
  std::vector<size_t> counts(static_cast<size_t>(g.size()), 1);  // sums to size(), not 10
  try {
    g.reduce_scatter(in, out, counts);
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("reduce_scatter"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("group 'world'"), std::string::npos) << e.what();
  }
}

TEST(Allgather, EqualAndUnevenAndInPlace) {
  const auto& g = group();
  const size_t me = static_cast<size_t>(g.rank());
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
    for (size_t n : kSizes) {
      Tensor in = test::filled(t, n, g.rank());
      Tensor out = Tensor::empty({static_cast<int64_t>(n) * g.size()}, t);
      g.allgather(in, out);
      for (int r = 0; r < g.size(); ++r)
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(test::as_float(out, r * n + i), test::stored(t, r, i));
      // In place: this rank's block already holds its input.
      Tensor buf = Tensor::empty({static_cast<int64_t>(n) * g.size()}, t);
      buf.range({me * n, n}).copy_from(in);
      g.allgather(buf.range({me * n, n}), buf);
      for (int r = 0; r < g.size(); ++r)
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(test::as_float(buf, r * n + i), test::stored(t, r, i));
    }
    for (const auto& counts : uneven_counts(g.size())) {
      const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
      Tensor in = test::filled(t, counts[me], g.rank(), 5);
      Tensor out = Tensor::empty({static_cast<int64_t>(total)}, t);
      g.allgatherv(in, out, counts);
      size_t pos = 0;
      for (int r = 0; r < g.size(); ++r)
        for (size_t i = 0; i < counts[static_cast<size_t>(r)]; ++i, ++pos)
          ASSERT_EQ(test::as_float(out, pos), test::stored(t, r, 5 + i)) << "total=" << total;
    }
  }
}

TEST(Broadcast, FromEveryRoot) {
  const auto& g = group();
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (int root = 0; root < g.size(); ++root) {
      Tensor x = test::filled(t, 333, g.rank());
      g.broadcast(x, root);
      for (size_t i = 0; i < 333; ++i) ASSERT_EQ(test::as_float(x, i), test::stored(t, root, i));
    }
  }
  Tensor x = Tensor::empty({4}, DType::kF32);
  EXPECT_THROW(g.broadcast(x, g.size()), CommError);
}

TEST(Alltoall, EqualBlocksAndUnevenCounts) {
  const auto& g = group();
  const int n = g.size();
  const size_t block = 5;
  Tensor in = test::filled(DType::kF32, block * n, g.rank());
  Tensor out = Tensor::empty({static_cast<int64_t>(block) * n}, DType::kF32);
  g.alltoall(in, out);
  for (int src = 0; src < n; ++src)
    for (size_t i = 0; i < block; ++i)
      ASSERT_EQ(out.data<float>()[src * block + i], test::value(src, g.rank() * block + i));
  // alltoallv: rank i sends (i + j) % 3 elements to rank j (zero counts included).
  auto count = [](int i, int j) { return static_cast<size_t>((i + j) % 3); };
  std::vector<size_t> send, recv;
  for (int j = 0; j < n; ++j) send.push_back(count(g.rank(), j));
  for (int i = 0; i < n; ++i) recv.push_back(count(i, g.rank()));
  const size_t send_total = std::accumulate(send.begin(), send.end(), size_t{0});
  const size_t recv_total = std::accumulate(recv.begin(), recv.end(), size_t{0});
  Tensor sin = test::filled(DType::kBF16, send_total, g.rank());
  Tensor sout = Tensor::empty({static_cast<int64_t>(recv_total)}, DType::kBF16);
  g.alltoallv(sin, send, sout, recv);
  size_t pos = 0;
  for (int i = 0; i < n; ++i) {
    size_t src_offset = 0;  // where rank i's block for me starts in its input
    for (int j = 0; j < g.rank(); ++j) src_offset += count(i, j);
    for (size_t k = 0; k < count(i, g.rank()); ++k, ++pos)
      ASSERT_EQ(test::as_float(sout, pos), test::stored(DType::kBF16, i, src_offset + k));
  }
}

// No rank leaves a barrier before the last one has entered it: ranks arrive 30 ms apart (rank r after
// r * 30 ms), and each rank's exit time, on the node's monotonic clock (one clock for every process of
// the node), is checked against every rank's entry time, gathered afterwards (as two int32 halves).
// Sync and async forms.
TEST(Barrier, NoRankLeavesBeforeTheLastArrives) {
  const auto& g = group();
  auto now_us = [] {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  for (bool async : {false, true}) {
    g.barrier();  // start together
    std::this_thread::sleep_for(std::chrono::milliseconds(30 * g.rank()));
    const int64_t entered = now_us();
    if (async) {
      g.barrier_async().wait();
    } else {
      g.barrier();
    }
    const int64_t left = now_us();
    Tensor mine = Tensor::empty({2}, DType::kI32);
    mine.data<int32_t>()[0] = static_cast<int32_t>(entered >> 31);
    mine.data<int32_t>()[1] = static_cast<int32_t>(entered & 0x7fffffff);
    Tensor all = Tensor::empty({2 * g.size()}, DType::kI32);
    g.allgather(mine, all);
    for (int r = 0; r < g.size(); ++r) {
      const int64_t other = (static_cast<int64_t>(all.data<int32_t>()[2 * r]) << 31) | all.data<int32_t>()[2 * r + 1];
      EXPECT_GE(left, other) << (async ? "async" : "sync") << ": rank " << g.rank() << " left before rank " << r
                             << " entered";
    }
  }
}

TEST(Counters, RingByteCounts) {
  auto& world = test::world();
  const auto& g = world.group();
  const uint64_t n = static_cast<uint64_t>(g.size());
  world.flush();
  world.reset_counters();
  Tensor x = test::filled(DType::kF32, 1200, g.rank());
  g.allreduce(x);
  auto c = world.counters();
  EXPECT_EQ(c.bytes_sent, 2 * (n - 1) * 1200 * 4 / n);
  EXPECT_EQ(c.bytes_received, c.bytes_sent);
  EXPECT_EQ(c.collectives, 1u);

  // bf16 reductions travel as bf16 (Note [16-bit reductions]): half the bytes of fp32.
  world.reset_counters();
  Tensor h = test::filled(DType::kBF16, 1200, g.rank());
  g.allreduce(h);
  EXPECT_EQ(world.counters().bytes_sent, 2 * (n - 1) * 1200 * 2 / n);

  // reduce-scatter / allgatherv: everything but this rank's own block.
  world.reset_counters();
  auto shards = memory::partition(1001, g.size());
  const auto& mine = shards[static_cast<size_t>(g.rank())];
  Tensor part = Tensor::empty({static_cast<int64_t>(mine.size)}, DType::kF32);
  Tensor full = test::filled(DType::kF32, 1001, g.rank());
  g.reduce_scatter(full, part, std::span<const memory::ShardRange>(shards));
  g.allgatherv(part, full, std::span<const memory::ShardRange>(shards));
  c = world.counters();
  EXPECT_EQ(c.bytes_sent, 2 * (1001 - mine.size) * 4 * (n > 1));
  EXPECT_EQ(c.bytes_received, c.bytes_sent);

  // broadcast: a chain from the root; sums over ranks balance.
  world.reset_counters();
  g.broadcast(x, 0);
  c = world.counters();
  EXPECT_EQ(c.bytes_sent, g.rank() < g.size() - 1 ? 1200u * 4 : 0u);
  EXPECT_EQ(c.bytes_received, g.rank() > 0 ? 1200u * 4 : 0u);
  Tensor totals = Tensor::empty({2}, DType::kI32);
  totals.data<int32_t>()[0] = static_cast<int32_t>(c.bytes_sent);
  totals.data<int32_t>()[1] = static_cast<int32_t>(c.bytes_received);
  g.allreduce(totals);
  EXPECT_EQ(totals.data<int32_t>()[0], totals.data<int32_t>()[1]);
}

// Group::bytes_sent: each group's own share of the World's bytes (the tensor-parallel bytes per step).
TEST(Counters, PerGroupBytes) {
  auto& world = test::world();
  const auto& g = world.group();
  const uint64_t n = static_cast<uint64_t>(g.size());
  comm::Group half = g.split(g.rank() % 2, g.rank(), "half");
  const uint64_t world_before = g.bytes_sent(), half_before = half.bytes_sent();
  Tensor x = test::filled(DType::kF32, 1200, g.rank());
  half.allreduce(x);
  const uint64_t h = static_cast<uint64_t>(half.size());
  EXPECT_EQ(half.bytes_sent() - half_before, 2 * (h - 1) * 1200 * 4 / h);
  EXPECT_EQ(g.bytes_sent(), world_before) << "the other group's collectives are not its bytes";
  g.allreduce(x);
  EXPECT_EQ(g.bytes_sent() - world_before, 2 * (n - 1) * 1200 * 4 / n);
  comm::Group sim = comm::Group::simulated(0, 4, "sim");
  sim.allreduce(x);
  EXPECT_EQ(sim.bytes_sent(), 2u * 3 * 1200 * 4 / 4) << "a simulated group counts what the real one would send";
}

}  // namespace
