#include "core/parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <sched.h>
#include <vector>

#include "core/errors.h"
#include "core/spin.h"

namespace zs {
namespace {

constexpr std::chrono::microseconds kCallerSpin{50};   // Note [pool waits]
constexpr std::chrono::microseconds kWorkerSpin{300};  // Note [worker spin]

// Note [worker pool]: OpenMP (libgomp) was tried first: its idle threads spin for milliseconds after
// each parallel region (OMP_WAIT_POLICY, an environment setting library code must not depend on)
// and took a fifth of the cores from OpenBLAS's sgemm threads. These workers instead sleep on a
// condition variable as soon as there is no chunk to take, and the calling thread takes chunks
// itself, so a slow wake-up never delays a region: at worst the caller does all of it.
//
// A region's chunks are claimed through one atomic word holding (generation << 32 | the next chunk
// from the back << 16 | the next from the front): a worker that woke for an older region cannot
// claim a chunk of a newer one. The caller claims from the front and workers from the back, and a
// region of c chunks is served by the first c - 1 workers only (two workers taking from the back
// would reach chunk 0). So with 2 threads the caller runs chunk 0 and the worker chunk 1 of every
// region unless one of them is late, and consecutive passes over the same rows find them in their
// core's cache; a race for chunk 0 gave it to the worker in about one region in six (Note [bf16
// kernel scheduling] in nn/detail/gemm_avx512bf16.cpp keeps its products' rows on the same chunks).
//
// Note [pool waits]: the caller, once its own chunks are done, waits for the workers' last chunks.
// It used to poll with sched_yield until they were done. A yielding thread stays runnable, and the
// Linux scheduler hardly ever picks a SCHED_IDLE thread over it: an asynchronous checkpoint's writer
// (Note [async writer priority] in engine/engine_checkpoint.cpp), meant to fill the training's idle
// moments, got none while the caller waited. The caller now polls with a CPU pause for up to
// kCallerSpin (most waits end within it: the chunks are equal and started together, so the wait is
// about a worker's wake-up) and then sleeps on done_ (a futex) until the last worker's chunk ends,
// so a longer wait frees the core.
//
// Note [worker spin]: a worker used to go to sleep on the condition variable as soon as a region's
// chunks were gone, so every region began with a wake-up. On the 2-core VM measured (a
// paravirtualised guest, niced builds on the other core) a wake-up took 90 us at the median, and in
// a fifth of the regions the kernel queued the woken worker on the caller's own core, where it ran
// only once the caller's chunk was done: the region then ran serially (tools: the pool latency
// probe in docs/benchmarks.md, "Worker pool wake-ups"). The layers issue regions back to back (an
// elementwise pass, a product, the next pass), so a worker now polls for the next region for up to
// kWorkerSpin before it sleeps, and the caller signals the condition variable only when a worker
// sleeps. The poll pauses (cpu_relax) rather than yielding: a yielding poller is runnable all the
// time, the kernel's balancing then stacked it on the caller's core half of the time. A polling
// worker holds its core, so code about to start another thread pool (nn's multi-threaded sgemm:
// OpenBLAS's threads) calls park_pool_workers() first and the pollers go to sleep at once.
class WorkerPool {
 public:
  static WorkerPool& instance() {
    static WorkerPool pool;  // joined at exit; workers hold no other resources
    return pool;
  }

  void run(int chunks, int64_t n, void (*fn)(void*, int64_t, int64_t, int), void* ctx) {
    if (in_region_) {  // a nested call from inside a region (worker or caller): run it here
      for (int c = 0; c < chunks; ++c) fn(ctx, n * c / chunks, n * (c + 1) / chunks, c);
      return;
    }
    ZS_ASSERT(chunks < (1 << 16), "parallel region of {} chunks (at most 65535: the claim word's fields)", chunks);
    std::lock_guard<std::mutex> caller(caller_mu_);  // one region at a time
    uint64_t gen;
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (static_cast<int>(workers_.size()) < chunks - 1) {
        workers_.emplace_back([this, index = static_cast<int>(workers_.size())] { work(index); });
      }
      job_ = {fn, ctx, n, chunks};
      done_.store(0, std::memory_order_relaxed);
      gen = ++generation_;
      next_.store(gen << 32 | static_cast<uint64_t>(chunks) << 16, std::memory_order_release);
      published_.store(gen, std::memory_order_release);
      wake = sleepers_ > 0;
    }
    if (wake) cv_.notify_all();
    // The caller runs chunks too; a nested call from one of them must not take caller_mu_ again.
    in_region_ = true;
    drain(gen, job_, true);
    in_region_ = false;
    wait_done(chunks);
  }

