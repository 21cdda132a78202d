// Small collectives through the node window in one exchange (Note [Small collectives]). Internal to
// comm: group.cpp decides per call and marks the Op small (carry_if_small); Runtime::execute runs
// small_exchange in place of the handshake, then small_body and small_done, and last small_reclaim.
//
// Note [Small collectives]
// Every collective first ran the handshake (Note [Handshake] in comm/detail/runtime.h: nonblocking
// MPI messages, ~1 us at 2 ranks) and then its body: for a tensor under kShmAutoMinBytes MPI's own
// collective (~0.5-1.3 us at 16 B-1 KiB), or under comm.shared_memory true a flags barrier too. So a
// small collective paid two latencies where raw MPI pays one: comm_bench at np 2 measured 0.23-0.47x
// raw OpenMPI from 16 B to 1 KiB, 0.49-0.77x at 4 KiB (docs/benchmarks.md). Carrying the data inside
// the MPI handshake (one round) was tried and measured no better (0.21-0.36x from 16 B to 1 KiB): the
// handshake's own MPI_Isend/Irecv/Testall round is the cost. On one node a collective of at most
// kSmallMaxBytes per rank therefore replaces both with one exchange through the node window:
//  - Each rank has two small buffers (ShmNode::small_slot). It writes its signature and its data into
//    the next one, then (release) the buffer's first word: a tag of the group's flag line and the op's
//    index among the group's small collectives, unique among its posts. It polls both buffers of each
//    peer (acquire) until one shows the tag, checks every signature as the handshake does (the same
//    CommError on every rank for a mismatch), and the body sums or copies straight out of the peers'
//    buffers. Then it stores the index into kDoneWord of its flag line. (A separate post word in the
//    flag line, the first version, cost each peer one more cache line per op.)
//  - What rides per rank: allreduce its tensor, reduce-scatter every block of its input but its own
//    (which only it reads, from the input), allgather(v) its own block, broadcast the root's tensor
//    (the others post their header only). Every staged line costs a reader a cross-core transfer, and
//    its writer an invalidation of the reader's copy from two ops before, so only what a peer reads is
//    staged (Note [Small path's waits]). The payload that decides the path is the same on every rank:
//    the tensor, the whole input, or the largest count's block.
//  - Reuse: the buffers serve every group (one collective at a time per process), and with no closing
//    barrier a peer of the previous group may still read one. So before writing a buffer a rank waits
//    until the readers of its last contents (that group's members) stored kDoneWord >= its index;
//    alternating two buffers, that wait is almost always already over, and when the buffer last
//    served this group two or more of its ops ago it is implied without reading those words: each
//    reader posted the op after that one, which this rank has read, only after its reads. So a peer's
//    tag cannot be overwritten before this rank has read the post it marks.
//  - Bits: sums are reduce_sum's (comm/detail/shm_reduce.h) in rank order, as the MPI path's for
//    bf16/fp16 (Note [16-bit reductions]) and int32 (wrapping, any order). fp32 through MPI sums in
//    its algorithm's order, equal to rank order only on two ranks (a + b either way), so an fp32
//    reduction on more than two ranks keeps the old path. Averages divide the fp32 sum once, as all do.
//  - Guarantees: the waits poll like the handshake (Runtime::pause, Note [Polling]) with its deadline,
//    so a stalled peer ends the wait after comm.timeout_s with the handshake's CommError naming the
//    collective and group; after WaitNotices::kAnnounceAfter they consult the wait notices (Note
//    [Waits across groups]), so a peer in another group's collective, or in this op by the other path
//    (a size that differs across the limit), is found as a mismatch on both ranks.
//  - Taken only where every member is on this node's window (one node, a flag line, comm.shared_memory
//    not false); not for local or simulated groups, alltoall(v) or the count exchanges. The byte
//    counters keep each collective's own rule (CommCounters); it counts as a shared-memory collective.
//
// Note [Lean small path]
// With the exchange itself down to a few cache lines, the layer around it cost more than raw MPI's
// whole call: callgrind of 20,000 sync 4-element fp32 allreduces at np 2 counted 2,325-2,427
// instructions per call, of which ~720 in malloc/free (a shared Op, its std::function body and sizes
// formatter capturing tensors and counts, the count vectors), ~520 in four mutex lock/unlock pairs
// (the executor's queue lock twice, the group's broken check, the tally), ~300 destroying the Op. So
// a sync collective now builds its Op on the caller's stack (Group's sync calls; the group pointer
// does not own: the Group outlives the call), a small op has no body (small_body dispatches on the
// op's code and reads the arguments kept in the Op: dtype, numel, reduction, a view of the caller's
// counts), its sizes text is formatted from those fields only when a message needs it, and the
// executor runs a sync op inline when an atomic count of the worker's pending ops is zero (no lock:
// collectives are issued from one thread at a time, so the idle worker stays idle). The group's
// broken check reads an atomic, and the per-collective tallies are atomics. An async small op owns
// its counts, keeps its tensors (Op::keep) and goes through the queue as before. The guarantees are
// the same code as before: the waits' deadline and wait notices, the signature check, the byte
// counters and tallies, the sums (reduce_sum's kernels; a few fp32 values summed inline with
// reduce_sum_scalar's operations: the same bits). Now 864 instructions per call (reduce-scatter
// 5,970 -> 993, allgather 5,769 -> 965, broadcast 2,008 -> 768), no allocation or lock on the path;
// comm_bench np 2 against raw OpenMPI in docs/benchmarks.md ("The lean small path").
//
// Note [Small path's waits]
// Where the microseconds of a small collective go at np 2: cache lines crossing cores, not
// instructions. The round trip of one line between the two vCPUs of the 2-core VM moved between
// 0.1 us and 0.47 us within the hour (the host's placement; comm_bench prints it), and rdtsc marks
// inside the exchange (1,000 1 KiB fp32 allreduces at a 0.47 us round trip) gave: staging and the post
// ~40 ns, the wait for the peer's post 0.7-0.8 us (about 1.5 round trips), the body 0.3-0.6 us (reading
// the peer's 16 lines), against 1.25 us for raw OpenMPI's whole call. The wait was long because every
// line a rank stages was read by its peer two ops before and is still shared in the peer's cache: x86
// commits stores in order, so the tag becomes visible only after an invalidation round trip for
// each staged line, and the peer's polls of the tag's line, written first (the signature) and last
// (the tag), pulled it back in between. So:
//  - the exchange stages only the bytes a peer reads (above), the data past the tag's line first,
//    then that line in one burst (its data, the signature, the tag);
//  - small_reclaim takes the next buffer's data lines back with a store each, once this group's peers
//    have posted this op (so each is done with that buffer's previous contents, their own op before):
//    the invalidations then drain while the caller goes on, and the next op's stores commit at once.
//    The tag's line is left alone, since the peers poll it. It runs last in Runtime::execute: a locked
//    instruction (the tallies' atomic adds) waits for every earlier store, these included, so run
//    before them the reclaim cost each op its round trip. (PREFETCHW instead of the stores: no gain.)
//  - a wait polls its peers' tags a pause apart for its first kQuickPolls polls (~3 us) before it
//    reads the clock at all: the deadline, the wait notices and the back-off (Runtime::pause) start
//    only for a peer that is really late.
// Measured: the wait for the peer's post 1,870 -> 990-1,300 cycles (rdtsc, round trip 0.47 us); comm_bench
// np 2 against main's binary, three interleaved rounds at load 15 (docs/benchmarks.md, "Small path's
// round trips and allreduce's copy-out"): allreduce 1 KiB 0.90x -> 1.37x raw OpenMPI, 4 KiB 1.14x ->
// 1.74x, reduce-scatter 1.24x / 1.12x -> 1.70x / 1.70x. Triple buffers would let the reclaim overlap
// the wait for the peers instead of following the op (not built).
// kSmallMaxBytes: the measured crossover (docs/benchmarks.md, comm_bench --min-bytes 16): from 16 KiB the
// shared-memory collectives already beat MPI, and their staging needs no second buffer set.
#pragma once

