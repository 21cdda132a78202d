// The shared-memory collectives (comm/detail/shm.h) against OpenMPI's path and an fp64 reference:
// data movement bitwise, sums within the bound of their defined order (rank order, fp32 accumulation,
// one rounding) and bitwise equal to OpenMPI's on two ranks, deterministic run to run; uneven, zero and
// chunk-straddling sizes; bf16/fp16/int32; the config switch; mismatches and a stalled rank. And the
// direct path on tensors in a registered shared arena (comm/shared_arena.h) against both.
// Registered plain (one node) and with --shm-node-ranks=2 (blocks of two ranks as nodes: the
// multi-node path of allreduce, the MPI fallback of reduce-scatter and allgather(v)).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <thread>

#include "comm/comm.h"
#include "comm/detail/shm.h"
#include "memory/shared_mapping.h"
#include "tests/comm/test_util.h"
#include "tests/support/mpi_test_env.h"

using namespace zs;
using memory::DType;
using memory::Tensor;

namespace {

constexpr size_t kSlot = comm::detail::ShmNode::kSlotBytes;  // sizes below straddle slots and rounds on purpose
constexpr size_t kRound = comm::detail::ShmNode::kRoundBytes;

using test::raw_value;

// raw_value as stored in `t`.
double stored(DType t, int rank, size_t i) {
  const float v = raw_value(rank, i);
  switch (t) {
    case DType::kF32: return v;
    case DType::kBF16: return memory::bf16_to_f32(memory::f32_to_bf16(v));
    case DType::kF16: return memory::f16_to_f32(memory::f32_to_f16(v));
    case DType::kI32: return static_cast<int32_t>(v * 1000);
  }
  return 0;
}

using test::empty;
using test::same_bits;

// |got - exact| <= (N-1) 2^-24 sum|x| (fp32 sums in any order) + half an ulp of the result's type
// (relative, plus fp16's subnormal spacing 2^-24 absolute).
void expect_close_to_reference(const Tensor& got, DType t, size_t offset, int ranks, bool average) {
  const double unit = t == DType::kBF16 ? std::ldexp(1.0, -8) : t == DType::kF16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -24);
  size_t bad = 0;
  for (size_t i = 0; i < static_cast<size_t>(got.numel()); ++i) {
    double exact = 0, mag = 0;
    for (int r = 0; r < ranks; ++r) {
      const double v = stored(t, r, offset + i);
      exact += v;
      mag += std::fabs(v);
    }
    if (average) {
      exact /= ranks;
      mag /= ranks;
    }
    const double bound = t == DType::kI32 ? 0.0 : (ranks - 1) * std::ldexp(1.0, -24) * mag + unit * std::fabs(exact) +
                                                  (t == DType::kF16 ? std::ldexp(1.0, -24) : 1e-30);
    if (std::fabs(test::as_double(got, i) - exact) > bound && ++bad < 5) {
      ADD_FAILURE() << "element " << offset + i << ": got " << test::as_double(got, i) << ", exact " << exact << ", bound " << bound;
    }
  }
  EXPECT_EQ(bad, 0u);
}

std::vector<size_t> uneven_counts(int n, size_t es) {
  const size_t m = kRound / static_cast<size_t>(n) / es;  // elements per destination per round
  std::vector<size_t> c(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) c[static_cast<size_t>(r)] = r == 0 ? 2 * m + 7 : r % 3 == 1 ? 0 : m / 3 * static_cast<size_t>(r) + 13;
  return c;
}

// The world's real layout (MPI_COMM_TYPE_SHARED), or blocks of --shm-node-ranks: tests/multihost runs
// this on two hosts.
const DType kTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kI32};

TEST(Shm, ReduceScatterMatchesMpiAndReference) {
  comm::Group shm = test::world_with_shared_memory(comm::SharedMemory::kOn, "shm_rs");
  comm::Group mpi = test::world_with_shared_memory(comm::SharedMemory::kOff, "mpi_rs");
  const int n = shm.size(), me = shm.rank();
  for (DType t : kTypes) {
    for (bool average : {false, true}) {
      if (t == DType::kI32 && average) continue;
      const comm::ReduceOp op = average ? comm::ReduceOp::kAverage : comm::ReduceOp::kSum;
      // The large uneven counts (rounds, zero shards, partial pieces) for sums; averages on small ones.
      std::vector<std::vector<size_t>> cases = {std::vector<size_t>(static_cast<size_t>(n), 1000)};
      if (!average) cases.push_back(uneven_counts(n, memory::dtype_size(t)));
      for (const auto& counts : cases) {
        SCOPED_TRACE(std::string(memory::dtype_name(t)) + (average ? " average" : " sum"));
        const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
        const size_t own = counts[static_cast<size_t>(me)];
        const size_t displ = std::accumulate(counts.begin(), counts.begin() + me, size_t{0});
        Tensor a = empty(own, t), b = empty(own, t), c = empty(own, t);
        shm.reduce_scatter(test::random_values(t, total, me), a, counts, op);
        shm.reduce_scatter(test::random_values(t, total, me), b, counts, op);
        mpi.reduce_scatter(test::random_values(t, total, me), c, counts, op);
        EXPECT_TRUE(same_bits(a, b)) << "not deterministic run to run";
        if (n <= 2 || t == DType::kI32) {
          EXPECT_TRUE(same_bits(a, c)) << "differs from OpenMPI's result";
        }
        expect_close_to_reference(a, t, displ, n, average);
      }
    }
  }
}

