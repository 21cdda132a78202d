// Timing for the benchmarks that compare our collectives with raw MPI calls on MPI_COMM_WORLD: a round
// is timed from a barrier, and is as slow as its slowest rank.
#pragma once

#include <mpi.h>

namespace zs::bench {

// The largest `t` over MPI_COMM_WORLD (every rank gets it). Collective.
inline double slowest_in_world(double t) {
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

// Wall seconds of f() on the slowest rank, all ranks starting together. Collective.
template <typename F>
double timed_in_world(F&& f) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  f();
  return slowest_in_world(MPI_Wtime() - t0);
}

}  // namespace zs::bench