#include <cstddef>

#include "comm/config.h"
#include "comm/detail/shm.h"
#include "memory/tensor.h"

namespace zs::comm::detail {

struct GroupState;
struct Op;

inline constexpr size_t kSmallMaxBytes = ShmNode::kSmallSlotBytes - 64;  // 4 KiB after the header

// Whether a collective of dtype `t` carrying at most `payload` bytes per rank (the same on every rank) takes the
// small path on `g` (the same answer on every rank that passed the same arguments). `reduces`: it sums.
bool small_path(const GroupState& g, memory::DType t, size_t payload, bool reduces);
// When small_path(*op.group, dtype, payload, reduces): marks `op` small, carrying `bytes` from `from`
// (read when the op runs) and writing its result to `to` (small_body), keeps both tensors alive for an
// `async` op (Op::keep), and returns true; else false, the op untouched.
bool carry_if_small(Op& op, memory::DType t, size_t payload, bool reduces, const memory::Tensor& from, size_t bytes,
                    const memory::Tensor& to, bool async);
// Runtime::execute, in place of the handshake: publishes this rank's data, waits for every peer's and
// checks the signatures; op.carried then points at each rank's data. Throws CommError (timeout,
// mismatch). small_done after the body: this rank has finished reading its peers' buffers.
void small_exchange(Op& op, bool on_worker);
void small_done(const Op& op);
// Last of all in Runtime::execute after a small op that ran to its end (after the tallies' atomic
// adds, which would otherwise wait for these stores): Note [Small path's waits].
void small_reclaim(const Op& op);

// The body, after small_exchange (op.carried points at every rank's data): sums or copies into
// op.carry_to, by op.code from the op's arguments (Op::dtype, numel, reduce, counts: Note [Lean small
// path]; allgather's counts are empty, every rank's numel).
void small_body(const Op& op);

}  // namespace zs::comm::detail
