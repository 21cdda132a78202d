// gtest main for tests registered with KERNEL_VARIANTS (cmake/ZeroshardHelpers.cmake): the same
// binary runs once per kernel set, chosen by --isa= and --blas-core= (tests/support/kernel_flags.h).
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/support/kernel_flags.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);  // removes gtest's own flags
  if (const int code = zs::test::take_kernel_flags(argc, argv); code >= 0) return code;
  if (argc > 1) {
    std::fprintf(stderr, "unknown argument '%s' (this main takes --isa=LEVEL and --blas-core=NAME)\n", argv[1]);
    return 2;
  }
  return RUN_ALL_TESTS();
}
