// A small worker pool for data-parallel loops with an explicit thread count.
//
// Work over [0, n) is split into min(threads, ceil(n / grain)) contiguous ranges in index order; the
// calling thread takes ranges itself, and pool workers (created on first use, joined at exit) take
// the rest. Nested calls from inside a range run serially on that thread. One region runs at a time
// (callers from several threads queue). Nothing here reads the environment or any library's thread
// setting: callers pass the count (nn uses OpenBLAS's, see nn/detail/parallel.h; the optimizer takes
// it from the engine).
//
//   zs::parallel_for_threads(2, n, /*grain=*/4096, [&](int64_t begin, int64_t end, int chunk) { ... });
//
// Callables must not throw (validate inputs before the parallel part) and must only touch disjoint
// outputs per range. Results that depend only on each range's own elements do not depend on the
// thread count.
#pragma once

#include <cstdint>
#include <type_traits>

namespace zs {

// The number of ranges a loop over n items uses: min(threads, ceil(n / grain)), >= 1.
int parallel_chunks(int threads, int64_t n, int64_t grain);

// Runs fn(ctx, begin, end, chunk) over parallel_chunks(threads, n, grain) contiguous ranges tiling
// [0, n), in parallel; chunk is the range's index (for per-thread scratch). Range c is
// [n * c / chunks, n * (c + 1) / chunks). Returns when all are done.
void run_parallel(int threads, int64_t n, int64_t grain, void (*fn)(void*, int64_t, int64_t, int), void* ctx);

// Sends workers polling for the next region (Note [worker spin] in parallel.cpp) to sleep now: call
// before running another library's threads (OpenBLAS's sgemm) on the cores the pool's workers hold.
// Cheap (one atomic add), safe from any thread, inside a region too.
void park_pool_workers();

// f(begin, end, chunk) over ranges of [0, n) on `threads` threads.
template <typename F>
void parallel_for_threads(int threads, int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  if (parallel_chunks(threads, n, grain) <= 1) {
    f(int64_t{0}, n, 0);
    return;
  }
  using Fn = std::remove_reference_t<F>;
  run_parallel(
      threads, n, grain, [](void* c, int64_t b, int64_t e, int chunk) { (*static_cast<Fn*>(c))(b, e, chunk); },
      const_cast<void*>(static_cast<const void*>(&f)));
}

}  // namespace zs
