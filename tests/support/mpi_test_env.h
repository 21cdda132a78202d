// The World of an MPI test executable, created by zs_test_mpi_main before any test runs.
//
//   TEST(Allreduce, Sums) { const auto& g = zs::test::world().group(); ... }
//
// The World has comm.timeout_s = 60 (generous for 4 ranks oversubscribed on 2 cores) and
// comm.shared_memory "auto" (--shm-node-ranks=K splits the node, CommConfig::shared_memory_node_ranks); tests that need
// a short timeout make their own group with group().dup(name, CommConfig{.timeout_s = 2}).
#pragma once

#include <string>

#include "comm/world.h"

namespace zs::test {

comm::World& world();

// A duplicate of the world's group with comm.shared_memory `mode` and comm.timeout_s `timeout_s`.
inline comm::Group world_with_shared_memory(comm::SharedMemory mode, const std::string& name, double timeout_s = 60) {
  comm::CommConfig c = world().config();
  c.shared_memory = mode;
  c.timeout_s = timeout_s;
  return world().group().dup(name, c);
}

// Whether the world's ranks share one host: its real layout (MPI_COMM_TYPE_SHARED), or blocks of
// --shm-node-ranks (tests/multihost runs some tests on two hosts).
inline bool single_host() { return world().group().hosts() == 1; }

}  // namespace zs::test
