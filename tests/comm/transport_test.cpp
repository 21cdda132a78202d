// Each transport (comm/detail/transport.h, Note [Transports]) alone against MPI's own collectives:
// every collective through a group whose transport is known (checked by name) and the same exchange
// by a raw MPI call on a private communicator of the same ranks. Data movement is bitwise equal; fp32
// and int32 sums are bitwise equal where the order of the additions is MPI's too (the MPI transport,
// and the shared-memory ones' at two ranks, a + b), and within fp32's bound of their defined order (rank
// order, hosts_test.cpp) otherwise; 16-bit sums within half an ulp of MPI's fp32 sum rounded
// once, and bitwise equal to the MPI transport's (Note [16-bit reductions]).
// Linked into comm_shm_test, so it also runs with --shm-node-ranks=2 (blocks of two ranks as nodes),
// where the hierarchical transport applies. The local transport runs at every size, as a group of one
// on this rank against MPI_COMM_SELF; the simulated one must move nothing and count what MPI's does.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/detail/runtime.h"
#include "comm/detail/shm_direct.h"  // group_state
#include "comm/detail/transport.h"
#include "comm/mpi_check.h"
#include "comm/native.h"
#include "tests/comm/test_util.h"
#include "tests/support/mpi_test_env.h"

using namespace zs;
using memory::DType;
using memory::Tensor;

namespace {

// bf16 values widened to fp32 (MPI cannot sum bf16; its fp32 sum is the reference).
Tensor widened(const Tensor& x) {
  Tensor w = Tensor::empty({x.numel()}, DType::kF32);
  for (int64_t i = 0; i < x.numel(); ++i) w.data<float>()[i] = memory::bf16_to_f32(x.data<uint16_t>()[i]);
  return w;
}

using test::empty;
using test::same_bits;
using test::as_double;

// |got - mpi| within two fp32 sums' rounding in any order ((N-1) 2^-24 sum|x| each; sum|x| <= N here),
// plus half an ulp of got's type when it is 16-bit.
void expect_close(const Tensor& got, const Tensor& mpi, int ranks) {
  ASSERT_EQ(got.numel(), mpi.numel());
  const double unit = got.dtype() == DType::kBF16 ? std::ldexp(1.0, -8) : 0.0;
  size_t bad = 0;
  for (size_t i = 0; i < static_cast<size_t>(got.numel()); ++i) {
    const double want = as_double(mpi, i);
    const double bound = 2.0 * (ranks - 1) * std::ldexp(1.0, -24) * ranks + unit * std::fabs(want) + 1e-30;
    if (std::fabs(as_double(got, i) - want) > bound && ++bad < 5) {
      ADD_FAILURE() << "element " << i << ": got " << as_double(got, i) << ", MPI " << want << ", bound " << bound;
    }
  }
  EXPECT_EQ(bad, 0u);
}

MPI_Datatype mpi_type(DType t) { return t == DType::kF32 ? MPI_FLOAT : t == DType::kI32 ? MPI_INT32_T : MPI_UINT16_T; }

std::vector<int> ints(const std::vector<size_t>& v) { return {v.begin(), v.end()}; }
std::vector<int> displs(const std::vector<size_t>& v) {
  std::vector<int> d(v.size());
  for (size_t i = 1; i < v.size(); ++i) d[i] = d[i - 1] + static_cast<int>(v[i - 1]);
  return d;
}

// A group under test and what to expect of it.
struct Case {
  std::string transport;       // the name make_transport must have chosen
  comm::Group group;
  MPI_Comm ref;                // the same ranks, for MPI's own collectives
  bool allreduce_bitwise;      // fp32 allreduce bitwise equal to MPI's
  bool reduce_scatter_bitwise;
  bool counts_shared_memory;   // its collectives show in CommCounters::shared_memory_collectives
};

const char* transport_of(const comm::Group& g) { return comm::detail::group_state(g).transport->name(); }

// A local group of one on this rank (the transport of a world started without mpirun), sharing the
// World's executor.
comm::Group local_group() {
  const auto& world = comm::detail::group_state(test::world().group());
  auto state = std::make_shared<comm::detail::GroupState>();
  state->runtime = world.runtime;
  state->name = "local";
  state->config = world.config;
  state->transport = comm::detail::make_local_transport();
  return comm::Group(std::move(state));
}

class TransportTest : public ::testing::Test {
 protected:
  void SetUp() override { ZS_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &ref_), "test communicator"); }
  void TearDown() override { MPI_Comm_free(&ref_); }

  // Every transport that applies at this world size and node layout.
  std::vector<Case> cases() {
    const int n = test::world().size();
    std::vector<Case> out;
    out.push_back({"mpi", test::world_with_shared_memory(comm::SharedMemory::kOff, "t_mpi"), ref_, true, true, false});
    out.push_back({"local", local_group(), MPI_COMM_SELF, true, true, false});
    if (n >= 2 && test::single_host()) {
      out.push_back({"shm", test::world_with_shared_memory(comm::SharedMemory::kOn, "t_shm"), ref_, n <= 2, n <= 2, true});
    } else if (n >= 2) {
      // Across "nodes" the sums are in rank order, as one node's (hosts_test.cpp), not MPI's.
      out.push_back({"hierarchical", test::world_with_shared_memory(comm::SharedMemory::kOn, "t_hier"), ref_, false, false, true});
    }
    return out;
  }

  MPI_Comm ref_ = MPI_COMM_NULL;
};

