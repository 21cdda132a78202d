// Process set-up for programs at the edge (the zeroshard tool, examples, benchmarks, a user's own
// main): things that must happen before the library does any work and that read the environment,
// which library code never does. Its own target (zs_launch, zeroshard::launch), outside the library
// the engine is made of.
//
//   int main(int argc, char** argv) {
//     zs::launch::select_blas_kernels(argv);   // first line of main: may re-exec the program
//     auto world = zs::comm::World::create();
//     zs::launch::set_blas_threads(zs::launch::local_rank_count());
//
// Note [OpenBLAS core type]: Debian's OpenBLAS is built with DYNAMIC_ARCH and picks its kernels when
// the library loads, from the CPU model. On CPUs it does not know it falls back to old kernels: on
// these virtualised Xeons it picks "Prescott" (SSE3). On a Zen 4 with AVX512-BF16, Debian's 0.3.21
// loads "Cooperlake" (the SkylakeX kernels) by itself. OPENBLAS_CORETYPE overrides the choice, but
// only at load time, so when the loaded kernels are weaker than what the CPU supports we set it and
// re-exec the program once (before MPI starts; an exec keeps the PID and the launcher's environment).
// A user's own OPENBLAS_CORETYPE always wins.
//
// Note [OpenBLAS idle threads]: after each multi-threaded sgemm OpenBLAS's threads poll for the next
// one, calling sched_yield, for 2^28 cycles (THREAD_TIMEOUT; about 0.1 s here) before they sleep. The
// library issues sgemm between the worker pool's regions (core/parallel.h) and runs its own bf16
// kernel on that pool, so a polling OpenBLAS thread was runnable beside the pool's worker on its core
// almost all the time: on the 2-core Zen measured, the bf16 kernel reached >= 0.8x of the best bf16
// product on 16-20 of gemm_bench's 32 shapes at 2 threads with OpenBLAS polling, 24-29 with it
// polling 2^18 cycles (about 0.1 ms, still enough to catch a layer's back-to-back products: dX then
// dW). OPENBLAS_THREAD_TIMEOUT is read when the library loads, so select_blas_kernels sets it to 18
// with the core type and re-executes; a user's own value wins.
#pragma once

#include <string>
#include <vector>

namespace zs::launch {

// The OpenBLAS core type best suited to this CPU: "SkylakeX" (AVX-512 F/CD/BW/DQ/VL), "Haswell"
// (AVX2 + FMA) or "" (leave OpenBLAS's choice).
std::string preferred_blas_core();
// The core type OpenBLAS loaded with ("Prescott", "Haswell", "SkylakeX", ...).
std::string loaded_blas_core();

// Re-executes the program with OPENBLAS_CORETYPE set when the loaded kernels are weaker than
// preferred_blas_core(), and with OPENBLAS_THREAD_TIMEOUT set when the user did not set it (Notes
// above). Returns normally when nothing needs doing or the re-exec is not
// possible (then it logs a warning). Call first thing in main, before any thread or MPI exists.
void select_blas_kernels(char** argv);

// Ranks of this job on this node: the launcher's local size (OMPI_COMM_WORLD_LOCAL_SIZE,
// MPI_LOCALNRANKS), 1 without a launcher.
int local_rank_count();

// The CPUs this process may run on (its affinity mask), in increasing order.
std::vector<int> allowed_cpus();

// Gives each local rank an equal share of the CPUs it may use for the compute threads (OpenBLAS's and
// the worker pool's; at least 1), unless the user set OPENBLAS_NUM_THREADS: a rank the launcher bound
// to fewer CPUs than the node has gets those, an unbound rank its share of the allowed CPUs (Note
// [rank CPU share] in launch.cpp). Returns the number of threads.
int set_blas_threads(int local_ranks);


}  // namespace zs::launch
