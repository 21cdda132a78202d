// The host layout in comm: the bytes across hosts (Note [Bytes across hosts] in comm/config.h) equal
// their formulas exactly, and a group spanning hosts sums in the same order as one host's shared
// memory (Note [Sum order across hosts] in comm/detail/transport_hierarchical.cpp), so both give the
// same bits. Linked into comm_shm_test: its nodes2 runs treat blocks of two ranks as hosts (the
// hierarchical transport), tests/multihost runs it on real hosts (network namespaces).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/mpi_check.h"
#include "comm/native.h"
#include "memory/shard.h"
#include "tests/comm/test_util.h"
#include "tests/support/mpi_test_env.h"

using namespace zs;
using memory::DType;
using memory::Tensor;

namespace {

// Every rank's host (group rank order), gathered with MPI from what the group reports.
std::vector<int> hosts_of(const comm::Group& g) {
  // The host of a rank: the lowest group rank sharing it, found through MPI_COMM_TYPE_SHARED and the
  // World's blocks, independently of comm's own bookkeeping.
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(comm::native_handle(g), MPI_COMM_TYPE_SHARED, g.rank(), MPI_INFO_NULL, &node);
  const int k = test::world().config().shared_memory_node_ranks;
  if (k > 0) {  // groups here are dups of the world: node rank r / k is the block
    int r = 0;
    MPI_Comm_rank(node, &r);
    MPI_Comm block = MPI_COMM_NULL;
    MPI_Comm_split(node, r / k, r, &block);
    MPI_Comm_free(&node);
    node = block;
  }
  int first = 0, me = g.rank();
  MPI_Allreduce(&me, &first, 1, MPI_INT, MPI_MIN, node);
  MPI_Comm_free(&node);
  std::vector<int> all(static_cast<size_t>(g.size()));
  MPI_Allgather(&first, 1, MPI_INT, all.data(), 1, MPI_INT, comm::native_handle(g));
  return all;
}

// fp32 sums of every rank's `x` in rank order, divided once: the shared-memory kernels' definition.
std::vector<float> rank_order_sum(const comm::Group& g, const Tensor& x, float divisor) {
  const size_t n = static_cast<size_t>(x.numel());
  std::vector<float> all(n * static_cast<size_t>(g.size()));
  ZS_MPI_CHECK(MPI_Allgather(x.raw(), static_cast<int>(n), MPI_FLOAT, all.data(), static_cast<int>(n), MPI_FLOAT,
                             comm::native_handle(g)), "reference");
  std::vector<float> sum(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n));
  for (size_t r = 1; r < static_cast<size_t>(g.size()); ++r) {
    for (size_t i = 0; i < n; ++i) sum[i] += all[r * n + i];
  }
  if (divisor != 1.0f) {
    for (float& v : sum) v /= divisor;
  }
  return sum;
}

bool equal_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

}  // namespace

// Within one host (shm) and across hosts (hierarchical), every fp32 reduction that uses shared memory
// sums in rank order: bitwise the reference, so a job's parameters do not depend on its host layout.
TEST(Hosts, Fp32SumsInRankOrderOnAnyLayout) {
  const comm::Group& world = test::world().group();
  if (world.size() < 2) GTEST_SKIP() << "needs two ranks";
  comm::Group g = test::world_with_shared_memory(comm::SharedMemory::kOn, "h_order");
  const int n = g.size(), me = g.rank();
  // Two rounds of the hierarchical chain (kSlotBytes / 8 elements each) and a short one.
  for (size_t size : {size_t{1000}, size_t{600001}}) {
    SCOPED_TRACE(size);
    for (comm::ReduceOp op : {comm::ReduceOp::kSum, comm::ReduceOp::kAverage}) {
      if (size > 1000 && op == comm::ReduceOp::kAverage) continue;  // the division is the short one's (test time)
      const float divisor = op == comm::ReduceOp::kAverage ? static_cast<float>(n) : 1.0f;
      Tensor a = test::random_values(DType::kF32, size, me);
      const std::vector<float> want = rank_order_sum(g, a, divisor);
      g.allreduce(a, op);
      EXPECT_TRUE(equal_bits(a.data<float>(), want.data(), size)) << "allreduce, not in rank order";
      Tensor in = test::random_values(DType::kF32, size, me, 7);
      const std::vector<float> all = rank_order_sum(g, in, divisor);
      const auto shards = memory::partition(size, n);
      const memory::ShardRange mine = shards[static_cast<size_t>(me)];
      Tensor out = test::empty(mine.size, DType::kF32);
      g.reduce_scatter(in, out, shards, op);
      EXPECT_TRUE(equal_bits(out.data<float>(), all.data() + mine.offset, mine.size)) << "reduce_scatter, not in rank order";
    }
  }
}