uint64_t shm_count() { return test::world().counters().shared_memory_collectives; }

TEST_F(TransportTest, ChosenOnceFromTheGroupsFacts) {
  for (Case& c : cases()) {
    SCOPED_TRACE(c.transport);
    EXPECT_STREQ(transport_of(c.group), c.transport.c_str());
    // A split inherits the config, so the same facts choose the same transport (the local group's
    // split is a local group of one too).
    comm::Group child = c.group.split(0, c.group.rank(), c.transport + "_child");
    EXPECT_STREQ(transport_of(child), c.transport.c_str());
  }
  EXPECT_STREQ(transport_of(comm::Group::simulated(0, 4)), "simulated");
  EXPECT_STREQ(transport_of(test::world_with_shared_memory(comm::SharedMemory::kAuto, "t_auto")),
               test::world().size() < 2 ? "mpi" : test::single_host() ? "shm" : "hierarchical");
}

// The choice is the same on every rank because the ranks' settings are checked first: a dup with
// different comm.shared_memory values throws on every rank instead of choosing two transports.
TEST_F(TransportTest, DifferingSharedMemorySettingsThrowOnEveryRank) {
  if (test::world().size() < 2) GTEST_SKIP() << "needs two ranks";
  comm::CommConfig c = test::world().config();
  c.shared_memory = test::world().rank() == 0 ? comm::SharedMemory::kOff : comm::SharedMemory::kOn;
  try {
    comm::Group g = test::world().group().dup("t_differs", c);
    ADD_FAILURE() << "no error; chose " << transport_of(g);
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("comm.shared_memory differs across the ranks of group 't_differs'"), std::string::npos)
        << e.what();
  }
  test::world().group().barrier();  // the world stays usable
}

TEST_F(TransportTest, AllreduceMatchesMpi) {
  comm::Group mpi_twin = test::world_with_shared_memory(comm::SharedMemory::kOff, "t_mpi_twin");
  for (Case& c : cases()) {
    SCOPED_TRACE(c.transport);
    const int n = c.group.size(), me = c.group.rank();
    for (size_t size : {size_t{1}, size_t{1000}, size_t{300001}}) {
      SCOPED_TRACE(size);
      const uint64_t before = shm_count();
      for (comm::ReduceOp op : {comm::ReduceOp::kSum, comm::ReduceOp::kAverage}) {
        Tensor a = test::random_values(DType::kF32, size, me), m = test::random_values(DType::kF32, size, me);
        c.group.allreduce(a, op);
        ZS_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, m.raw(), static_cast<int>(size), MPI_FLOAT, MPI_SUM, c.ref), "ref");
        if (op == comm::ReduceOp::kAverage) {
          for (size_t i = 0; i < size; ++i) m.data<float>()[i] /= static_cast<float>(n);
        }
        if (c.allreduce_bitwise) {
          EXPECT_TRUE(same_bits(a, m)) << "fp32 differs from MPI_Allreduce";
        } else {
          expect_close(a, m, n);
        }
      }
      Tensor i32 = test::random_values(DType::kI32, size, me), mi = test::random_values(DType::kI32, size, me);
      c.group.allreduce(i32);
      ZS_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, mi.raw(), static_cast<int>(size), MPI_INT32_T, MPI_SUM, c.ref), "ref");
      EXPECT_TRUE(same_bits(i32, mi)) << "int32 differs from MPI_Allreduce";
      Tensor b = test::random_values(DType::kBF16, size, me), mb = widened(b);
      c.group.allreduce(b);
      ZS_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, mb.raw(), static_cast<int>(size), MPI_FLOAT, MPI_SUM, c.ref), "ref");
      expect_close(b, mb, n);
      // The same bits as the MPI transport's (Note [16-bit reductions]); over one rank the value itself.
      Tensor twin = test::random_values(DType::kBF16, size, me);
      if (c.transport == "shm") mpi_twin.allreduce(twin);
      if (c.transport == "shm" || c.transport == "local") {
        EXPECT_TRUE(same_bits(b, twin)) << "bf16 differs from the MPI transport's";
      }
      EXPECT_EQ(shm_count() > before, c.counts_shared_memory);
    }
  }
}

