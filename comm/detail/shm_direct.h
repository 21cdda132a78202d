// Direct shared-memory collectives: the peers' tensors read in place, from the shared arena
// (comm/shared_arena.h). Internal to comm: shm_reduce_scatter, shm_allgatherv and shm_allreduce
// (comm/detail/shm.h) call the direct_* functions below when the handshake agreed on an arena.
//
// Note [Direct collectives]
// Staged through the window (Note [Shared-memory collectives]), an out-of-place allgather costs at
// least two copies of the bytes it receives (into a slot, out of it). NCCL's intra-node path instead
// maps the peers' device memory (CUDA IPC) and reads their buffers directly; the cpu backend's device
// arena can be made the same way (memory/shared_mapping.h: memfd, mapped read-only by the node's
// other ranks through /proc/<pid>/fd, registered by comm::SharedArena). Then:
//  - allgather(v): each rank copies every peer's block straight from the peer's input into its own
//    output: one copy of the bytes received; its own block (out of place) before the first barrier.
//    An input overlapping the output other than exactly in place votes no arena (group.cpp), since
//    moving it would race with the peers reading it;
//  - reduce-scatter: each rank sums its shard of every rank's input into its output, in rank order
//    with fp32 accumulation (reduce_sum, as the staged path: the same bits);
//  - allreduce: each rank sums sub-slice `me` of every rank's tensor into its own tensor (in place:
//    only rank `me` reads sub-slice `me` of anyone), a barrier, then copies every peer's reduced
//    sub-slice from the peer's tensor into its own (same sub-slices and sums as the staged path).
// Only the tensor a peer reads needs to lie in the arena (an allgather's input, a reduce-scatter's
// input, an allreduce's data); outputs may be anywhere.
// Agreement: each rank looks up, when the collective is issued, which registered arena holds that
// tensor (Op::arena, an id unique to the registration) and the handshake carries it beside the
// signature (comm/detail/runtime.h). Equal nonzero ids on every rank mean every rank registered that
// arena in one collective and maps the others' (their tensors lie in it, so none has dropped it);
// then the direct path runs, else the staged one, on every rank alike. Offsets into the arena go
// in each rank's flag line (words 1-2) before the first barrier, which also says "sources ready";
// a last barrier keeps each rank from returning (and overwriting its tensor) while a peer still reads
// it. Barriers are the staged path's (timeouts, the group marked broken), so no guarantee changes.
//
// Note [Direct allreduce's copy-out]
// In the allreduce's second half every line a rank writes (its copy of a peer's reduced sub-slice)
// was read by that peer a moment before, in the peer's sum over every rank's sub-slice, so the line
// is still shared in the peer's cache and each ordinary store must first invalidate that copy: a
// cross-core round trip per line, which the store queue overlaps only a few deep. Measured on the
// 2-core Zen 4 (two threads; 512 KiB whose destination lines the other core had just read): memcpy
// 60 us (8.7 GB/s) against 11 us for the same copy into lines no other core holds; streaming stores,
// which invalidate without waiting for ownership, 18 us. So the copy-out streams at every size.
// comm_bench np 2 (docs/benchmarks.md, "Small path's round trips and allreduce's copy-out"): with a
// cache line's round trip between the two vCPUs at 0.47 us, 16 KiB-1 MiB went from 1.3-1.7x raw
// OpenMPI to 2.1-2.5x (1 MiB 1.46x -> 2.27x); at 0.11 us, 64-256 KiB from 1.85-1.89x to 2.17-2.20x,
// but 1 MiB lost (1.73-1.91x -> 1.57-1.64x): there its copy is bound by reading the peer's freshly
// summed half (rdtsc: 39-41 us of the 62-72, either way), and the streamed half, left in memory rather
// than in a cache, slows the next call's sums on the same tensor (15 -> 27 us; in training the next
// allreduce of a bucket follows a whole backward pass). The larger loss decided.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "comm/config.h"
#include "memory/shared_mapping.h"
#include "memory/tensor.h"

namespace zs::comm {
class Group;
}

namespace zs::comm::detail {

struct GroupState;
struct ShmGroup;
struct Op;

// One registration of comm::SharedArena on this rank: its own region and the peers' (by node rank).
struct ArenaView {
  int64_t id = 0;
  std::vector<const unsigned char*> base;  // by node rank: null for ranks that did not register it
  std::vector<size_t> bytes;
  std::vector<memory::SharedMapping> peers;  // owned read-only mappings of the others' regions
};

// The node's live arenas on this rank (ShmNode::arenas). Thread-safe: registered from the caller's
// thread, looked up when a collective is issued and when it runs (on the comm worker too).
class ArenaTable {
 public:
  // Reserves the next sequence number (a registration takes the max over its group, then next_after).
  int64_t next_seq() const;
  void next_after(int64_t seq);
  void add(std::shared_ptr<const ArenaView> view);
  void remove(int64_t id);
  // The id of the arena whose region of `node_rank` holds [p, p + bytes) and that offset, or 0.
  int64_t find(int node_rank, const void* p, size_t bytes, uint64_t* offset) const;
  std::shared_ptr<const ArenaView> get(int64_t id) const;

 private:
  mutable std::mutex mu_;
  int64_t next_seq_ = 1;
  std::vector<std::shared_ptr<const ArenaView>> views_;
};

// The state behind a Group (comm/shared_arena.cpp registers arenas on it).
const GroupState& group_state(const Group& group);
// Op::arena for a collective whose peers would read `bytes` bytes at `t` (0 when not in an arena).
int64_t arena_vote(const GroupState& g, const memory::Tensor& t, size_t bytes);

// Run when op.agreed_arena != 0, on a group on one node whose shm collective is usable.
// direct_broadcast: every other rank copies the root's tensor in place (one copy of clean lines; the
// staged broadcast's copies of freshly written slot lines ran 2-5x slower at times, docs/benchmarks.md).
void direct_broadcast(GroupState& g, ShmGroup& s, const Op& op, const memory::Tensor& data, int root);
void direct_allgatherv(GroupState& g, ShmGroup& s, const Op& op, const memory::Tensor& input,
                       const memory::Tensor& output, std::span<const int> counts, std::span<const int> displs);
void direct_reduce_scatter(GroupState& g, ShmGroup& s, const Op& op, const memory::Tensor& input,
                           const memory::Tensor& output, std::span<const int> counts, std::span<const int> displs,
                           ReduceOp r);
void direct_allreduce(GroupState& g, ShmGroup& s, const Op& op, const memory::Tensor& data, ReduceOp r);

}  // namespace zs::comm::detail
