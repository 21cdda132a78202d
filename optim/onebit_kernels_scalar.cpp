// The one-bit / 0/1 Adam loops (optim/detail/onebit_loops.h) built for scalar: compiled with
// baseline x86-64 (SSE2) plus -ffp-contract=off -fno-math-errno.
#include "optim/detail/onebit_loops.h"

namespace zs::optim::detail {

template struct CompressedLoops<ScalarIsa>;

}  // namespace zs::optim::detail