TEST_F(TransportTest, ReduceScatterMatchesMpi) {
  for (Case& c : cases()) {
    SCOPED_TRACE(c.transport);
    const int n = c.group.size(), me = c.group.rank();
    std::vector<size_t> counts(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) counts[static_cast<size_t>(r)] = r % 3 == 1 ? 0 : 70000 + 123 * static_cast<size_t>(r);
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    const size_t own = counts[static_cast<size_t>(me)];
    const std::vector<int> rc = ints(counts);
    for (DType t : {DType::kF32, DType::kI32, DType::kBF16}) {
      SCOPED_TRACE(memory::dtype_name(t));
      Tensor in = test::random_values(t, total, me), out = empty(own, t);
      c.group.reduce_scatter(in, out, counts);
      Tensor send = t == DType::kBF16 ? widened(in) : test::random_values(t, total, me);
      Tensor want = empty(own, t == DType::kBF16 ? DType::kF32 : t);
      ZS_MPI_CHECK(MPI_Reduce_scatter(send.raw(), want.raw(), rc.data(), mpi_type(want.dtype()), MPI_SUM, c.ref), "ref");
      if (t == DType::kI32 || (t == DType::kF32 && c.reduce_scatter_bitwise)) {
        EXPECT_TRUE(same_bits(out, want)) << "differs from MPI_Reduce_scatter";
      } else {
        expect_close(out, want, n);
      }
    }
  }
}

