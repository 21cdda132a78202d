// ParamGatherer: ZeRO stage 3's parameter lifecycle. Each rank stores only its shard of the
// parameters; a module's own parameters are gathered just before its forward and its backward and
// released right after, and the next modules are gathered ahead of time.
//
// A module's own parameters are consecutive in the flat layout (canonical order), so gathering them
// is one allgatherv of that range into a transient buffer (category "params"), and the parameters'
// data views point into it until release.
//
// Prefetch. The first forward and the first backward record the order in which modules fetch their
// parameters; later passes must follow it (a different order is a ModelError naming the module
// expected and the one met - never a hang). After each fetch, the next modules of the recorded order
// are gathered ahead while their total stays within stage3_prefetch_bucket_size elements and the live
// total within stage3_max_live_parameters.
//
// Note [synchronous gathers]
// Every gather's collective runs on the calling thread (Group::allgatherv, which runs on the caller
// when no async collective is queued), prefetches included; only NVMe reads are started ahead
// asynchronously. The CPU device has no copy engine: an async allgather runs on the comm worker
// thread, which shares the cores with the rank's compute threads (the launcher gives every core to
// compute), so it overlaps nothing and adds, per module, a hand-off to the worker and a meeting of
// both ranks' workers, each of which must first preempt a compute thread. Measured with
// zero_step_bench at np 2 on 2 cores (docs/benchmarks.md): async gathers cost stage 3 about 5-7% of
// its step against the same gathers on the calling thread, where both ranks' compute threads are
// already running and meet at once. A device with a copy engine would start them asynchronously here.
//
// Note [one-sided parameter gathers]
// Where the data-parallel group lies on one node's shared memory and every rank's parameter shard in
// the shared arena (comm.shared_arena, the default there; not with ZeRO++, NVMe or host-memory
// parameters), a gather is no collective: comm::SharedShards copies each peer's part of the range
// straight out of the peer's shard (Note [One-sided gathers] in comm/shared_shards.h), so a forward
// never meets its peers at a module. The shards change only in the optimizer step and a checkpoint
// load: the engine calls begin_shard_write before it writes them (it returns once every peer has
// finished reading this version; the step's loss-and-norm allreduce has just met them there) and
// shards_written after (the next version is published; the gathered copies are dropped). A gather
// waits only for the peers it reads to have published the current version. Same bytes into the same
// buffer as the collective, counted as it: losses, digests, the summary's counters, the comms logger
// and the memory (and so the estimator) are unchanged. Elsewhere the collective path runs as before.
//
// Persistence. A module whose own parameters number fewer than stage3_param_persistence_threshold
// elements is not released after use; its gathered copy goes stale when the optimizer step changes
// the shards (invalidate) and is gathered again at its next use - once per step instead of twice per
// micro-batch. Its buffer is a persistent block of the arena, allocated by the constructor and kept
// for the whole run (Note [persistent gathered parameters] in engine/param_gatherer.cpp); the others'
// are transient blocks, allocated at each gather and freed at release.
//
// Note [reuse distance]
// DeepSpeed's stage3_max_reuse_distance: a module released in the forward whose next use (its first
// fetch in the backward) comes within that many elements of other modules' gathers is kept instead of
// released, and its backward fetch finds it gathered. At the forward-backward turn the last modules of
// the forward are the first of the backward, so without this they are dropped and gathered again a
// moment later. Once both orders are recorded, the distance is known from them: the forward's
// elements still to fetch after the release plus the backward's before the module's first fetch
// (non-persistent modules only: persistent ones are never gathered again). A kept module counts as
// prefetched: it takes room in the prefetch window (and is not kept when the window is full), so
// the live bound below and `zeroshard estimate` still hold, and stage3_prefetch_bucket_size stays
// the one knob for what is gathered ahead of use. DeepSpeed bounds what it keeps by
// stage3_max_live_parameters alone; here that bound applies too (kept modules are live).
//
// Live bound (documented and tested): gathered non-persistent parameters never exceed the parameters
// of the modules currently running (a module and its running ancestors) plus the prefetch window;
// persistent ones add their total.
#pragma once

#include <optional>
#include <unordered_map>
#include <vector>

#include "comm/group.h"
#include "comm/shared_shards.h"
#include "engine/flat_layout.h"
#include "engine/detail/zeropp_gather.h"
#include "engine/partition.h"
#include "memory/allocator.h"
#include "nn/module.h"
#include "offload/swap_space.h"

namespace zs::engine {

class ParamGatherer {
 public:
  struct Options {
    size_t prefetch_elements = 50'000'000;
    size_t persistence_threshold = 100'000;
    size_t max_live_elements = 1'000'000'000;
    size_t max_reuse_distance = 1'000'000'000;  // Note [reuse distance]; 0 releases every module after use
    // offload_param nvme: the shard lives in this swap region instead of `param_shard` (nullptr then).
    // A gather first reads the owned part (4096-aligned window) into a host staging buffer.
    offload::SwapSpace* nvme = nullptr;
    offload::SwapRegion nvme_region;
    memory::MemoryTracker* tracker = nullptr;  // counts the staging buffers (host, offload_buffers)
    memory::Tier shard_tier = memory::Tier::kDevice;  // where `param_shard` lives (kHost: offload_param cpu)
    ZeroppGather::Options zeropp;  // ZeRO++'s hpZ and qwZ (Note [ZeRO++] in engine/detail/zeropp_gather.h)
  };
  enum class Pass { kForward, kBackward };

