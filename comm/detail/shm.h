// Intra-node collectives over an MPI-3 shared-memory window (Note [Shared-memory collectives]).
// Internal to comm: the shm transport (comm/detail/transport_shm.cpp) calls the shm_* functions below
// inside an Op's body (after the handshake) and hands the call to its MPI transport when they return
// false; the hierarchical transport (comm/detail/transport_hierarchical.cpp) builds its allreduce across
// nodes from the window, barrier() and the sum kernels. The collectives here (shm.cpp, shm_direct.cpp)
// make no MPI call; only making the window and a group's view of it do (ShmNode::create and
// init_shm_group, in comm/detail/node_window.cpp: the window is an MPI-3 one).
//
// Note [Shared-memory collectives]
// OpenMPI moves a large reduce-scatter between two ranks of one node at ~1.2 GB/s (its shared-memory
// transport copies through small FIFO fragments and reduces with a scalar loop), while memcpy moves
// ~35 GB/s. So on one node the ranks instead:
//  - share one window per World (ShmNode, MPI_Win_allocate_shared over MPI_COMM_TYPE_SHARED, made
//    when the World starts and freed just before MPI_Finalize): per node rank, a column of barrier
//    flags (one 64-byte line per group) and two staging slots of kSlotBytes ("double-buffered").
//    One window serves every group because a World runs one collective at a time (Note [Execution
//    model]); each collective ends with a barrier, so no member still reads a slot when its owner
//    moves on to another group's collective.
//  - stream the tensor through the slots in rounds of kRoundBytes: each rank copies its next piece
//    into its slot, a barrier, then each rank reads what it needs from every slot. Round k+1 uses the
//    other slot, so one barrier per round suffices (a rank writes round k+2 into a slot only after the
//    barrier of round k+1, which every rank reaches after finishing its reads of round k). Rounds are
//    small so that a piece is still in its writer's cache when the readers copy it, and the final
//    writes of a large output use streaming stores (copy_streaming in shm_reduce.h, which skip the
//    read a normal store makes of each line): a large allgather then costs about two memcpy's of its
//    bytes (comm_bench's copy column) instead of three.
//  - reduce in parallel: in a reduce-scatter rank r sums only its own shard; in an allreduce each
//    rank sums 1/L of every round's piece, then everyone copies the L sums out (a second barrier). On
//    two ranks an allreduce instead has each rank stage its whole round and sum both pieces into its
//    own tensor (the same sums: one barrier per round instead of two, no copy-out).
//    Sums run in rank order, in fp32 (bf16/fp16 widened and rounded once, as comm/group.h promises),
//    with the SIMD kernels of comm/detail/shm_reduce.h: deterministic run to run, and bitwise equal to
//    MPI's result on two ranks (a + b either way); on more ranks MPI's order is its algorithm's.
//  - a rank's own piece is never staged when only it reads it.
//  - broadcast: only in place, where the handshake agreed on a shared arena (direct_broadcast: the
//    others copy the root's tensor); MPI_Bcast behind the handshake measured 0.85-0.94x raw OpenMPI
//    from 16 KiB to 1 MiB, and staging through the root's slots was slower still at times (shm.cpp).
// Why no single copy: reading the peers' tensors with process_vm_readv (CMA, as OpenMPI's vader
// transport does) was tried and removed. Quiet (docs/benchmarks.md), it moved 2.5-3 GB/s against
// 13-15 GB/s for memcpy through the window, and staging (two copies, the second from cache) beat it
// 1.5-2x at every size from 64 KiB.
// Note [Shared-memory all-to-all]
// An alltoallv stages the same way: in round k each rank copies piece k of each peer's block into
// that peer's region of its slot (kRoundBytes / (L-1) per peer), a barrier, then each rank copies
// its pieces out of every peer's region; its own block goes from input to output directly, never
// staged. Only a rank's own row and column of the count matrix are known to it, so the round count
// is agreed inside the first barrier: each rank writes the rounds it needs into a second word of its
// flag line before that barrier's release store and reads the others' after it (no extra round
// trip). Ranks that route nothing still take part in every round, so skewed or zero routing cannot
// hang; the counts themselves were exchanged before (moe/dispatch.h) or checked by the caller.
// Groups spanning nodes (allreduce; the hierarchical transport): ranks reduce through their node's
// slots into the node leader's fp32 accumulator, the leaders (one per node) allreduce it over MPI, and
// every rank copies the result out of the leader's slot. Reduce-scatter and allgather(v) spanning
// nodes use MPI's collective.
// Barriers are flags: a rank stores its barrier count (release) and waits until every member's count
// reaches it (acquire), spinning, yielding when the node is oversubscribed, then sleeping, and throws
// CommError naming the collective after comm.timeout_s like the handshake (the group is then unusable).
#pragma once