TEST_F(TransportTest, DataMovementBitwiseEqualToMpi) {
  for (Case& c : cases()) {
    SCOPED_TRACE(c.transport);
    const int n = c.group.size(), me = c.group.rank();
    std::vector<size_t> counts(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) counts[static_cast<size_t>(r)] = r % 3 == 1 ? 0 : 200000 + 17 * static_cast<size_t>(r);
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    const std::vector<int> rc = ints(counts), rd = displs(counts);
    for (DType t : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(memory::dtype_name(t));
      const MPI_Datatype type = mpi_type(t);
      // allgatherv (uneven, a zero block) and allgather.
      Tensor mine = test::random_values(t, counts[static_cast<size_t>(me)], me);
      Tensor a = empty(total, t), m = empty(total, t);
      c.group.allgatherv(mine, a, counts);
      ZS_MPI_CHECK(MPI_Allgatherv(mine.raw(), rc[static_cast<size_t>(me)], type, m.raw(), rc.data(), rd.data(), type, c.ref), "ref");
      EXPECT_TRUE(same_bits(a, m)) << "allgatherv";
      Tensor e = test::random_values(t, 5000, me), ea = empty(5000 * static_cast<size_t>(n), t), em = empty(5000 * static_cast<size_t>(n), t);
      c.group.allgather(e, ea);
      ZS_MPI_CHECK(MPI_Allgather(e.raw(), 5000, type, em.raw(), 5000, type, c.ref), "ref");
      EXPECT_TRUE(same_bits(ea, em)) << "allgather";
      // broadcast from the last rank.
      Tensor b = test::random_values(t, 70001, me), bm = test::random_values(t, 70001, me);
      c.group.broadcast(b, n - 1);
      ZS_MPI_CHECK(MPI_Bcast(bm.raw(), 70001, type, n - 1, c.ref), "ref");
      EXPECT_TRUE(same_bits(b, bm)) << "broadcast";
      // alltoall, alltoallv (skewed, zero pairs) and its piece form.
      Tensor x = test::random_values(t, 3000 * static_cast<size_t>(n), me), xa = empty(x.numel(), t), xm = empty(x.numel(), t);
      c.group.alltoall(x, xa);
      ZS_MPI_CHECK(MPI_Alltoall(x.raw(), 3000, type, xm.raw(), 3000, type, c.ref), "ref");
      EXPECT_TRUE(same_bits(xa, xm)) << "alltoall";
      auto f = [](int i, int j) { return (i + 2 * j) % 3 == 0 ? size_t{0} : size_t{40000} * static_cast<size_t>(i + 1) + 7 * static_cast<size_t>(j); };
      std::vector<size_t> sc(static_cast<size_t>(n)), rcv(static_cast<size_t>(n));
      for (int j = 0; j < n; ++j) {
        sc[static_cast<size_t>(j)] = f(me, j);
        rcv[static_cast<size_t>(j)] = f(j, me);
      }
      const size_t ns = std::accumulate(sc.begin(), sc.end(), size_t{0}), nr = std::accumulate(rcv.begin(), rcv.end(), size_t{0});
      Tensor v = test::random_values(t, ns, me), va = empty(nr, t), vm = empty(nr, t);
      c.group.alltoallv(v, sc, va, rcv);
      const std::vector<int> s_c = ints(sc), s_d = displs(sc), r_c = ints(rcv), r_d = displs(rcv);
      ZS_MPI_CHECK(MPI_Alltoallv(v.raw(), s_c.data(), s_d.data(), type, vm.raw(), r_c.data(), r_d.data(), type, c.ref), "ref");
      EXPECT_TRUE(same_bits(va, vm)) << "alltoallv";
      // Pieces: every block cut in two, received into two pieces per block.
      std::vector<std::vector<Tensor>> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
      Tensor vp = empty(nr, t);
      for (size_t j = 0; j < static_cast<size_t>(n); ++j) {
        const auto cut = [](const Tensor& whole, int off, size_t len, std::vector<Tensor>& into) {
          const int64_t h = static_cast<int64_t>(len / 3);
          into.push_back(whole.slice(0, off, off + h));
          into.push_back(whole.slice(0, off + h, off + static_cast<int64_t>(len)));
        };
        cut(v, s_d[j], sc[j], send[j]);
        cut(vp, r_d[j], rcv[j], recv[j]);
      }
      c.group.alltoallv(send, recv);
      EXPECT_TRUE(same_bits(vp, vm)) << "alltoallv with pieces";
    }
    // The count exchange, carried by the handshake and by MPI_Alltoall past kMaxGathered values.
    for (size_t w : {size_t{3}, size_t{700}}) {
      std::vector<int64_t> send(w * static_cast<size_t>(n)), got(send.size()), want(send.size());
      for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<int64_t>(i * 31 + static_cast<size_t>(me) * 1000003);
      c.group.exchange_counts(send, got);
      ZS_MPI_CHECK(MPI_Alltoall(send.data(), static_cast<int>(w), MPI_INT64_T, want.data(), static_cast<int>(w), MPI_INT64_T, c.ref), "ref");
      EXPECT_EQ(got, want) << "exchange_counts, " << w << " per rank";
    }
  }
}

