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
#pragma once

#include <string>

namespace zs::launch {

// The OpenBLAS core type best suited to this CPU: "SkylakeX" (AVX-512 F/CD/BW/DQ/VL), "Haswell"
// (AVX2 + FMA) or "" (leave OpenBLAS's choice).
std::string preferred_blas_core();
// The core type OpenBLAS loaded with ("Prescott", "Haswell", "SkylakeX", ...).
std::string loaded_blas_core();

// Re-executes the program with OPENBLAS_CORETYPE set when the loaded kernels are weaker than
// preferred_blas_core() (Note above). Returns normally when nothing needs doing or the re-exec is not
// possible (then it logs a warning). Call first thing in main, before any thread or MPI exists.
void select_blas_kernels(char** argv);

// Ranks of this job on this node: the launcher's local size (OMPI_COMM_WORLD_LOCAL_SIZE,
// MPI_LOCALNRANKS), 1 without a launcher.
int local_rank_count();

// Gives each local rank an equal share of the cores for OpenBLAS's thread pool (at least 1), unless
// the user set OPENBLAS_NUM_THREADS. Returns the number of threads set.
int set_blas_threads(int local_ranks);


}  // namespace zs::launch
