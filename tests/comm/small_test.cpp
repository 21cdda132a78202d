// The small collectives (Note [Small collectives] in comm/detail/small.h): at sizes across the 4 KiB
// limit, every collective that takes the path, every dtype, sums and averages, gives the bits of the
// MPI path (comm.shared_memory false), and takes the path exactly where the rule says; small ops
// interleaved over overlapping groups and async (the buffers' reuse); a size mismatch across the
// limit, and different collectives below it, throw on every rank. The stalled peer: the
// comm_small_stall expected-failure runs (tests/comm/CMakeLists.txt).
#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/detail/shm.h"
#include "comm/detail/small.h"
#include "tests/comm/test_util.h"
#include "tests/support/mpi_test_env.h"

using namespace zs;
using memory::DType;
using memory::Tensor;

namespace {

bool single_node() {
  const int k = test::world().config().shared_memory_node_ranks;
  return k == 0 || k >= test::world().size();
}

uint64_t shm_count() { return test::world().counters().shared_memory_collectives; }

const DType kTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kI32};
constexpr size_t kLimit = comm::detail::kSmallMaxBytes;

// Elements per rank of dtype t around the limit: tiny, below, at, just over, and well over it.
std::vector<size_t> sizes_across(DType t) {
  const size_t es = memory::dtype_size(t);
  return {1, 3, 100, kLimit / es - 1, kLimit / es, kLimit / es + 1, 3 * kLimit / es};
}

// Shared-memory collectives counted for one call under "auto": the small path (`carried` bytes per
// rank within the limit; an fp32 sum only on two ranks), else the staged one from kShmAutoMinBytes
// (`whole`: the tensor the staged path sizes by; never for broadcast, whole = 0).
uint64_t counted(bool shared, size_t carried, size_t whole, bool fp32_sum, int n) {
  if (!shared) return 0;
  if (carried <= kLimit && (!fp32_sum || n == 2)) return 1;
  return whole >= comm::detail::kShmAutoMinBytes ? 1 : 0;
}

void expect_same(const Tensor& a, const Tensor& b, const std::string& what) {
  EXPECT_TRUE(test::same_bits(a, b)) << what << ": differs from the MPI path";
}

TEST(Small, EveryCollectiveMatchesTheMpiPathBitwiseAcrossTheLimit) {
  comm::Group fast = test::world_with_shared_memory(comm::SharedMemory::kAuto, "small_auto");
  comm::Group on = test::world_with_shared_memory(comm::SharedMemory::kOn, "small_on");
  comm::Group mpi = test::world_with_shared_memory(comm::SharedMemory::kOff, "small_mpi");
  const int n = fast.size(), me = fast.rank();
  const bool shared = n > 1 && single_node();
  for (DType t : kTypes) {
    const size_t es = memory::dtype_size(t);
    for (size_t m : sizes_across(t)) {
      const std::string at = std::string(memory::dtype_name(t)) + ", " + std::to_string(m) + " elements";
      const size_t total = m * static_cast<size_t>(n);
      for (bool average : {false, true}) {
        if (t == DType::kI32 && average) continue;
        const comm::ReduceOp op = average ? comm::ReduceOp::kAverage : comm::ReduceOp::kSum;
        // allreduce of m elements: the path where the rule takes it, the MPI path's bits always.
        Tensor a = test::filled(t, m, me), b = test::filled(t, m, me);
        uint64_t before = shm_count();
        fast.allreduce(a, op);
        const bool fp32 = t == DType::kF32;
        EXPECT_EQ(shm_count() - before, counted(shared, m * es, m * es, fp32, n)) << "allreduce " << at;
        mpi.allreduce(b, op);
        expect_same(a, b, "allreduce " + at);
        // reduce-scatter of m elements per rank (the whole input rides), in place and not.
        Tensor in = test::filled(t, total, me), in2 = test::filled(t, total, me);
        Tensor out = test::empty(m, t), ref = test::empty(m, t);
        std::vector<size_t> counts(static_cast<size_t>(n), m);
        before = shm_count();
        fast.reduce_scatter(in, out, counts, op);
        EXPECT_EQ(shm_count() - before, counted(shared, total * es, total * es, fp32, n)) << "reduce_scatter " << at;
        mpi.reduce_scatter(in2, ref, counts, op);
        expect_same(out, ref, "reduce_scatter " + at);
        const memory::ShardRange own{static_cast<size_t>(me) * m, m};
        on.reduce_scatter(in, in.range(own), counts, op);  // true: rank order, MPI's on two ranks
        if (n <= 2 || t != DType::kF32) expect_same(in.range(own), ref, "reduce_scatter in place (true) " + at);
      }
      // allgather (in place too), uneven allgatherv and broadcast: data movement, any dtype.
      Tensor part = test::filled(t, m, me), all = test::empty(total, t), ref = test::empty(total, t);
      uint64_t before = shm_count();
      fast.allgather(part, all);
      EXPECT_EQ(shm_count() - before, counted(shared, m * es, total * es, false, n)) << "allgather " << at;
      mpi.allgather(part, ref);
      expect_same(all, ref, "allgather " + at);
      Tensor in_place = test::empty(total, t);
      const memory::ShardRange own{static_cast<size_t>(me) * m, m};
      in_place.range(own).copy_from(part);
      on.allgather(in_place.range(own), in_place);
      expect_same(in_place, ref, "allgather in place " + at);
      std::vector<size_t> uneven(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) uneven[static_cast<size_t>(r)] = r % 2 == 0 ? m : m / 2;
      const size_t ut = std::accumulate(uneven.begin(), uneven.end(), size_t{0});
      Tensor upart = test::filled(t, uneven[static_cast<size_t>(me)], me), uall = test::empty(ut, t), uref = test::empty(ut, t);
      fast.allgatherv(upart, uall, uneven);
      mpi.allgatherv(upart, uref, uneven);
      expect_same(uall, uref, "allgatherv " + at);
      const int root = n - 1;
      Tensor c = test::filled(t, m, me), d = test::filled(t, m, me);
      before = shm_count();
      fast.broadcast(c, root);
      EXPECT_EQ(shm_count() - before, counted(shared, m * es, 0, false, n)) << "broadcast " << at;
      mpi.broadcast(d, root);
      expect_same(c, d, "broadcast " + at);
      expect_same(c, test::filled(t, m, root), "broadcast " + at + " (the root's values)");
    }
  }
}

