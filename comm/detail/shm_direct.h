// Direct shared-memory collectives: the peers' tensors read in place (an allreduce also writes them),
// in the shared arena (comm/shared_arena.h). Internal to comm: shm_reduce_scatter, shm_allgatherv and shm_allreduce
// (comm/detail/shm.h) call the direct_* functions below when the handshake agreed on an arena.
//
// Note [Direct collectives]
// Staged through the window (Note [Shared-memory collectives]), an out-of-place allgather costs at
// least two copies of the bytes it receives (into a slot, out of it). NCCL's intra-node path instead
// maps the peers' device memory (CUDA IPC) and reads their buffers directly; the cpu backend's device
// arena can be made the same way (memory/shared_mapping.h: memfd, mapped by the node's other ranks
// through /proc/<pid>/fd, registered by comm::SharedArena). Then:
//  - allgather(v): each rank copies every peer's block straight from the peer's input into its own
//    output: one copy of the bytes received; its own block (out of place) before the first barrier.
//    An input overlapping the output other than exactly in place votes no arena (group.cpp), since
//    moving it would race with the peers reading it;
//  - reduce-scatter: each rank sums its shard of every rank's input into its output, in rank order
//    with fp32 accumulation (reduce_sum, as the staged path: the same bits);
//  - allreduce: each rank sums sub-slice `me` of every rank's tensor and writes it into every rank's
//    tensor (Note [Direct allreduce's writes]; same sub-slices and sums as the staged path).
// Only the tensor a peer reads (or, in an allreduce, writes) needs to lie in the arena (an allgather's
// input, a reduce-scatter's input, an allreduce's data); outputs may be anywhere.
// Agreement: each rank looks up, when the collective is issued, which registered arena holds that
// tensor (Op::arena, an id unique to the registration) and the handshake carries it beside the
// signature (comm/detail/runtime.h). Equal nonzero ids on every rank mean every rank registered that
// arena in one collective and maps the others' (their tensors lie in it, so none has dropped it);
// then the direct path runs, else the staged one, on every rank alike. Offsets into the arena go
// in each rank's flag line (words 1-2) before the first barrier, which also says "sources ready";
// a last barrier keeps each rank from returning (and overwriting its tensor) while a peer still reads
// it. Barriers are the staged path's (timeouts, the group marked broken), so no guarantee changes.
//
// Note [Direct allreduce's writes]
// Each rank sums sub-slice `me` of every rank's tensor and writes the sum into every rank's tensor
// (the peers' regions are mapped read-write for this: memory::PeerAccess). Only rank `me` reads or
// writes sub-slice `me` of anyone, so two barriers suffice: "sources ready" and "all written".
// The first version wrote the sum into its own tensor only, then, after a barrier, copied every
// peer's reduced sub-slice out of the peer's tensor. That copy-out read lines the peer had written a
// moment before, one cross-core transfer per line, and wrote lines the peer had just read: at 1 MiB
// (comm_bench np 2, 2-core Zen 4) sums 15 us, copy-out 39-41 us of 62-72 us, 1.35-1.5x raw OpenMPI
// with a 0.12 us cache-line round trip between the cores (2.0x at 0.44 us). Writing the peers'
// tensors directly drops the copy-out's read of the peer's sum and a barrier: every byte a rank
// writes into a peer's tensor is one it read (as a source) a moment before, so it holds the line and
// the store needs no transfer (at most an invalidation, where the peer wrote the line last); per
// sub-slice byte a rank reads L sources and writes L outputs, and nothing crosses twice.
// Measured (docs/benchmarks.md, "Allreduce writing the peers' tensors"): 1 MiB 65-70 us -> 20-31 us.
//  - Chunks of kAllreduceChunkBytes: the sum goes into this rank's tensor and is copied from L1 into
//    the peers'; one pass over the whole sub-slice first (no chunks) ran 2-3x slower (the copies
//    re-read the sums from L2 or beyond); 8 KiB chunks the steadiest (1 MiB 26-30 us), 16-64 KiB
//    32-64 us.
//  - Ordinary stores, not streaming ones: streaming stores to lines this rank holds evict them
//    (1 MiB 55-64 us against 20-31). The price: after the call the peers' copies of sub-slice `me`
//    may still sit modified in this rank's cache, so a peer's next read of them (its optimizer) is a
//    cross-core transfer rather than a read from memory; the old copy-out paid that transfer itself,
//    before returning. PREFETCHW on the peers' lines a chunk ahead changed nothing measurable (comm_bench).
//  - A rank that passed the first barrier writes into its peers' tensors until the last one. A peer
//    that times out at the last barrier (this rank stalled for comm.timeout_s) leaves the group
//    broken and its tensor undefined, as any failed collective; a late write lands only inside that
//    tensor, never outside the bounds the peer published for this collective.
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
  std::vector<unsigned char*> base;  // by node rank: null for ranks that did not register it
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
// Bytes of sub-slice a direct allreduce sums and copies to its peers at a time (Note [Direct allreduce's writes]).
inline constexpr size_t kAllreduceChunkBytes = size_t{8} << 10;
void direct_allreduce(GroupState& g, ShmGroup& s, const Op& op, const memory::Tensor& data, ReduceOp r);

}  // namespace zs::comm::detail
