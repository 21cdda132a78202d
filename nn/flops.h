// FLOP counting for profilers and model FLOPs utilisation (the engine's flops_profiler, the step
// report's model_flops): the floating-point operations nn's kernels performed, counted where they
// happen rather than estimated from shapes, and the peak rate they are measured against.
//
//   uint64_t before = zs::nn::flops_performed();
//   ... ctx.forward(*block, x) ...
//   uint64_t block_flops = zs::nn::flops_performed() - before;   // this thread's view of all threads
//
// What counts: every matrix product as 2*m*n*k, counted where nn's products run (the sgemm wrapper in
// nn/detail/ops.h and the bf16 kernel's entry in nn/detail/gemm.h count themselves; a module with
// kernels of its own adds its figure with add_flops). Elementwise work (GELU,
// layernorm, softmax, residual adds) is not counted: in a transformer it is well under 1% of the
// products' FLOPs, and counting it would cost a call per loop. Products skipped because the run only
// measures memory (Note [measuring run] in nn/detail/parallel.h) are not counted.
//
// Recomputation: products that redo forward work inside a backward (a checkpointed module's re-run,
// Context::recompute; attention's selective recompute of its scores) count in flops_performed() like
// any other and are also added to flops_recomputed(), so model FLOPs = performed - recomputed.
//
// Thread-safety: process-wide counters, added to with relaxed atomics from any thread (layers run
// products on worker threads). A difference of two readings on the thread driving the model covers
// the work of the calls in between, whichever threads did it.
#pragma once

#include <cstdint>

#include "memory/dtype.h"
#include "memory/peak_flops.h"

namespace zs::nn {

// FLOPs performed by nn's kernels in this process so far.
uint64_t flops_performed();
// Adds `flops` to the counter (a module's own kernels).
void add_flops(uint64_t flops);
// Of flops_performed(), the FLOPs that recomputed forward work (see above).
uint64_t flops_recomputed();
// Marks `flops`, already added with add_flops, as recomputation.
void add_flops_recomputed(uint64_t flops);

// The peak FLOP rate of this rank's cores (compute_threads(), nn/threads.h) for products of layers
// whose weights are `compute` (Note [peak probe] in memory/peak_flops.h): the vdpbf16ps rate for bf16
// where nn's bf16 products run on the AVX512-BF16 kernel (nn/detail/gemm.h), else the fp32 FMA rate
// (fp32 and fp16 always, bf16 where its products are widened to sgemm). Measured on first use, kept.
const memory::PeakFlops& product_peak(memory::DType compute);

}  // namespace zs::nn
