// Internal: how the nn layers spread elementwise work over cores.
//
// Note [compute threads]: the layers' large matmuls run as bands on this pool (Note [sgemm on the
// pool], ops.cpp; smaller ones on OpenBLAS's thread pool); between them the
// elementwise passes (softmax, GELU, LayerNorm, cross-entropy, bias sums) ran on one thread while the
// other BLAS threads sat idle, which cost a third of a training step on 2 cores. These passes now run
// on core's worker pool (core/parallel.h, Note [worker pool] in core/parallel.cpp) with exactly OpenBLAS's thread count
// (openblas_get_num_threads), so a process never uses more cores than its BLAS share: the edge
// program sets that share per rank (launch/launch.h), and N ranks x threads stays within the machine. Work is split into contiguous ranges in index order,
// and every reduction either stays inside one range or is summed serially afterwards, so results do
// not depend on the thread count (bit for bit) - except OpenBLAS's own sums.
//
//   detail::parallel_for(rows, /*grain=*/16, [&](int64_t begin, int64_t end, int chunk) { ... });
//
// Callables must not throw (validate inputs before the parallel part) and must only touch disjoint
// outputs per range.
#pragma once

#include <cstdint>
#include <utility>

#include "core/parallel.h"
#include "nn/threads.h"

namespace zs::nn::detail {

// The number of threads the layers use: nn::compute_threads() (nn/threads.h).
using nn::compute_threads;

// The generic pool (explicit thread count) lives in core.
using zs::parallel_chunks;
using zs::run_parallel;

// Note [measuring run]: the memory estimator runs the model over a Context whose computes() is false
// (the engine over memory::MeasuringBackend): every allocation happens as in training, no arithmetic
// does. Context::forward_loss/backward_loss then hold a KernelsOff on the running thread, and the
// layer kernels (parallel_for, gemm, the embedding and reduction helpers in ops.h, the fp32 copies of
// param_access.h) return at once. Layers therefore need no measuring code of their own; a user's
// module that loops over tensors itself may check ctx.computes() (its loop is harmless either way).
bool kernels_enabled();
class KernelsOff {
 public:
  KernelsOff();
  ~KernelsOff();
  KernelsOff(const KernelsOff&) = delete;
  KernelsOff& operator=(const KernelsOff&) = delete;

 private:
  bool saved_;
};

// core's parallel_for_threads, doing nothing while kernels are off (the flag is the calling thread's:
// the pool's threads do not see it).
template <typename F>
void parallel_for_threads(int threads, int64_t n, int64_t grain, F&& f) {
  if (!kernels_enabled()) return;
  zs::parallel_for_threads(threads, n, grain, std::forward<F>(f));
}

// The same on compute_threads() threads.
template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  parallel_for_threads(compute_threads(), n, grain, std::forward<F>(f));
}

// While alive, OpenBLAS runs single-threaded (for sgemm calls made from inside parallel_for_threads,
// one per thread; threads() is the count before, to pass to it); restores the count on destruction. Not thread-safe: the thread running the model
// owns OpenBLAS's settings while it runs.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas();
  ~SingleThreadedBlas();
  int threads() const { return saved_; }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int saved_;
};

}  // namespace zs::nn::detail
