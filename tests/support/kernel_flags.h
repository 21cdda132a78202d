// The kernel-set flags of the numerical tests' variants (cmake/ZeroshardHelpers.cmake, KERNEL_VARIANTS;
// docs/design.md, "Kernel variants of the numerical tests"), read by both gtest mains (kernel_test_main
// and mpi_test_main) so one binary runs once per kernel set:
//
//   --isa=avx2|avx512|scalar   caps the library's own SIMD dispatch (memory::set_isa_cap, Note [ISA cap]
//                              in memory/cpu_features.cpp) before any kernel is chosen
//   --blas-core=NAME           the OpenBLAS kernels this run is meant for; ctest sets OPENBLAS_CORETYPE
//                              in the test's environment (OpenBLAS reads it when it loads, before main),
//                              and this checks that it took effect
//
// A variant the CPU cannot run (AVX-512 on an AVX2 machine) is skipped (kKernelSkipCode, ctest's
// SKIP_RETURN_CODE) after saying why, never passed. A kernel set asked for but not loaded is a failure:
// the run would otherwise test other kernels than its name says.
#pragma once

namespace zs::test {

inline constexpr int kKernelSkipCode = 77;

// Takes --isa= and --blas-core= out of argv (argc shrinks), applies them and prints the kernels in
// use. Returns -1 to go on, else the exit code the process must end with (skip or failure).
int take_kernel_flags(int& argc, char** argv);

}  // namespace zs::test