// The bytes across hosts of each collective equal Note [Bytes across hosts]'s formulas exactly, on
// the world's real layout (or its blocks); within one host there are none.
TEST(Hosts, BytesAcrossHostsMatchTheFormulas) {
  const comm::Group& world = test::world().group();
  if (world.size() < 2) GTEST_SKIP() << "needs two ranks";
  comm::Group g = test::world_with_shared_memory(comm::SharedMemory::kAuto, "h_bytes");
  const std::vector<int> hosts = hosts_of(g);
  const int N = g.size(), me = g.rank();
  int R = 0;
  for (int h : hosts) R += h == hosts[static_cast<size_t>(me)] ? 1 : 0;
  auto remote = [&](int r) { return hosts[static_cast<size_t>(r)] != hosts[static_cast<size_t>(me)]; };
  std::vector<int> distinct = hosts;
  std::sort(distinct.begin(), distinct.end());
  EXPECT_EQ(g.hosts(), static_cast<int>(std::unique(distinct.begin(), distinct.end()) - distinct.begin()));
  EXPECT_EQ(g.host_ranks(), R);

  // One collective: its bytes across hosts, and the World's counters and op_stats agree with the group's.
  auto check = [&](const char* what, uint64_t want, auto&& run) {
    SCOPED_TRACE(what);
    const uint64_t inter = g.bytes_inter_host(), sent = g.bytes_sent();
    const comm::CommCounters before = test::world().counters();
    run();
    const comm::CommCounters after = test::world().counters();
    EXPECT_EQ(g.bytes_inter_host() - inter, want);
    EXPECT_EQ(after.bytes_sent_inter_host - before.bytes_sent_inter_host, want);
    EXPECT_EQ(g.bytes_intra_host() + g.bytes_inter_host(), g.bytes_sent());
    EXPECT_EQ(after.bytes_sent_intra_host() - before.bytes_sent_intra_host(), g.bytes_sent() - sent - want);
  };
  const size_t n = 1001;  // not a multiple of N: the allreduce's rounding
  Tensor a = test::random_values(DType::kF32, n, me);
  check("allreduce", 2 * static_cast<uint64_t>(N - R) * n / static_cast<uint64_t>(N) * 4, [&] { g.allreduce(a); });
  Tensor b = test::random_values(DType::kBF16, n, me);
  check("allreduce bf16", 2 * static_cast<uint64_t>(N - R) * n / static_cast<uint64_t>(N) * 2, [&] { g.allreduce(b); });
  // Uneven counts: rank j holds 3 + 5 j elements.
  std::vector<size_t> counts(static_cast<size_t>(N));
  for (int j = 0; j < N; ++j) counts[static_cast<size_t>(j)] = 3 + 5 * static_cast<size_t>(j);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  uint64_t remote_elems = 0;
  for (int j = 0; j < N; ++j) remote_elems += remote(j) ? counts[static_cast<size_t>(j)] : 0;
  Tensor in = test::random_values(DType::kF32, total, me), out = test::empty(counts[static_cast<size_t>(me)], DType::kF32);
  check("reduce_scatter", remote_elems * 4, [&] { g.reduce_scatter(in, out, counts); });
  check("allgatherv", remote_elems * 4, [&] { g.allgatherv(out, in, counts); });
  Tensor bc = test::random_values(DType::kF32, 77, me);
  const bool last = (me - 1 + N) % N == N - 1;  // root 1: the chain 1, 2, ..., 0
  check("broadcast", !last && remote((me + 1) % N) ? 77 * 4 : 0, [&] { g.broadcast(bc, 1); });
  // All-to-all: 4 elements to each rank.
  Tensor s = test::random_values(DType::kF32, 4 * static_cast<size_t>(N), me), r = test::empty(4 * static_cast<size_t>(N), DType::kF32);
  check("alltoall", static_cast<uint64_t>(N - R) * 16, [&] { g.alltoall(s, r); });
  // Point-to-point in a ring: to me + 1.
  Tensor p = test::random_values(DType::kF32, 10, me), q = test::empty(10, DType::kF32);
  check("sendrecv", remote((me + 1) % N) ? 40 : 0, [&] { g.sendrecv(p, (me + 1) % N, q, (me - 1 + N) % N); });

  // The comms logger's tally carries them too: the allreduces' share, summed over the two above.
  for (const comm::OpStats& o : g.op_stats()) {
    EXPECT_LE(o.bytes_inter_host, o.bytes_sent) << o.name;
  }
  if (g.hosts() == 1) {
    EXPECT_EQ(g.bytes_inter_host(), 0u);
  }
}
