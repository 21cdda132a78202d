// The World of an MPI test executable, created by zs_test_mpi_main before any test runs.
//
//   TEST(Allreduce, Sums) { const auto& g = zs::test::world().group(); ... }
//
// The World has comm.timeout_s = 60 (generous for 4 ranks oversubscribed on 2 cores) and
// comm.shared_memory "auto" (--shm-node-ranks=K splits the node, CommConfig::shared_memory_node_ranks); tests that need
// a short timeout make their own group with group().dup(name, CommConfig{.timeout_s = 2}).
#pragma once

#include "comm/world.h"

namespace zs::test {

comm::World& world();

}  // namespace zs::test
