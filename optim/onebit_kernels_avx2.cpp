// The one-bit / 0/1 Adam loops (optim/detail/onebit_loops.h) built for avx2: compiled with
// -mavx2 -mfma -mf16c (zs_isa_sources) plus -ffp-contract=off -fno-math-errno.
#include "optim/detail/onebit_loops.h"

namespace zs::optim::detail {

template struct CompressedLoops<Avx2Isa>;

}  // namespace zs::optim::detail