TEST(Shm, ReduceScatterInPlace) {
  comm::Group shm = test::world_with_shared_memory(comm::SharedMemory::kOn, "shm_rs_inplace");
  const int n = shm.size(), me = shm.rank();
  const auto counts = uneven_counts(n, 4);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  const size_t displ = std::accumulate(counts.begin(), counts.begin() + me, size_t{0});
  Tensor in = test::random_values(DType::kF32, total, me);
  Tensor own = in.slice(0, static_cast<int64_t>(displ), static_cast<int64_t>(displ + counts[static_cast<size_t>(me)]));
  shm.reduce_scatter(in, own, counts);
  expect_close_to_reference(own, DType::kF32, displ, n, false);
}

TEST(Shm, AllgathervBitwiseEqualToMpi) {
  comm::Group shm = test::world_with_shared_memory(comm::SharedMemory::kOn, "shm_ag");
  comm::Group mpi = test::world_with_shared_memory(comm::SharedMemory::kOff, "mpi_ag");
  const int n = shm.size(), me = shm.rank();
  for (DType t : kTypes) {
    SCOPED_TRACE(memory::dtype_name(t));
    std::vector<size_t> counts(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) counts[static_cast<size_t>(r)] = r % 3 == 1 ? 0 : kSlot / memory::dtype_size(t) + 5 + 17 * static_cast<size_t>(r);
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    const size_t displ = std::accumulate(counts.begin(), counts.begin() + me, size_t{0});
    Tensor mine = test::random_values(t, counts[static_cast<size_t>(me)], me, displ);
    Tensor a = empty(total, t), c = empty(total, t);
    shm.allgatherv(mine, a, counts);
    mpi.allgatherv(mine, c, counts);
    EXPECT_TRUE(same_bits(a, c));
    for (int r = 0; r < n; ++r) {  // and each block is its rank's data
      const size_t d = std::accumulate(counts.begin(), counts.begin() + r, size_t{0});
      const size_t cnt = counts[static_cast<size_t>(r)];
      if (cnt > 0) EXPECT_EQ(test::as_double(a, d + cnt - 1), stored(t, r, d + cnt - 1)) << "rank " << r;
    }
    // In place (the input is the output's own block), and the even form.
    Tensor b = Tensor::empty({static_cast<int64_t>(total)}, t);
    std::memcpy(static_cast<char*>(b.raw()) + displ * memory::dtype_size(t), mine.raw(), counts[static_cast<size_t>(me)] * memory::dtype_size(t));
    shm.allgatherv(b.slice(0, static_cast<int64_t>(displ), static_cast<int64_t>(displ + counts[static_cast<size_t>(me)])), b, counts);
    EXPECT_TRUE(same_bits(b, c));
    Tensor e1 = empty(1001 * static_cast<size_t>(n), t), e2 = empty(1001 * static_cast<size_t>(n), t);
    shm.allgather(test::random_values(t, 1001, me), e1);
    mpi.allgather(test::random_values(t, 1001, me), e2);
    EXPECT_TRUE(same_bits(e1, e2));
  }
}

TEST(Shm, AllreduceMatchesMpiAndReference) {
  comm::Group shm = test::world_with_shared_memory(comm::SharedMemory::kOn, "shm_ar");
  comm::Group mpi = test::world_with_shared_memory(comm::SharedMemory::kOff, "mpi_ar");
  const int n = shm.size(), me = shm.rank();
  for (DType t : kTypes) {
    for (size_t size : {size_t{0}, size_t{1}, size_t{1000}, 3 * kSlot / 2 / memory::dtype_size(t) + 123}) {
      for (bool average : {false, true}) {
        if (t == DType::kI32 && average) continue;
        if (average && size > 1000) continue;  // the rounds are the sum's; the average only divides
        SCOPED_TRACE(std::string(memory::dtype_name(t)) + " " + std::to_string(size) + (average ? " average" : " sum"));
        const comm::ReduceOp op = average ? comm::ReduceOp::kAverage : comm::ReduceOp::kSum;
        Tensor a = test::random_values(t, size, me), b = test::random_values(t, size, me), c = test::random_values(t, size, me);
        shm.allreduce(a, op);
        shm.allreduce(b, op);
        mpi.allreduce(c, op);
        EXPECT_TRUE(same_bits(a, b)) << "not deterministic run to run";
        if (n <= 2 || t == DType::kI32) {
          EXPECT_TRUE(same_bits(a, c)) << "differs from OpenMPI's result";
        }
        if (size <= 1000) expect_close_to_reference(a, t, 0, n, average);
        // Every rank holds the same bits.
        Tensor all = Tensor::empty({static_cast<int64_t>(size) * n}, t);
        shm.allgather(a, all);
        for (int r = 1; r < n; ++r) {
          EXPECT_EQ(0, std::memcmp(all.raw(), static_cast<char*>(all.raw()) + r * size * memory::dtype_size(t), size * memory::dtype_size(t)));
        }
      }
    }
  }
}

