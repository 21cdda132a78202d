// Allocation traces: record the block requests of a real run, replay them into any AllocatorPolicy.
//
// A DeviceAllocator with a recorder attached (set_trace_recorder) appends one event per successful
// allocation and per free; replay() feeds the same sequence to a policy (e.g. TwoEndedBestFit vs
// SinglePoolBestFit) and reports peak reserved bytes and fragmentation, so placement policies can be
// compared on real allocation patterns without running the model again.
//
// File format (text, one event per line, '#' starts a comment line, fields separated by one space):
//   zeroshard-alloc-trace 1 <capacity_bytes>          first line: magic, version, arena capacity
//   a <id> <bytes> <persistent|transient|saved|spanning> <category>   allocation (bytes as requested, unaligned)
//   f <id>                                             free of the block allocated as <id>
// ids are unique per trace (the allocator's block ids); category is a category_name() ("grads").
// Requests that failed with OutOfMemoryError are not recorded.
//
//   AllocTraceRecorder rec(allocator.capacity());
//   allocator.set_trace_recorder(&rec);  ... run ...  allocator.set_trace_recorder(nullptr);
//   save_trace(rec.trace(), "run.trace");
//   SinglePoolBestFit single(trace.capacity_bytes);
//   ReplayResult r = replay(load_trace("run.trace"), single);
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <mutex>
#include <string>
#include <vector>

#include "memory/alloc_policy.h"
#include "memory/category.h"

namespace zs::memory {

struct TraceEvent {
  enum class Op : uint8_t { kAlloc, kFree };
  Op op = Op::kAlloc;
  uint64_t id = 0;
  size_t bytes = 0;                           // kAlloc only
  Lifetime lifetime = Lifetime::kPersistent;  // kAlloc only
  Category category = Category::kParams;      // kAlloc only
  bool operator==(const TraceEvent&) const = default;
};

struct AllocTrace {
  size_t capacity_bytes = 0;
  std::vector<TraceEvent> events;
  bool operator==(const AllocTrace&) const = default;
};

// Text format above. Parsing errors throw IoError naming `source` and the line number.
void write_trace(const AllocTrace& trace, std::ostream& out);
AllocTrace read_trace(std::istream& in, const std::string& source);
void save_trace(const AllocTrace& trace, const std::string& path);  // IoError naming the path
AllocTrace load_trace(const std::string& path);

// Collects events; thread-safe (the allocator calls it under its own lock, so the order is the
// allocator's order).
class AllocTraceRecorder {
 public:
  explicit AllocTraceRecorder(size_t capacity_bytes) { trace_.capacity_bytes = capacity_bytes; }
  void record_alloc(uint64_t id, size_t bytes, Lifetime lifetime, Category category);
  void record_free(uint64_t id);
  AllocTrace trace() const;  // a copy
  size_t size() const;       // count of events

 private:
  mutable std::mutex mu_;  // guards trace_
  AllocTrace trace_;
};

struct ReplayResult {
  size_t events = 0;                // count of events replayed
  size_t failed_allocs = 0;         // count of allocations the policy could not place (their frees skipped)
  size_t peak_requested_bytes = 0;  // byte sum of the live requests as the trace states them (policy-independent)
  size_t peak_allocated_bytes = 0;  // byte sum, as the policy counts blocks (its rounding included)
  size_t peak_reserved_bytes = 0;   // byte sum
  double max_fragmentation = 0.0;   // maximum after any event
  double mean_fragmentation = 0.0;  // mean over events
  ArenaStats final_stats;
};

// Replays `trace` into `policy` (which starts empty; its capacity may differ from the trace's).
// With `check_each_step`, policy.check_invariants() runs after every event (InternalError on the
// first violation). Throws IoError for a malformed sequence (free of an unknown id, duplicate id).
ReplayResult replay(const AllocTrace& trace, AllocatorPolicy& policy, bool check_each_step = false);

}  // namespace zs::memory