// The simulated transport moves nothing and its group counts what the MPI transport's group does.
TEST_F(TransportTest, SimulatedMovesNothingAndCountsAsMpi) {
  const int n = test::world().size(), me = test::world().rank();
  comm::Group mpi = test::world_with_shared_memory(comm::SharedMemory::kOff, "t_mpi_count");
  comm::Group sim = comm::Group::simulated(me, n);
  std::vector<size_t> counts(static_cast<size_t>(n), 1000);
  counts[0] = 3001;
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  const size_t own = counts[static_cast<size_t>(me)];
  auto run = [&](const comm::Group& g) {
    Tensor a = test::random_values(DType::kBF16, 4099, me), rs_in = test::random_values(DType::kF32, total, me), rs = test::random_values(DType::kF32, own, 7);
    Tensor ag = test::random_values(DType::kF32, total, 9), x = test::random_values(DType::kF32, 64 * static_cast<size_t>(n), me), xo = test::random_values(DType::kF32, x.numel(), 5);
    g.allreduce(a);
    g.reduce_scatter(rs_in, rs, counts);
    g.allgatherv(test::random_values(DType::kF32, own, me), ag, counts);
    g.broadcast(a, 0);
    g.alltoall(x, xo);
    g.barrier();
    return std::vector<Tensor>{a, rs, ag, xo};
  };
  const comm::CommCounters before = mpi.counters();
  run(mpi);
  const comm::CommCounters after = mpi.counters();
  const std::vector<Tensor> got = run(sim);
  EXPECT_EQ(sim.counters().bytes_sent, after.bytes_sent - before.bytes_sent);
  EXPECT_EQ(sim.counters().bytes_received, after.bytes_received - before.bytes_received);
  EXPECT_EQ(sim.counters().collectives, after.collectives - before.collectives);
  // Every output as it was.
  EXPECT_TRUE(same_bits(got[0], test::random_values(DType::kBF16, 4099, me)));
  EXPECT_TRUE(same_bits(got[1], test::random_values(DType::kF32, own, 7)));
  EXPECT_TRUE(same_bits(got[2], test::random_values(DType::kF32, total, 9)));
  EXPECT_TRUE(same_bits(got[3], test::random_values(DType::kF32, 64 * static_cast<size_t>(n), 5)));
}

// Note [Busiest member's bytes]: per call, a reduce-scatter's or allgatherv's tally also holds the bytes of
// the member that receives the most (the total less the least block), and across hosts the most any
// member takes from other hosts; collectives even on every member record their own bytes there.
TEST(BusiestMember, UnevenBlocksRecordTheBusiestMembersBytes) {
  auto stats_of = [](const comm::Group& g, const std::string& name) {
    for (const comm::OpStats& s : g.op_stats()) {
      if (s.name == name) return s;
    }
    return comm::OpStats{};
  };
  {  // two ranks, one holding the whole block (a ZeRO-3 gather of a module one shard holds)
    comm::Group sim = comm::Group::simulated(0, 2, "sim2");
    const std::vector<size_t> counts = {300, 0};
    sim.allgatherv(test::random_values(DType::kF32, 300, 1), test::random_values(DType::kF32, 300, 2), counts);
    const comm::OpStats s = stats_of(sim, "allgatherv");
    EXPECT_EQ(s.bytes_sent, 0u) << "the owner's own count: the others' blocks";
    EXPECT_EQ(s.busiest_bytes, 300u * 4) << "its peer receives the whole block";
    EXPECT_EQ(s.busiest_inter_host_bytes, 0u) << "one host";
    const std::vector<size_t> rs_counts = {100, 300};
    sim.reduce_scatter(test::random_values(DType::kF32, 400, 1), test::random_values(DType::kF32, 100, 2), rs_counts);
    const comm::OpStats r = stats_of(sim, "reduce_scatter");
    EXPECT_EQ(r.bytes_sent, 300u * 4);
    EXPECT_EQ(r.busiest_bytes, 300u * 4) << "this rank is the busiest";
    Tensor even = test::random_values(DType::kF32, 1000, 3);
    sim.allreduce(even);
    const comm::OpStats a = stats_of(sim, "allreduce");
    EXPECT_EQ(a.busiest_bytes, a.bytes_sent) << "an even collective: every member's own";
  }
  {  // four ranks on two hosts of two: host 0 owns 500 elements, host 1 200
    comm::Group sim = comm::Group::simulated(0, 4, "sim4", {0, 0, 1, 1});
    const std::vector<size_t> counts = {500, 0, 100, 100};
    sim.allgatherv(test::random_values(DType::kF32, 500, 1), test::random_values(DType::kF32, 700, 2), counts);
    const comm::OpStats s = stats_of(sim, "allgatherv");
    EXPECT_EQ(s.bytes_sent, 200u * 4);
    EXPECT_EQ(s.bytes_inter_host, 200u * 4) << "ranks 2 and 3 are on the other host";
    EXPECT_EQ(s.busiest_bytes, 700u * 4) << "rank 1 owns nothing and receives everything";
    EXPECT_EQ(s.busiest_inter_host_bytes, 500u * 4) << "host 1's members take host 0's 500 across";
  }
}

}  // namespace