// Rank i sends rank j `f(i, j)` elements: zero for some pairs, several rounds for others, and a
// rank that sends everything to one peer next to one that sends nothing (MoE's skewed routing).
TEST(Shm, AlltoallvBitwiseEqualToMpi) {
  comm::Group shm = test::world_with_shared_memory(comm::SharedMemory::kOn, "shm_a2a");
  comm::Group mpi = test::world_with_shared_memory(comm::SharedMemory::kOff, "mpi_a2a");
  const int n = shm.size(), me = shm.rank();
  const size_t per_round = kRound / static_cast<size_t>(std::max(1, n - 1)) / 4;  // fp32 elements per peer per round
  auto uneven = [&](int i, int j) -> size_t { return (i + 2 * j) % 3 == 0 ? 0 : per_round * static_cast<size_t>(i + j) + 13 * static_cast<size_t>(j) + 1; };
  auto skewed = [&](int i, int j) -> size_t { return i == 0 ? (j == n - 1 ? 2 * per_round + 5 : 0) : 0; };
  auto small = [&](int i, int j) -> size_t { return static_cast<size_t>(1 + i + 3 * j); };
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (const auto& f : {std::function<size_t(int, int)>(uneven), std::function<size_t(int, int)>(skewed),
                          std::function<size_t(int, int)>(small)}) {
      SCOPED_TRACE(memory::dtype_name(t));
      std::vector<size_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
      for (int j = 0; j < n; ++j) send[static_cast<size_t>(j)] = f(me, j), recv[static_cast<size_t>(j)] = f(j, me);
      const size_t ns = std::accumulate(send.begin(), send.end(), size_t{0});
      const size_t nr = std::accumulate(recv.begin(), recv.end(), size_t{0});
      Tensor in = test::random_values(t, ns, me), a = empty(nr, t), c = empty(nr, t);
      const uint64_t before = test::world().counters().shared_memory_collectives;
      shm.alltoallv(in, send, a, recv, comm::Group::CountCheck::kSkip);
      EXPECT_EQ(test::world().counters().shared_memory_collectives, before + (n > 1 && test::single_host() ? 1 : 0));
      mpi.alltoallv(in, send, c, recv);
      EXPECT_TRUE(same_bits(a, c));
      size_t at = 0;  // block j comes from rank j: its first elements are rank j's send displacement to me
      for (int j = 0; j < n; ++j) {
        size_t displ = 0;
        for (int q = 0; q < me; ++q) displ += f(j, q);
        if (recv[static_cast<size_t>(j)] > 0) {
          EXPECT_EQ(test::as_double(a, at), stored(t, j, displ)) << "from rank " << j;
        }
        at += recv[static_cast<size_t>(j)];
      }
    }
  }
  // The even form, and a mismatch of the counts is still caught by the verified form on every rank.
  Tensor x = test::random_values(DType::kF32, 4096 * static_cast<size_t>(n), me), y1 = empty(4096 * static_cast<size_t>(n), DType::kF32),
         y2 = empty(4096 * static_cast<size_t>(n), DType::kF32);
  shm.alltoall(x, y1);
  mpi.alltoall(x, y2);
  EXPECT_TRUE(same_bits(y1, y2));
  if (n >= 2) {
    std::vector<size_t> send(static_cast<size_t>(n), 10), recv(static_cast<size_t>(n), 10);
    if (me == 1) recv[0] = 11;
    const size_t nr = std::accumulate(recv.begin(), recv.end(), size_t{0});
    Tensor o = empty(nr, DType::kF32);
    EXPECT_THROW(shm.alltoallv(test::random_values(DType::kF32, 10 * static_cast<size_t>(n), me), send, o, recv), CommError);
  }
}