#include <mpi.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/config.h"
#include "comm/detail/transport.h"  // Block
#include "memory/tensor.h"

namespace zs::comm {
class Group;
}

namespace zs::comm::detail {

struct GroupState;
struct Op;
class ArenaTable;

// The World's node window (Note [Shared-memory collectives]).
class ShmNode {
 public:
  static constexpr size_t kSlotBytes = size_t{4} << 20;  // per rank and buffer; two buffers per rank
  // Bytes a rank stages per round (at most kSlotBytes): small enough that a round's pieces are still
  // in the writer's cache when the readers copy them (comm_bench, docs/benchmarks.md: 512 KiB rounds
  // beat 4 MiB ones by up to 1.5x from 16 MiB on a 1 MiB-L2 Zen 4).
  static constexpr size_t kRoundBytes = size_t{512} << 10;
  static constexpr int kMaxGroups = 1024;                 // flag lines per rank (groups ever using shm)
  // Note [Small collectives] (comm/detail/small.h): per rank two buffers of a 64-byte header and
  // up to 4 KiB of data, apart from the staging slots.
  static constexpr size_t kSmallSlotBytes = 64 + (size_t{4} << 10);

  // Collective over the world's ranks (blocking, like MPI_Init). `ranks_per_node` > 0 splits MPI's
  // node into consecutive blocks of that many ranks (CommConfig::shared_memory_node_ranks). Returns
  // null when the window cannot be made and `required` is false; throws CommError when it is true.
  static std::unique_ptr<ShmNode> create(int ranks_per_node, bool required);
  ShmNode(const ShmNode&) = delete;
  ShmNode& operator=(const ShmNode&) = delete;
  ~ShmNode();  // MPI_Win_free: collective over the node; the Runtime frees it right before MPI_Finalize

  int node_rank() const { return node_rank_; }
  int node_size() const { return node_size_; }
  int node_id() const { return node_id_; }  // world rank of the node's first rank: equal across the node
  unsigned char* slot(int node_rank, int buffer) const { return slots_[static_cast<size_t>(node_rank)][buffer]; }
  unsigned char* small_slot(int node_rank, int buffer) const {
    return slots_[static_cast<size_t>(node_rank)][1] + kSlotBytes + static_cast<size_t>(buffer) * kSmallSlotBytes;
  }
  // This rank's record of its small buffers (Note [Small collectives]): which one the next small
  // collective writes, and for each the group (flag line, its members' node ranks) and the small
  // collective's index there that wrote it last, whose readers must be done before it is written again.
  struct SmallUse {
    int flag_index = -1;
    uint64_t epoch = 0;
    std::vector<int> readers;
  };
  std::array<SmallUse, 2> small_uses;
  int small_next = 0;
  std::atomic<uint64_t>& flag(int node_rank, int group_index) const { return word(node_rank, group_index, 0); }
  // Word w (0..7) of a rank's flag line for a group: word 0 is the barrier flag; the others carry
  // small values a collective publishes with its next barrier (an alltoallv's rounds).
  std::atomic<uint64_t>& word(int node_rank, int group_index, int w) const;
  // Flag lines are handed out once, in the order groups first use shared memory (the same on every
  // rank of a group: ShmGroup takes the max over its members).
  int next_group_index = 0;
  // The shared arenas registered on this node (Note [Direct collectives] in comm/detail/shm_direct.h).
  ArenaTable& arenas() const { return *arenas_; }

