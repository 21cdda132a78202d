// How the comm waits poll where the node's ranks outnumber its CPUs (Note [Polling] in
// comm/detail/runtime.h, Note [Our own ranks' turns] in comm/detail/contention.h): the CPUs counted are
// those the node's ranks may run on (their affinity masks), and waits that yield to our own ranks are
// never judged contended. Linked into comm_shm_test (np 1-4).
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <vector>

#include "comm/comm.h"
#include "comm/detail/contention.h"
#include "comm/detail/runtime.h"
#include "comm/detail/shm_direct.h"  // group_state
#include "comm/native.h"
#include "tests/comm/test_util.h"
#include "tests/support/mpi_test_env.h"

using namespace zs;

namespace {

// The calling thread's affinity mask, restored on scope exit.
class KeepAffinity {
 public:
  KeepAffinity() { EXPECT_EQ(sched_getaffinity(0, sizeof(mask_), &mask_), 0); }
  ~KeepAffinity() { sched_setaffinity(0, sizeof(mask_), &mask_); }
  std::vector<int> cpus() const {
    std::vector<int> out;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &mask_)) out.push_back(c);
    }
    return out;
  }

 private:
  cpu_set_t mask_{};
};

void pin_to(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
}

// `us` microseconds of this thread's CPU time (a rank's compute between two collectives).
void compute(double us) {
  const auto until = comm::detail::thread_cpu_time() + std::chrono::nanoseconds(static_cast<long>(us * 1e3));
  volatile double sink = 0;
  double x = 1.0;
  while (comm::detail::thread_cpu_time() < until) {
    for (int i = 0; i < 1000; ++i) x = x * 1.0000001 + 1e-9;
  }
  sink = sink + x;
}

TEST(Polling, NodeCpusAreTheUnionOfTheRanksAffinityMasks) {
  const comm::Group& g = test::world().group();
  if (!test::single_host()) GTEST_SKIP() << "the world's ranks are on several hosts";
  KeepAffinity keep;
  const std::vector<int> mine = keep.cpus();
  ASSERT_FALSE(mine.empty());
  MPI_Comm world = comm::native_handle(g);
  // Unbound (as mpirun --bind-to none leaves ranks): the masks' union, every CPU some rank may use.
  const int unbound = comm::detail::node_cpus(world);
  EXPECT_GE(unbound, static_cast<int>(mine.size()));
  // Every rank on one CPU (taskset -c 0 on the launcher, or a one-core cpuset): one CPU for them all.
  int first = mine.front();
  ASSERT_EQ(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, world), MPI_SUCCESS);
  pin_to(first);
  EXPECT_EQ(comm::detail::node_cpus(world), 1);
  // Each rank on one CPU of its own mask (mpirun --bind-to core, or spread over an unbound mask): as
  // many as the distinct CPUs chosen.
  int chosen = mine[static_cast<size_t>(g.rank()) % mine.size()];
  std::vector<int> all(static_cast<size_t>(g.size()));
  ASSERT_EQ(MPI_Allgather(&chosen, 1, MPI_INT, all.data(), 1, MPI_INT, world), MPI_SUCCESS);
  std::sort(all.begin(), all.end());
  const auto distinct = static_cast<int>(std::unique(all.begin(), all.end()) - all.begin());
  pin_to(chosen);
  EXPECT_EQ(comm::detail::node_cpus(world), distinct);
  EXPECT_LE(distinct, unbound);
}

// Pairs of ranks (tensor-parallel groups of 2) that compute about 1 ms and then reduce with each other,
// where the ranks outnumber the cores: a rank waits while its pair's other rank takes turns on a shared
// core. Before Note [Our own ranks' turns] these yielding waits were judged contended at once.
TEST(Polling, WaitsThatYieldToOurOwnRanksAreNotContention) {
  const comm::Group& g = test::world().group();
  comm::detail::Runtime& rt = *comm::detail::group_state(g).runtime;
  if (!rt.oversubscribed()) GTEST_SKIP() << "the node has a CPU for every rank (runs at np 3-4 on up to 2-3 cores)";
  comm::Group pair = g.split(g.rank() / 2, g.rank(), "pair");
  memory::Tensor small = test::filled(memory::DType::kF32, 64, g.rank());
  memory::Tensor large = test::filled(memory::DType::kF32, 64 * 1024, g.rank());  // the shared-memory path
  const uint64_t before = rt.contention().times_seen();
  for (int round = 0; round < 60; ++round) {
    compute(1000);
    pair.allreduce(round % 2 == 0 ? small : large);
  }
  g.barrier();
  EXPECT_EQ(rt.contention().times_seen(), before);
}

}  // namespace