// The piece form (moe/dispatch.h): blocks split over several tensors, on both sides, through shared
// memory and through MPI's packing, equal to the contiguous exchange.
TEST(Shm, AlltoallvPiecesEqualContiguous) {
  comm::Group shm = test::world_with_shared_memory(comm::SharedMemory::kOn, "shm_a2a_pieces");
  comm::Group mpi = test::world_with_shared_memory(comm::SharedMemory::kOff, "mpi_a2a_pieces");
  const int n = shm.size(), me = shm.rank();
  const size_t big = kRound / 4 + 77;  // crosses rounds and piece boundaries
  auto f = [&](int i, int j) -> size_t { return (i + j) % 3 == 2 ? 0 : big * static_cast<size_t>(1 + (i + j) % 2) + 5 * static_cast<size_t>(i); };
  std::vector<size_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) send[static_cast<size_t>(j)] = f(me, j), recv[static_cast<size_t>(j)] = f(j, me);
  const size_t ns = std::accumulate(send.begin(), send.end(), size_t{0});
  const size_t nr = std::accumulate(recv.begin(), recv.end(), size_t{0});
  Tensor in = test::random_values(DType::kF32, ns, me), expected = empty(nr, DType::kF32);
  mpi.alltoallv(in, send, expected, recv);
  // Each block cut into three pieces (one may be empty), the receive side in a scrambled buffer.
  auto cut = [](const Tensor& flat, size_t at, size_t cnt) {
    const int64_t a = static_cast<int64_t>(at), c = static_cast<int64_t>(cnt);
    return std::vector<Tensor>{flat.slice(0, a, a + c / 3), flat.slice(0, a + c / 3, a + c / 3), flat.slice(0, a + c / 3, a + c)};
  };
  for (const comm::Group* g : {&shm, &mpi}) {
    SCOPED_TRACE(g->name());
    Tensor got = empty(nr, DType::kF32);
    std::vector<std::vector<Tensor>> sp, rp;
    size_t at = 0, rt = 0;
    for (int j = 0; j < n; ++j) {
      sp.push_back(cut(in, at, send[static_cast<size_t>(j)]));
      rp.push_back(cut(got, rt, recv[static_cast<size_t>(j)]));
      at += send[static_cast<size_t>(j)];
      rt += recv[static_cast<size_t>(j)];
    }
    g->alltoallv(sp, rp);
    EXPECT_TRUE(same_bits(got, expected));
  }
}

TEST(Shm, ConfigSwitchForcesEitherPath) {
  comm::Group on = test::world_with_shared_memory(comm::SharedMemory::kOn, "shm_on");
  comm::Group off = test::world_with_shared_memory(comm::SharedMemory::kOff, "shm_off");
  comm::Group autos = test::world_with_shared_memory(comm::SharedMemory::kAuto, "shm_auto");
  const int n = on.size();
  Tensor x = test::random_values(DType::kF32, 4096, on.rank());
  Tensor part = Tensor::empty({4096 / n}, DType::kF32);
  Tensor x4 = test::random_values(DType::kF32, 4096 / n * n, on.rank());
  auto shm_count = [] { return test::world().counters().shared_memory_collectives; };
  uint64_t before = shm_count();
  off.allreduce(x);
  off.reduce_scatter(x4, part, std::vector<size_t>(static_cast<size_t>(n), 4096 / n));
  off.allgather(part, x4);
  EXPECT_EQ(shm_count(), before) << "comm.shared_memory = false must use MPI's collectives";
  for (const comm::Group* g : {&on, &autos}) {
    before = shm_count();
    g->allreduce(x);
    EXPECT_EQ(shm_count(), before + (n > 1 ? 1 : 0)) << g->name();
    before = shm_count();
    g->reduce_scatter(x4, part, std::vector<size_t>(static_cast<size_t>(n), 4096 / n));
    g->allgather(part, x4);
    EXPECT_EQ(shm_count(), before + (n > 1 && test::single_host() ? 2 : 0)) << g->name();
  }
  // "auto" leaves tensors of 4-8 KiB to MPI; true takes them too. Up to 4 KiB both take the small
  // collectives' one exchange (Note [Small collectives] in comm/detail/small.h), on one node only.
  Tensor mid = test::random_values(DType::kF32, 1536, on.rank());
  before = shm_count();
  autos.allreduce(mid);
  EXPECT_EQ(shm_count(), before);
  on.allreduce(mid);
  EXPECT_EQ(shm_count(), before + (n > 1 ? 1 : 0));
  Tensor small = test::random_values(DType::kI32, 256, on.rank());
  before = shm_count();
  autos.allreduce(small);
  on.allreduce(small);
  off.allreduce(small);
  EXPECT_EQ(shm_count(), before + (n > 1 ? (test::single_host() ? 2 : 1) : 0));  // across nodes: true's hierarchical
}

TEST(Shm, MismatchThrowsOnEveryRank) {
  comm::Group shm = test::world_with_shared_memory(comm::SharedMemory::kOn, "shm_mismatch", 5);
  const int n = shm.size(), me = shm.rank();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  std::vector<size_t> counts(static_cast<size_t>(n), 100);
  if (me == 1) counts[0] = 101;  // rank 1 disagrees about rank 0's shard
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  Tensor out = Tensor::empty({static_cast<int64_t>(counts[static_cast<size_t>(me)])}, DType::kF32);
  try {
    shm.reduce_scatter(test::random_values(DType::kF32, total, me), out, counts);
    FAIL() << "expected a mismatch";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("mismatched size"), std::string::npos) << e.what();
  }
  Tensor x = test::random_values(DType::kF32, 5000, me);
  shm.allreduce(x);  // still usable after a detected mismatch
  expect_close_to_reference(x, DType::kF32, 0, n, false);
}

