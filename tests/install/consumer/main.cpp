// An outside project using the installed zeroshard package. It includes the public engine and
// estimator headers, which must compile from the install tree alone (no internal detail/ header is
// installed) and must not bring in <mpi.h> (comm/native.h is the one way to the communicator).
#include <zeroshard/engine/engine.h>
#include <zeroshard/estimate/measure.h>
#include <zeroshard/memory/shard.h>

#ifdef MPI_VERSION
#error "a public engine header included <mpi.h>"
#endif

#include <cstdio>

int main() {
  auto shards = zs::memory::partition(10, 3);
  std::printf("zeroshard consumer: %zu shards of 10 elements, tail %zu\n", shards.size(), shards.back().size);
  return 0;
}