// Small ops alternating over the world and two splits (each rank in two groups at once), sync and
// async: a buffer written for one group is read by its members while another group's op runs.
TEST(Small, InterleavedGroupsAndAsyncKeepEveryResult) {
  comm::Group world = test::world_with_shared_memory(comm::SharedMemory::kAuto, "small_world");
  const int n = world.size(), me = world.rank();
  comm::Group strided = world.split(me % 2, me, "small_strided");
  comm::Group blocked = world.split(me / 2, me, "small_blocked");
  for (int it = 0; it < 200; ++it) {
    std::vector<comm::Work> works;
    std::vector<Tensor> xs;
    for (const comm::Group* g : {&world, &strided, &blocked}) {
      xs.push_back(test::filled(DType::kBF16, 37 + static_cast<size_t>(it % 5), g->rank()));
      if (it % 3 == 0) {
        works.push_back(g->allreduce_async(xs.back()));
      } else {
        g->allreduce(xs.back());
      }
    }
    for (comm::Work& w : works) w.wait();
    const comm::Group* groups[] = {&world, &strided, &blocked};
    for (size_t k = 0; k < 3; ++k) {
      for (size_t i = 0; i < static_cast<size_t>(xs[k].numel()); ++i) {
        ASSERT_EQ(test::as_float(xs[k], i), test::reduced(DType::kBF16, groups[k]->size(), i, false))
            << "iteration " << it << ", group " << groups[k]->name() << ", element " << i;
      }
    }
  }
  EXPECT_GT(n, 0);
}

// A size that differs across the limit (one rank small, the other by MPI) cannot meet: the wait
// notices find it on both ranks long before comm.timeout_s. Different collectives below the limit
// meet and throw at once, and leave the group usable.
TEST(Small, MismatchesThrowOnEveryRank) {
  if (test::world().size() < 2 || !single_node()) GTEST_SKIP() << "needs two ranks on one node";
  {
    comm::Group g = test::world_with_shared_memory(comm::SharedMemory::kAuto, "small_mismatch", 30);
    Tensor x = test::filled(DType::kBF16, 100, g.rank()), all = test::empty(100 * static_cast<size_t>(g.size()), DType::kBF16);
    try {
      if (g.rank() == 0) g.allreduce(x); else g.allgather(x, all);
      ADD_FAILURE() << "expected a mismatch";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("mismatched collectives"), std::string::npos) << e.what();
    }
    g.barrier();  // usable after a mismatch found by the exchange itself
  }
  comm::Group g = test::world_with_shared_memory(comm::SharedMemory::kAuto, "small_across", 30);
  Tensor y = test::filled(DType::kBF16, g.rank() == 0 ? 1000 : 3000, g.rank());
  const auto start = std::chrono::steady_clock::now();
  try {
    g.allreduce(y);
    ADD_FAILURE() << "expected a size mismatch";
  } catch (const CommError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("mismatched collectives"), std::string::npos) << m;
    EXPECT_NE(m.find("group 'small_across'"), std::string::npos) << m;
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  test::world().group().barrier();
}

}  // namespace