// ---- the direct path (Note [Direct collectives] in comm/detail/shm_direct.h) ----

// Tensors carved from this rank's registered shared mapping, as the engine's device arena places them.
struct ArenaTensors {
  memory::SharedMapping mapping = memory::SharedMapping::create(size_t{64} << 20);
  size_t used = 0;
  Tensor take(size_t n, DType t) {
    Tensor x(static_cast<char*>(mapping.data()) + used, t, {static_cast<int64_t>(n)});
    used += (n * memory::dtype_size(t) + 63) / 64 * 64;
    EXPECT_LE(used, mapping.size());
    return x;
  }
  Tensor copy_of(const Tensor& src) {
    Tensor x = take(static_cast<size_t>(src.numel()), src.dtype());
    std::memcpy(x.raw(), src.raw(), static_cast<size_t>(src.numel()) * memory::dtype_size(src.dtype()));
    return x;
  }
};

uint64_t direct_count() { return test::world().counters().direct_collectives; }
// Collectives of a group on one node read in place once the arena is active.
uint64_t direct_expected(const comm::SharedArena& arena, uint64_t k) { return arena.active() && test::single_host() ? k : 0; }

TEST(ShmDirect, ArenaActiveExactlyWhereUsable) {
  comm::Group g = test::world_with_shared_memory(comm::SharedMemory::kOn, "direct_reg");
  ArenaTensors mem;
  comm::SharedArena arena(g, &mem.mapping);
  EXPECT_EQ(arena.active(), g.size() > 1) << arena.inactive_reason();
  // One rank without shareable memory: inactive on every rank, with the reason.
  comm::SharedArena partial(g, g.rank() == 0 ? nullptr : &mem.mapping);
  EXPECT_FALSE(partial.active());
  EXPECT_FALSE(partial.inactive_reason().empty());
}

TEST(ShmDirect, AllgathervBitwiseEqualToMpi) {
  comm::Group g = test::world_with_shared_memory(comm::SharedMemory::kOn, "direct_ag");
  comm::Group mpi = test::world_with_shared_memory(comm::SharedMemory::kOff, "direct_ag_mpi");
  ArenaTensors mem;
  comm::SharedArena arena(g, &mem.mapping);
  const int n = g.size(), me = g.rank();
  for (DType t : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(memory::dtype_name(t));
    std::vector<size_t> counts(static_cast<size_t>(n));  // uneven, one rank empty, past the stream threshold
    for (int r = 0; r < n; ++r) counts[static_cast<size_t>(r)] = r == 1 ? 0 : (kSlot + 4099 * static_cast<size_t>(r)) / memory::dtype_size(t) + 5;
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    const size_t displ = std::accumulate(counts.begin(), counts.begin() + me, size_t{0});
    const size_t own = counts[static_cast<size_t>(me)];
    Tensor mine = mem.copy_of(test::random_values(t, own, me, displ));
    Tensor a = empty(total, t), c = empty(total, t);
    uint64_t before = direct_count();
    g.allgatherv(mine, a, counts);
    EXPECT_EQ(direct_count(), before + direct_expected(arena, 1));
    mpi.allgatherv(mine, c, counts);
    EXPECT_TRUE(same_bits(a, c));
    // In place, the output in the arena too.
    Tensor b = mem.take(total, t);
    std::memcpy(static_cast<char*>(b.raw()) + displ * memory::dtype_size(t), mine.raw(), own * memory::dtype_size(t));
    g.allgatherv(b.slice(0, static_cast<int64_t>(displ), static_cast<int64_t>(displ + own)), b, counts);
    EXPECT_TRUE(same_bits(b, c));
    EXPECT_EQ(direct_count(), before + direct_expected(arena, 2));
  }
}

