// PipelinedSwapper: streams sub-groups of swapped-out state through host buffers, overlapping the
// disk with the computation (ZeRO-Infinity's optimizer step over NVMe-resident states).
//
//   std::vector<std::vector<SwapItem>> groups = ...;   // per sub-group: master, exp_avg, exp_avg_sq, ...
//   log("host budget {}", PipelinedSwapper::host_budget_bytes(largest_group_bytes, 3));
//   PipelinedSwapper swapper(groups, {.buffer_count = 3, .tracker = &tracker});
//   swapper.run([&](size_t g, std::span<std::span<std::byte>> items) {
//     // items[k] holds groups[g][k].bytes bytes: read from disk unless kWriteOnly; written back after
//     // this returns unless kReadOnly.
//   });
//
// Note [Swap pipeline]
// With B = min(buffer_count, sub-groups) buffers, sub-group g uses buffer g % B. Reads run
// L = max(1, B - 2) sub-groups ahead (L = 0 when B = 1): before the read of sub-group j is issued, the
// write-back of j - B, which last used that buffer, must have completed. So with B = 3, while
// compute(g) runs, the read of g + 1 and the write-back of g - 1 are in flight; the write-back of
// g - 2 had all of compute(g - 1) to finish. B = 2 overlaps only reads; B = 1 overlaps nothing.
// run() returns after every write has completed. If any transfer fails, or compute throws, run()
// waits for every transfer still in flight (none may outlive the buffers it points into) and then
// rethrows the first error (IoError from I/O).
//
// Items. An item is a byte range of a swap region: `offset` (a multiple of 4096) and `bytes` within
// the region. In the host buffer each item starts at a multiple of 4096; transfers are the item's
// bytes rounded up to 4096 (the region reserves that much), so they all go through O_DIRECT. The
// rounding tail of a buffer and the contents of kWriteOnly items before compute are unspecified:
// compute must fill a kWriteOnly item completely. No two items (of any sub-groups) may overlap.
//
// Host memory: B * sub_group_buffer_bytes(largest sub-group) bytes, allocated in the constructor and
// counted as offload_buffers on the host tier; host_budget_bytes() gives the same figure up front.
// Thread-safety: one run() at a time; compute runs on the caller's thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "memory/tracker.h"
#include "offload/aligned_buffer.h"
#include "offload/swap_space.h"

namespace zs::offload {

enum class SwapMode : uint8_t {
  kReadWrite,  // read before compute, written back after
  kReadOnly,   // read before compute only
  kWriteOnly,  // written after compute only
};

struct SwapItem {
  SwapRegion region;
  uint64_t offset = 0;  // bytes from the region's start; multiple of 4096
  size_t bytes = 0;
  SwapMode mode = SwapMode::kReadWrite;
};

struct SwapperOptions {
  size_t buffer_count = 3;  // >= 1: read-ahead + compute + write-back (DeepSpeed's buffer_count)
  bool pin_memory = false;  // mlock the buffers
  memory::MemoryTracker* tracker = nullptr;
};

// Cumulative over run() calls: counts and byte sums, seconds of wall-clock time.
struct SwapperStats {
  uint64_t runs = 0;
  uint64_t sub_groups = 0;       // compute calls
  uint64_t bytes_read = 0;       // bytes transferred (each item rounded up to 4096)
  uint64_t bytes_written = 0;
  double compute_seconds = 0;    // inside compute
  double io_wait_seconds = 0;    // blocked waiting for transfers (the disk was the bottleneck)
  double run_seconds = 0;        // whole run() calls
};

class PipelinedSwapper {
 public:
  using ComputeFn = std::function<void(size_t sub_group, std::span<std::span<std::byte>> item_buffers)>;

  // Checks the items (InternalError on a region of no swap space, a misaligned offset, a range past
  // its region, or overlapping items) and allocates the buffers (OutOfMemoryError).
  PipelinedSwapper(std::vector<std::vector<SwapItem>> sub_groups, const SwapperOptions& options = {});
  PipelinedSwapper(const PipelinedSwapper&) = delete;
  PipelinedSwapper& operator=(const PipelinedSwapper&) = delete;

  void run(const ComputeFn& compute);
  // Starts the reads of the first sub-groups now (as many as run() would have in flight before its
  // first compute), so they overlap whatever the caller does until run(); the engine calls it when
  // the last backward of a step begins (the states do not depend on the gradients). Idempotent until
  // run(); the buffers must not be touched in between. Errors surface in run() (or the destructor
  // drains them).
  void prefetch();
  ~PipelinedSwapper();

  // Bytes of one sub-group's host buffer: its items each rounded up to 4096, summed.
  static size_t sub_group_buffer_bytes(std::span<const SwapItem> items);
  static size_t sub_group_buffer_bytes(std::span<const size_t> item_bytes);
  // The host memory of a swapper: buffer_count * sub_group_bytes rounded up to 4096, where
  // sub_group_bytes is sub_group_buffer_bytes() of the largest sub-group. An upper bound (fewer
  // sub-groups than buffers allocate fewer).
  static size_t host_budget_bytes(size_t sub_group_bytes, size_t buffer_count);

  size_t host_buffer_bytes() const;  // bytes of the buffers allocated
  size_t buffer_count() const { return buffers_.size(); }
  // Host buffer i (< buffer_count()), all its capacity: for benchmarks that must compare against
  // the very same memory. Must not be touched during run().
  std::span<std::byte> host_buffer(size_t i) const { return {buffers_.at(i).data(), buffers_.at(i).capacity()}; }
  size_t sub_group_count() const { return groups_.size(); }
  const SwapperStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  struct Pending {
    AsyncFile* file = nullptr;
    Ticket ticket;
    size_t bytes = 0;
  };
  void issue(size_t group, size_t buffer, bool reads, std::vector<Pending>& out);
  // Waits for all of `pending` (even after a failure), adds their bytes to `counter`, clears it, and
  // rethrows the first failure.
  void wait_for(std::vector<Pending>& pending, uint64_t& counter);

  std::vector<std::vector<SwapItem>> groups_;
  std::vector<std::vector<size_t>> item_offsets_;  // per sub-group: each item's offset in its buffer
  std::vector<AlignedBuffer> buffers_;
  size_t lookahead_ = 0;
  std::vector<std::vector<Pending>> prefetched_reads_;  // per buffer, issued by prefetch()
  size_t prefetched_ = 0;                                // sub-groups whose reads prefetch() issued
  SwapperStats stats_;
};

}  // namespace zs::offload
