// FLOP counting for profilers (the engine's flops_profiler): the floating-point operations nn's
// kernels performed, counted where they happen rather than estimated from shapes.
//
//   uint64_t before = zs::nn::flops_performed();
//   ... ctx.forward(*block, x) ...
//   uint64_t block_flops = zs::nn::flops_performed() - before;   // this thread's view of all threads
//
// What counts: every matrix product as 2*m*n*k (nn's one sgemm chokepoint, nn/detail/ops.h, counts
// itself; a module with kernels of its own adds its figure with add_flops). Elementwise work (GELU,
// layernorm, softmax, residual adds) is not counted: in a transformer it is well under 1% of the
// products' FLOPs, and counting it would cost a call per loop. Products skipped because the run only
// measures memory (Note [measuring run] in nn/detail/parallel.h) are not counted.
//
// Thread-safety: one process-wide counter, added to with relaxed atomics from any thread (layers run
// products on worker threads). A difference of two readings on the thread driving the model covers
// the work of the calls in between, whichever threads did it.
#pragma once

#include <cstdint>

namespace zs::nn {

// FLOPs performed by nn's kernels in this process so far.
uint64_t flops_performed();
// Adds `flops` to the counter (a module's own kernels).
void add_flops(uint64_t flops);

}  // namespace zs::nn