// Broadcast in place (comm/detail/shm.cpp: only there; a tensor outside the arena keeps MPI_Bcast):
// past the small path's limit and past the streaming threshold, from the first and the last rank.
TEST(ShmDirect, BroadcastBitwiseEqualToMpi) {
  comm::Group g = test::world_with_shared_memory(comm::SharedMemory::kOn, "direct_bc");
  comm::Group mpi = test::world_with_shared_memory(comm::SharedMemory::kOff, "direct_bc_mpi");
  ArenaTensors mem;
  comm::SharedArena arena(g, &mem.mapping);
  const int n = g.size(), me = g.rank();
  struct Case {
    DType t;
    size_t bytes;
    int root;
  };
  for (const Case& k : {Case{DType::kF32, size_t{6} << 10, 0}, Case{DType::kBF16, size_t{6} << 10, n - 1},
                        Case{DType::kF32, kSlot + 4099, n - 1}}) {
    const size_t m = k.bytes / memory::dtype_size(k.t);
    SCOPED_TRACE(std::string(memory::dtype_name(k.t)) + ", " + std::to_string(m) + " elements, root " + std::to_string(k.root));
    Tensor a = mem.copy_of(test::random_values(k.t, m, me)), c = test::random_values(k.t, m, me), private_copy = test::random_values(k.t, m, me);
    const uint64_t before = direct_count();
    g.broadcast(a, k.root);
    EXPECT_EQ(direct_count(), before + direct_expected(arena, 1));
    g.broadcast(private_copy, k.root);  // outside the arena: MPI's
    EXPECT_EQ(direct_count(), before + direct_expected(arena, 1));
    mpi.broadcast(c, k.root);
    EXPECT_TRUE(same_bits(a, c));
    EXPECT_TRUE(same_bits(private_copy, c));
    EXPECT_TRUE(same_bits(a, test::random_values(k.t, m, k.root)));
  }
}

TEST(ShmDirect, ReduceScatterAndAllreduceMatchStagedAndMpi) {
  comm::Group g = test::world_with_shared_memory(comm::SharedMemory::kOn, "direct_rs");
  comm::Group mpi = test::world_with_shared_memory(comm::SharedMemory::kOff, "direct_rs_mpi");
  ArenaTensors mem;
  comm::SharedArena arena(g, &mem.mapping);
  const int n = g.size(), me = g.rank();
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (bool average : {false, true}) {
      SCOPED_TRACE(std::string(memory::dtype_name(t)) + (average ? " average" : " sum"));
      const comm::ReduceOp op = average ? comm::ReduceOp::kAverage : comm::ReduceOp::kSum;
      const auto counts = uneven_counts(n, memory::dtype_size(t));
      const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
      const size_t own = counts[static_cast<size_t>(me)];
      const size_t displ = std::accumulate(counts.begin(), counts.begin() + me, size_t{0});
      // Reduce-scatter: direct out of place and in place, staged (private input), MPI.
      Tensor direct = empty(own, t), staged = empty(own, t), ref = empty(own, t);
      const uint64_t before = direct_count();
      g.reduce_scatter(mem.copy_of(test::random_values(t, total, me)), direct, counts, op);
      Tensor in = mem.copy_of(test::random_values(t, total, me));
      Tensor in_place = in.slice(0, static_cast<int64_t>(displ), static_cast<int64_t>(displ + own));
      g.reduce_scatter(in, in_place, counts, op);
      g.reduce_scatter(test::random_values(t, total, me), staged, counts, op);
      mpi.reduce_scatter(test::random_values(t, total, me), ref, counts, op);
      EXPECT_TRUE(same_bits(direct, staged)) << "differs from the staged path";
      EXPECT_TRUE(same_bits(in_place, staged)) << "in place differs";
      if (n <= 2) EXPECT_TRUE(same_bits(direct, ref)) << "differs from OpenMPI's result";
      expect_close_to_reference(direct, t, displ, n, average);
      // Allreduce of an odd size (sub-slices of different lengths).
      const size_t m = 3 * kRound / memory::dtype_size(t) + 11;
      Tensor x = mem.copy_of(test::random_values(t, m, me)), y = test::random_values(t, m, me), z = test::random_values(t, m, me);
      g.allreduce(x, op);
      g.allreduce(y, op);
      mpi.allreduce(z, op);
      EXPECT_TRUE(same_bits(x, y)) << "allreduce differs from the staged path";
      if (n <= 2) EXPECT_TRUE(same_bits(x, z)) << "allreduce differs from OpenMPI's result";
      EXPECT_EQ(direct_count(), before + direct_expected(arena, 3));
    }
  }
}

TEST(ShmDirect, OneRankOutsideTheArenaTakesTheStagedPathEverywhere) {
  comm::Group g = test::world_with_shared_memory(comm::SharedMemory::kOn, "direct_mixed");
  ArenaTensors mem;
  comm::SharedArena arena(g, &mem.mapping);
  const int n = g.size(), me = g.rank();
  const size_t m = 5000;
  Tensor x = me == 0 ? test::random_values(DType::kF32, m, me) : mem.copy_of(test::random_values(DType::kF32, m, me));
  const uint64_t before = direct_count();
  g.allreduce(x);  // votes differ: not a mismatch, just no direct path
  EXPECT_EQ(direct_count(), before + (n == 1 ? 0 : direct_expected(arena, 0)));
  expect_close_to_reference(x, DType::kF32, 0, n, false);
}

