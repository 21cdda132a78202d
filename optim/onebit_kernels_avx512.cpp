// The one-bit / 0/1 Adam loops (optim/detail/onebit_loops.h) built for avx512: compiled with
// -mavx512f/bw/vl/dq (zs_isa_sources) plus -ffp-contract=off -fno-math-errno.
#include "optim/detail/onebit_loops.h"

namespace zs::optim::detail {

template struct CompressedLoops<Avx512Isa>;

}  // namespace zs::optim::detail
