// The threads one rank computes with: OpenBLAS's thread count, which the edge program sets per rank
// (launch/launch.h, set_blas_threads). nn's elementwise passes and the engine's optimizer step and
// backend operations use the same number, so a rank never takes more than its share of the node.
#pragma once

namespace zs::nn {

int compute_threads();  // >= 1

}  // namespace zs::nn