// MoE's groups (moe/: DeepSpeed's ep and edp groups are strided and blocked splits of the data-parallel
// ranks) with one arena registered on the world, as the engine registers its device arena: collectives
// on each group, asynchronous and interleaved, inputs written just before each is issued and poisoned as
// soon as it completes. Every sum must equal the member-order fp32 sum of that group's members' inputs
// bit for bit (each member's contribution once, from the right group, read neither before its owner
// wrote it nor after its owner moved on), and every gather must hold the members' blocks.
float moe_value(int world_rank, int iteration, size_t i) { return raw_value(world_rank * 131 + iteration, i); }

TEST(ShmDirect, SplitGroupsSumTheirOwnMembersOnce) {
  comm::Group world = test::world_with_shared_memory(comm::SharedMemory::kOn, "direct_moe");
  const int n = world.size(), me = world.rank();
  ArenaTensors mem;
  comm::SharedArena arena(world, &mem.mapping);
  struct Case {
    comm::Group group;
    std::vector<int> members;  // world ranks in group order
    Tensor x, rs_in, rs_out, ag_out;
  };
  std::vector<Case> cases;
  auto add = [&](comm::Group g, auto same_group) {
    Case c{std::move(g), {}, {}, {}, {}, {}};
    for (int r = 0; r < n; ++r) {
      if (same_group(r)) c.members.push_back(r);
    }
    cases.push_back(std::move(c));
  };
  add(world.dup("direct_moe_all", world.config()), [](int) { return true; });
  add(world.split(me % 2, me, "direct_moe_strided"), [me](int r) { return r % 2 == me % 2; });
  add(world.split(me / 2, me, "direct_moe_blocked"), [me](int r) { return r / 2 == me / 2; });
  const size_t m = 3001;  // allreduce elements: sub-slices of different lengths
  auto counts_of = [](size_t size) {
    std::vector<size_t> c(size);
    // Blocks over 4 KiB: smaller gathers take the small collectives' path (comm/detail/small.h).
    for (size_t j = 0; j < size; ++j) c[j] = 1100 + 17 * j;
    return c;
  };
  for (Case& c : cases) {
    const auto counts = counts_of(c.members.size());
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    c.x = mem.take(m, DType::kF32);
    c.rs_in = mem.take(total, DType::kF32);
    c.rs_out = empty(counts[static_cast<size_t>(c.group.rank())], DType::kF32);
    c.ag_out = empty(total, DType::kF32);
  }
  const uint64_t before = direct_count();
  uint64_t issued = 0;
  const float poison = std::nanf("");
  auto check = [&](const Tensor& got, size_t offset, auto&& expected, const std::string& what) {
    size_t bad = 0;
    for (size_t i = 0; i < static_cast<size_t>(got.numel()); ++i) {
      const float e = expected(offset + i);
      // Across "nodes" (--shm-node-ranks) MPI's and the leaders' sums run in their own order: close only.
      bad += test::single_host() ? std::memcmp(&got.data<float>()[i], &e, sizeof e) != 0
                           : !(std::fabs(got.data<float>()[i] - e) <= 1e-5f);
    }
    EXPECT_EQ(bad, 0u) << what << ": elements differ from the member-order sum";
  };
  for (int it = 0; it < 8; ++it) {
    const comm::ReduceOp op = it % 2 == 0 ? comm::ReduceOp::kSum : comm::ReduceOp::kAverage;
    const bool in_place = it % 4 >= 2;
    SCOPED_TRACE("iteration " + std::to_string(it));
    std::vector<std::vector<size_t>> counts;
    std::vector<size_t> displ;
    std::vector<Tensor> outs;
    for (Case& c : cases) {
      counts.push_back(counts_of(c.members.size()));
      const size_t gr = static_cast<size_t>(c.group.rank());
      displ.push_back(std::accumulate(counts.back().begin(), counts.back().begin() + static_cast<std::ptrdiff_t>(gr), size_t{0}));
      outs.push_back(in_place ? c.rs_in.range({displ.back(), counts.back()[gr]}) : c.rs_out);
      // Direct: the allreduce and the reduce-scatter; the gather too when its input is in the arena.
      if (c.members.size() > 1) issued += in_place ? 3 : 2;
    }
    auto expected_of = [&](const Case& c) {
      return [&c, it, op](size_t i) {
        float acc = moe_value(c.members[0], it, i);
        for (size_t j = 1; j < c.members.size(); ++j) acc += moe_value(c.members[j], it, i);
        return op == comm::ReduceOp::kAverage ? acc / static_cast<float>(c.members.size()) : acc;
      };
    };
    // Each kind issued on every group, then each group's result checked and its input poisoned the
    // moment it completes, while the other groups' collectives may still run.
    std::vector<comm::Work> works;
    for (Case& c : cases) {
      for (size_t i = 0; i < m; ++i) c.x.data<float>()[i] = moe_value(me, it, i);
      works.push_back(c.group.allreduce_async(c.x, op));
    }
    for (size_t k = 0; k < cases.size(); ++k) {
      works[k].wait();
      check(cases[k].x, 0, expected_of(cases[k]), "allreduce on " + cases[k].group.name());
      std::fill_n(cases[k].x.data<float>(), m, poison);
    }
    works.clear();
    for (size_t k = 0; k < cases.size(); ++k) {
      Case& c = cases[k];
      for (size_t i = 0; i < static_cast<size_t>(c.rs_in.numel()); ++i) c.rs_in.data<float>()[i] = moe_value(me, it, i);
      works.push_back(c.group.reduce_scatter_async(c.rs_in, outs[k], counts[k], op));
    }
    for (size_t k = 0; k < cases.size(); ++k) {
      works[k].wait();
      check(outs[k], displ[k], expected_of(cases[k]), "reduce-scatter on " + cases[k].group.name());
      // All but this rank's block (the gather's input when in place).
      float* in = cases[k].rs_in.data<float>();
      std::fill(in, in + displ[k], poison);
      std::fill(in + displ[k] + counts[k][static_cast<size_t>(cases[k].group.rank())], in + cases[k].rs_in.numel(), poison);
    }
    works.clear();
    for (size_t k = 0; k < cases.size(); ++k) works.push_back(cases[k].group.allgatherv_async(outs[k], cases[k].ag_out, counts[k]));
    for (size_t k = 0; k < cases.size(); ++k) {
      works[k].wait();
      check(cases[k].ag_out, 0, expected_of(cases[k]), "allgather on " + cases[k].group.name());
      std::fill_n(outs[k].data<float>(), outs[k].numel(), poison);
    }
  }
  // Across "nodes" (--shm-node-ranks) some groups stay on one node and some do not: counted on one only.
  if (test::single_host()) {
    EXPECT_EQ(direct_count(), before + direct_expected(arena, issued));
  }
}