 private:
  ShmNode();
  MPI_Comm comm_ = MPI_COMM_NULL;  // owned: this node's ranks
  MPI_Win win_ = MPI_WIN_NULL;
  int node_rank_ = 0, node_size_ = 1, node_id_ = 0;
  std::vector<unsigned char*> flags_;
  std::vector<std::array<unsigned char*, 2>> slots_;
  std::unique_ptr<ArenaTable> arenas_;
};

// A group's view of the node window, made with the group (init_shm_group). Whether a collective uses
// it is decided per call from the group's config (comm.shared_memory), the same on every rank.
struct ShmGroup {
  bool enabled = false;            // the group got a flag line
  std::string disabled_reason;     // why not, for comm.shared_memory = true
  std::vector<int> local;          // node ranks of this group's members on this node, in group order
  int me = 0;                      // this rank's index in `local`
  int nodes = 1;                   // nodes the group spans
  int max_local = 1;               // most members on one node
  int flag_index = -1;
  uint64_t epoch = 0;              // barriers passed
  uint64_t small_epoch = 0;        // small collectives run (Note [Small collectives] in comm/detail/small.h)
  bool small_posts_read = false;   // the running one found every peer's post (Note [Small path's waits])
  std::vector<const unsigned char*> carried;  // the running small collective's data, per member
};

// Collective over g.comm (blocking and untimed, like the MPI_Comm_split that made it; GroupState::
// init_handshake_comm calls it): sets g.shm when the World has a node window. Made with the group,
// not by its first collective, so that a collective's body never waits in an untimed MPI call: a rank
// arriving after its peer timed out then fails at a (timed) shared-memory barrier instead of hanging.
void init_shm_group(GroupState& g);
// The World's node window behind `group` (null without one), for tests that pick a path.
ShmNode* shm_node_of(const Group& group);
// comm.shared_memory "auto" leaves tensors smaller than this (bytes) to MPI: below it the flags
// barrier's microsecond outweighs the copies saved (comm_bench, docs/benchmarks.md: 0.55-0.75x raw
// OpenMPI at 1-4 KiB, 1.7-2.9x from 16 KiB). true uses shared memory at every size.
inline constexpr size_t kShmAutoMinBytes = size_t{8} << 10;
// Outputs from this size are written with streaming stores (copy_streaming): larger than the L2
// caches, so the caller reads them from memory anyway, and the stores skip reading each line first.
inline constexpr size_t kShmStreamMinBytes = size_t{4} << 20;

// The group's view when a collective of `bytes` should use shared memory (the rule below), else null;
// CommError when comm.shared_memory is true and the group has none. The same on every rank.
ShmGroup* usable(GroupState& g, const Op& op, size_t bytes);
// A barrier over the group's ranks on this node (Note [Shared-memory collectives]); CommError after
// comm.timeout_s, leaving the group broken.
void barrier(GroupState& g, ShmGroup& s, const Op& op);
// Sub-slice j of n elements split among L ranks: [lo, hi), starting on cache lines (allreduce).
std::pair<size_t, size_t> sub_slice(size_t n, size_t L, size_t j);

// Each returns false, having done nothing, when this collective should use MPI (shared memory off,
// unavailable, a small tensor under "auto", a single rank per node, or a group spanning nodes: the
// hierarchical transport's); the decision is the same on every rank. Throw CommError on a barrier timeout.
bool shm_allreduce(GroupState& g, const Op& op, const memory::Tensor& data, ReduceOp r);
bool shm_reduce_scatter(GroupState& g, const Op& op, const memory::Tensor& input, const memory::Tensor& output,
                        std::span<const int> counts, std::span<const int> displs, ReduceOp r);
bool shm_allgatherv(GroupState& g, const Op& op, const memory::Tensor& input, const memory::Tensor& output,
                    std::span<const int> counts, std::span<const int> displs);
// Root's tensor copied in place by every other rank (direct_broadcast) when the handshake agreed on a
// shared arena; under "auto" from kShmAutoMinBytes, as the others.
bool shm_broadcast(GroupState& g, const Op& op, const memory::Tensor& data, int root);
// All-to-all(v) on one node (Note [Shared-memory all-to-all]): send[j] is this rank's block for rank
// j, recv[i] the block from rank i (the pieces' bytes sum to the pairwise counts, which must agree:
// the caller has checked, or they agree by construction). Unlike the others it takes every size under
// "auto": the ranks' byte counts differ, and a size rule would split them between the two paths.
// `stream`: write received bytes with streaming stores (a large output nobody reads soon).
bool shm_alltoallv(GroupState& g, const Op& op, std::span<const Block> send, std::span<const Block> recv, bool stream);

}  // namespace zs::comm::detail