  void park() { park_.fetch_add(1, std::memory_order_relaxed); }

  ~WorkerPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    park();
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

 private:
  struct Job {
    void (*fn)(void*, int64_t, int64_t, int) = nullptr;
    void* ctx = nullptr;
    int64_t n = 0;
    int chunks = 0;
  };

  // The caller's wait for the region's last chunks (Note [pool waits]).
  void wait_done(int chunks) {
    if (done_.load(std::memory_order_acquire) >= chunks) return;
    const auto until = std::chrono::steady_clock::now() + kCallerSpin;
    for (int polls = 1;; ++polls) {
      if (done_.load(std::memory_order_acquire) >= chunks) return;
      cpu_relax();
      if (polls % 64 == 0 && std::chrono::steady_clock::now() >= until) break;
    }
    for (int d = done_.load(std::memory_order_acquire); d < chunks; d = done_.load(std::memory_order_acquire)) {
      done_.wait(d, std::memory_order_acquire);
    }
  }

  // Claims and runs chunks of region `gen` until none is left: the caller from the front, workers
  // from the back.
  void drain(uint64_t gen, const Job& job, bool front) {
    uint64_t v = next_.load(std::memory_order_acquire);
    for (;;) {
      const int f = static_cast<int>(v & 0xffffu), b = static_cast<int>(v >> 16 & 0xffffu);
      if ((v >> 32) != gen || f >= b) return;
      if (!next_.compare_exchange_weak(v, front ? v + 1 : v - (uint64_t{1} << 16), std::memory_order_acq_rel)) continue;
      const int c = front ? f : b - 1;
      job.fn(job.ctx, job.n * c / job.chunks, job.n * (c + 1) / job.chunks, c);
      // The last chunk wakes a caller asleep in wait_done (no system call when none sleeps).
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == job.chunks) done_.notify_one();
      v = next_.load(std::memory_order_acquire);
    }
  }

  // Polls for a region newer than `seen` for up to kWorkerSpin, or until park() moves park_ from
  // `parked` (read when the last region began, so a park() after it always ends the poll).
  void poll_for_region(uint64_t seen, uint64_t parked) const {
    const auto until = std::chrono::steady_clock::now() + kWorkerSpin;
    while (published_.load(std::memory_order_acquire) == seen && park_.load(std::memory_order_relaxed) == parked) {
      for (int i = 0; i < 64; ++i) cpu_relax();
      if (std::chrono::steady_clock::now() >= until) return;
    }
  }

  // Worker `index` takes chunks only of regions with more than index + 1 chunks: a region of c chunks
  // is served by the caller and the first c - 1 workers, however many earlier, wider regions started.
  void work(int index) {
    in_region_ = true;
    uint64_t seen = 0;
    uint64_t parked = park_.load(std::memory_order_relaxed);
    for (;;) {
      poll_for_region(seen, parked);
      Job job;
      uint64_t gen;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (!stop_ && generation_ == seen) {
          ++sleepers_;
          cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
          --sleepers_;
        }
        if (stop_) return;
        gen = seen = generation_;
        job = job_;
        parked = park_.load(std::memory_order_relaxed);
      }
      if (index < job.chunks - 1) drain(gen, job, false);
    }
  }

  std::mutex caller_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> workers_;
  Job job_;
  uint64_t generation_ = 0;
  bool stop_ = false;
  int sleepers_ = 0;                        // workers in cv_.wait (under mu_)
  std::atomic<uint64_t> published_{0};      // generation_, for workers polling without mu_
  std::atomic<uint64_t> park_{0};           // bumped by park(): polling workers go to sleep
  std::atomic<uint64_t> next_{0};
  std::atomic<int> done_{0};
  static thread_local bool in_region_;  // this thread is running a chunk (workers: always)
};

thread_local bool WorkerPool::in_region_ = false;

}  // namespace

int parallel_chunks(int threads, int64_t n, int64_t grain) {
  const int64_t by_size = (n + std::max<int64_t>(grain, 1) - 1) / std::max<int64_t>(grain, 1);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, by_size)));
}

void park_pool_workers() { WorkerPool::instance().park(); }

void run_parallel(int threads, int64_t n, int64_t grain, void (*fn)(void*, int64_t, int64_t, int), void* ctx) {
  const int chunks = parallel_chunks(threads, n, grain);
  if (chunks <= 1) {
    fn(ctx, 0, n, 0);
    return;
  }
  WorkerPool::instance().run(chunks, n, fn, ctx);
}

}  // namespace zs