// A rank frozen (SIGSTOP) in the middle of a stream of large allreduces: its peer must give up after
// comm.timeout_s with the timeout message (normally at a shared-memory barrier), and the frozen rank,
// once resumed, too; neither hangs.
TEST(Shm, StalledRankTimesOutEverywhere) {
  const auto& w = test::world().group();
  if (w.size() < 2) GTEST_SKIP() << "needs two ranks";
  Tensor pids = Tensor::empty({w.size()}, DType::kI32);
  Tensor mine = Tensor::empty({1}, DType::kI32);
  mine.data<int32_t>()[0] = static_cast<int32_t>(getpid());
  w.allgather(mine, pids);
  comm::CommConfig c = test::world().config();
  c.shared_memory = comm::SharedMemory::kOn;
  c.timeout_s = 1.0;
  comm::Group pair = w.split(w.rank() < 2 ? 0 : 1 + w.rank(), w.rank(), "stallpair").dup("stallpair", c);
  if (w.rank() < 2) {
    const pid_t peer = static_cast<pid_t>(pids.data<int32_t>()[1]);
    std::atomic<bool> stopped{false};
    std::thread freezer;
    if (w.rank() == 0) {
      freezer = std::thread([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        kill(peer, SIGSTOP);
        stopped = true;
      });
    }
    Tensor x = test::random_values(DType::kF32, 3 * kSlot / 4, w.rank());  // three rounds per allreduce
    std::string message;
    const auto start = std::chrono::steady_clock::now();
    try {
      for (int i = 0; i < 100000; ++i) pair.allreduce(x);
      FAIL() << "expected a timeout";
    } catch (const CommError& e) {
      message = e.what();
    }
    if (freezer.joinable()) freezer.join();
    // Rank 0 must not enter the world barrier below while rank 1 is still inside the pair's allreduce:
    // rank 0 may have timed out one op before the one rank 1 froze in, and then each would wait for
    // the other across two groups, which the wait notices rightly report as mismatched collectives
    // (Note [Waits across groups]) instead of letting rank 1 time out. So rank 1, once out, leaves a
    // file that rank 0 waits for (not a collective: it must not be one of the groups' ops).
    const std::string out_marker = "/tmp/zs-shm-stall-" + std::to_string(pids.data<int32_t>()[0]) + ".out";
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (w.rank() == 0) {
      if (stopped) kill(peer, SIGCONT);
      for (int i = 0; i < 6000 && access(out_marker.c_str(), F_OK) != 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      EXPECT_EQ(std::remove(out_marker.c_str()), 0) << "rank 1 did not leave its allreduce within 60 s";
    } else {
      std::FILE* f = std::fopen(out_marker.c_str(), "w");
      EXPECT_NE(f, nullptr) << out_marker;
      if (f != nullptr) std::fclose(f);
    }
    EXPECT_NE(message.find("allreduce"), std::string::npos) << message;
    EXPECT_NE(message.find("timed out"), std::string::npos) << message;
    EXPECT_NE(message.find("group 'stallpair'"), std::string::npos) << message;
    EXPECT_LT(seconds, 30.0);
    EXPECT_THROW(pair.allreduce(x), CommError);  // unusable afterwards
  }
  w.barrier();
}

}  // namespace