  // `layout` is one partition group's layout, gathered over `group` (the data-parallel group, or an
  // expert-data-parallel one for expert parameters); modules whose own parameters are not in it are
  // ignored (another set's gatherer handles them).
  // `param_shard` holds this rank's shard of the flat parameters (partition.mine.size elements, `dtype`).
  ParamGatherer(const Options& options, const FlatLayout& layout, const Partition& partition, const comm::Group& group,
                memory::DeviceAllocator& device, memory::DType dtype, const void* param_shard,
                const std::vector<nn::Module*>& modules);
  ~ParamGatherer();

  void begin_pass(Pass pass);
  // The pass is over: its order is recorded (first time) or checked to be complete.
  void end_pass();
  void fetch(nn::Module& m);    // gathers (or finishes prefetching) m's own parameters; prefetches ahead
  void release(nn::Module& m);  // drops them unless persistent
  // Every gathered copy is dropped (an abandoned pass; the shards did not change).
  void invalidate();
  // Around every write of the parameter shard (optimizer step, checkpoint load), on every rank
  // alike (Note [one-sided parameter gathers]): before it, and after it (every gathered copy is
  // stale then).
  void begin_shard_write();
  void shards_written();
  bool one_sided() const { return shards_.active(); }  // gathers read the peers' shards in place

  size_t live_bytes() const { return live_elements_ * memory::dtype_size(dtype_); }
  size_t live_peak_bytes() const { return live_peak_elements_ * memory::dtype_size(dtype_); }
  size_t persistent_bytes() const;
  uint64_t gathers() const { return gathers_; }  // count of gathers started (fetches and prefetches)
  uint64_t reuse_keeps() const { return reuse_keeps_; }  // forward releases kept for the backward
  // Of gathers(), those of backward passes over the partition's group (hpZ's from its secondary copies
  // not counted): 0 where the forward kept every module for the backward (Note [reuse distance]).
  uint64_t backward_gathers() const { return backward_gathers_; }
  // offload_param nvme: bytes read from the swap file so far, and the peak of staging bytes alive.
  uint64_t nvme_bytes_read() const { return nvme_bytes_read_; }
  size_t staging_peak_bytes() const { return staging_peak_bytes_; }
  // The documented bound on live_peak_bytes() for this model (see the file comment).
  size_t live_bound_bytes() const;
  // ZeRO++ (null without hpZ and qwZ): its secondary copies' bytes and gathers.
  const ZeroppGather* zeropp() const { return zeropp_ ? &*zeropp_ : nullptr; }

 private:
  // kInFlight: gathered (or, with NVMe, its read started) but its views not yet set.
  enum class State { kReleased, kInFlight, kAvailable };
  struct Entry {
    nn::Module* module = nullptr;
    memory::ShardRange range;
    size_t first_slot = 0;
    size_t end_slot = 0;
    bool persistent = false;
    State state = State::kReleased;
    bool prefetched = false;
    memory::DeviceBlock buffer;
    offload::AlignedBuffer staging;  // nvme: the owned part read from the swap file
    offload::Ticket read;
    size_t staging_skip = 0;         // bytes before the owned part in `staging` (window alignment)
    bool from_secondary = false;     // hpZ: gathered from the secondary copies (nothing read from NVMe)
  };
  void start_gather(Entry& e);
  void gather_range(Entry& e, const memory::Tensor& in, const memory::Tensor& out);  // over group_ (or ZeRO++'s)
  void finish_gather(Entry& e);
  void drop(Entry& e);
  void prefetch_after(size_t position);
  void plan_reuse();
  bool keep_for_backward(size_t index) const;

  Options options_;
  const FlatLayout& layout_;
  const Partition& partition_;
  const comm::Group& group_;
  memory::DeviceAllocator& device_;
  memory::DType dtype_;
  const void* shard_;
  std::vector<Entry> entries_;
  std::optional<ZeroppGather> zeropp_;
  comm::SharedShards shards_;  // Note [one-sided parameter gathers]; inactive: collectives
  std::unordered_map<const nn::Module*, size_t> entry_of_;
  std::vector<size_t> trace_[2];
  bool recorded_[2] = {false, false};
  Pass pass_ = Pass::kForward;
  size_t position_ = 0;
  size_t live_elements_ = 0;
  size_t live_peak_elements_ = 0;
  size_t prefetched_elements_ = 0;
  size_t max_chain_elements_ = 0;
  uint64_t gathers_ = 0;
  uint64_t reuse_keeps_ = 0;
  uint64_t backward_gathers_ = 0;
  // Note [reuse distance], from the recorded orders (empty until both are recorded): per forward
  // position, the elements gathered from there to the forward's end; per entry, its last forward
  // position and the elements the backward gathers before its first fetch (kNever: not fetched).
  static constexpr size_t kNever = static_cast<size_t>(-1);
  std::vector<size_t> forward_after_;
  std::vector<size_t> last_forward_;
  std::vector<size_t> backward_before_;
  uint64_t nvme_bytes_read_ = 0;
  size_t staging_bytes_ = 0;
  size_t staging_peak_bytes_ = 0;
};

}  // namespace zs::engine
