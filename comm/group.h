// Group: a set of ranks (an MPI communicator, or a local group of one) and the collectives on it.
//
//   comm::Group& world = w.group();
//   world.allreduce(grads, comm::ReduceOp::kAverage);                 // in place, on every rank
//   world.reduce_scatter(bucket, my_part, shards);                    // shards = memory::partition(...)
//   comm::Work h = world.allgatherv_async(my_part, params, shards);   // overlaps with the caller
//   h.wait();
//
// Contract, for every collective:
//   - Every rank of the group calls the same collectives in the same order with matching sizes, dtype
//     and root. A mismatch throws CommError on every rank (Note [Handshake] in comm/detail/runtime.h);
//     ranks in collectives of two groups, each waiting for the other, throw it too (Note [Waits across
//     groups] in comm/detail/wait_notices.h: call every group's collectives in one order on every rank);
//     a rank not arriving within config.timeout_s throws CommError naming the collective, the group,
//     the sizes and the rank, and leaves the group unusable (end the job with World::abort).
//   - Tensors are contiguous; element counts are in elements of the tensor's dtype. Supported dtypes:
//     fp32, bf16, fp16 everywhere; int32 for sums and the data-movement collectives. bf16/fp16
//     reductions carry the 16-bit values on the wire (half fp32's bytes) and sum them in fp32, rounding
//     once (so the sum of N bf16 values is rounded once, not N-1 times), in rank order: the same bits
//     through shared memory and through MPI (Note [16-bit reductions] in comm/detail/transport_mpi.cpp).
//   - The sync call returns when this rank's part is done. An async call returns a Work at once; the
//     tensors (and the memory behind plain views) must stay alive and untouched until wait() returns.
//     Collectives of one World run one at a time in submission order (sync calls wait for earlier
//     async ones), on the World's comm worker thread or on the caller's when nothing is queued.
//   - Counts larger than INT_MAX elements throw CommError (split the buffer into buckets).
// Thread-safety: issue a World's collectives from one thread at a time (the order must be the same on
// every rank anyway). A Group keeps its World's MPI state alive, so it may outlive the World object.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/config.h"
#include "comm/work.h"
#include "memory/shard.h"
#include "memory/tensor.h"

namespace zs::comm {

namespace detail {
struct GroupState;
struct GroupAccess;
}

class Group {
 public:
  using Tensor = memory::Tensor;
  using ShardRange = memory::ShardRange;

  explicit Group(std::shared_ptr<detail::GroupState> state);
  // A group that plays rank `rank` of `size` ranks without MPI and without moving data: every
  // collective returns at once (an async one completes when waited for, as if MPI had not progressed
  // it before), and its bytes are counted as the real one's would be. For running code that issues
  // collectives only to see what it allocates (the memory estimator); nothing it "receives" is valid.
  // `hosts`: the host of each member in group rank order (empty: all on one host), so its bytes across
  // hosts are counted as a real group's on that layout (Note [Bytes across hosts]; the projection).
  static Group simulated(int rank, int size, const std::string& name = "simulated", std::vector<int> hosts = {});
  // A simulated group's split as the estimator makes it: the members `members` (this group's ranks in
  // the new group's order, this rank among them) as a simulated group of their own, keeping their hosts,
  // so a group the engine or a model splits off a simulated one counts its bytes across hosts as the real
  // split does (the projection). Not collective.
  Group simulated_subgroup(std::span<const int> members, const std::string& name) const;
  Group(Group&&) noexcept = default;
  Group& operator=(Group&&) noexcept = default;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  ~Group();

  int rank() const;                // this process's rank in the group, 0..size()-1
  int size() const;                // ranks in the group
  const std::string& name() const;  // "world", "dp", "ep", "edp" or the name given to split/dup
  const CommConfig& config() const;
  bool is_mpi() const;             // false for a local group of one (a world started without mpirun)
  // The MPI communicator: comm/native.h, native_handle(group) (kept out of this header, so code that
  // only trains never includes <mpi.h>).
  // This rank's byte counters of the whole World (every group), as World::counters() gives them.
  CommCounters counters() const;
  // This rank's bytes sent through this group's collectives alone, since the group was made (the
  // counters' rule; a simulated group counts what the real one would send): the tensor-parallel
  // group's share of the step's traffic, for instance.
  uint64_t bytes_sent() const;
  // Of bytes_sent(), those to ranks on other hosts and those inside this rank's host (Note [Bytes
  // across hosts] in comm/config.h): ZeRO++'s hierarchical partitions and quantised collectives are
  // judged by the first.
  uint64_t bytes_inter_host() const;
  uint64_t bytes_intra_host() const;
  // The hosts the group's members lie on (1 for a local or simulated group), and how many members
  // share this rank's host, itself included: the real layout (MPI_COMM_TYPE_SHARED), or blocks of
  // comm.shared_memory_node_ranks when set.
  int hosts() const;
  int host_ranks() const;
  // The host of each member in group rank order; empty when all lie on one host (a local group, a
  // simulated one given no hosts).
  const std::vector<int>& member_hosts() const;
  // This rank's per-collective tallies of the whole World (comms_logger; OpStats in comm/config.h).
  std::vector<OpStats> op_stats() const;
  // From now on this rank also records every collective of the whole World with its start and where it
  // ran (TraceEvent in comm/config.h; comms_logger.trace_file); trace() returns the records so far.
  void start_trace() const;
  std::vector<TraceEvent> trace() const;

  // Collective (a blocking MPI_Comm_split, not timed): ranks with the same color form a group, ordered
  // by key then parent rank. `color` >= 0 on every rank. The new group inherits config().
  Group split(int color, int key, const std::string& name) const;
  // Collective: the same ranks on a separate communicator, with its own config (e.g. timeout).
  Group dup(const std::string& name, const CommConfig& config) const;

  // Sum (or average) of `data` over the ranks, in place. Every rank passes the same numel and dtype.
  void allreduce(const Tensor& data, ReduceOp op = ReduceOp::kSum) const;
  Work allreduce_async(const Tensor& data, ReduceOp op = ReduceOp::kSum) const;

  // Reduces `input` (sum of counts elements, same on every rank) over the ranks and leaves elements
  // [displ(r), displ(r) + counts[r]) of the result in rank r's `output` (counts[r] elements). Counts
  // may be uneven and zero. `shards` form: shards[r] = {displ(r), counts[r]}, which must tile the
  // input in rank order (memory::partition does). `output` may be input's own block (in place); input
  // is then scratch afterwards.
  void reduce_scatter(const Tensor& input, const Tensor& output, std::span<const size_t> counts,
                      ReduceOp op = ReduceOp::kSum) const;
  void reduce_scatter(const Tensor& input, const Tensor& output, std::span<const ShardRange> shards,
                      ReduceOp op = ReduceOp::kSum) const;
  Work reduce_scatter_async(const Tensor& input, const Tensor& output, std::span<const size_t> counts,
                            ReduceOp op = ReduceOp::kSum) const;
  Work reduce_scatter_async(const Tensor& input, const Tensor& output, std::span<const ShardRange> shards,
                            ReduceOp op = ReduceOp::kSum) const;

  // Concatenates every rank's `input` (n elements each) into `output` (size()*n elements) in rank
  // order. `input` may be output's own block (in place).
  void allgather(const Tensor& input, const Tensor& output) const;
  Work allgather_async(const Tensor& input, const Tensor& output) const;
  // Uneven form: rank r contributes counts[r] elements (may be 0); output has sum(counts).
  void allgatherv(const Tensor& input, const Tensor& output, std::span<const size_t> counts) const;
  void allgatherv(const Tensor& input, const Tensor& output, std::span<const ShardRange> shards) const;
  Work allgatherv_async(const Tensor& input, const Tensor& output, std::span<const size_t> counts) const;
  Work allgatherv_async(const Tensor& input, const Tensor& output, std::span<const ShardRange> shards) const;

  // Copies root's `data` into every rank's `data` (same numel and dtype everywhere).
  void broadcast(const Tensor& data, int root) const;
  Work broadcast_async(const Tensor& data, int root) const;

  // Block j (numel/size() elements) of rank i's input lands as block i of rank j's output.
  // input and output have the same numel, divisible by size(); they must not overlap.
  void alltoall(const Tensor& input, const Tensor& output) const;
  Work alltoall_async(const Tensor& input, const Tensor& output) const;
  // Uneven form: rank i sends send_counts[j] elements (consecutive, in j order) to rank j, which
  // receives them as its recv_counts[i] elements (in i order). send_counts[j] on rank i must equal
  // recv_counts[i] on rank j: checked on every rank before any data moves (Note [alltoallv counts] in
  // comm/group.cpp), a violation throws CommError on every rank naming the pair.
  // check = kSkip leaves the check out (one small allgather less) where the counts agree by
  // construction: recv_counts came from an alltoall of the send counts (moe/dispatch.h does this).
  // kExchanged: the same, and the call comes right after exchange_counts on this group, from whose
  // counts recv_counts came: it then runs without a handshake of its own (Note [Counts in the
  // handshake] in comm/detail/runtime.h); if any collective ran in between it handshakes as usual.
  enum class CountCheck { kVerify, kSkip, kExchanged };
  void alltoallv(const Tensor& input, std::span<const size_t> send_counts, const Tensor& output,
                 std::span<const size_t> recv_counts, CountCheck check = CountCheck::kVerify) const;
  Work alltoallv_async(const Tensor& input, std::span<const size_t> send_counts, const Tensor& output,
                       std::span<const size_t> recv_counts, CountCheck check = CountCheck::kVerify) const;

  // The same exchange with blocks in pieces: send[j] lists the contiguous tensors that, concatenated
  // in order, form the block for rank j; recv[i] those the block from rank i fills. One dtype; counts
  // are the pieces' element sums. The shared-memory path reads and writes the pieces in place (no
  // packing copy: MoE's rows grouped per expert, moe/dispatch.h); MPI's packs through a buffer.
  void alltoallv(std::span<const std::vector<Tensor>> send, std::span<const std::vector<Tensor>> recv,
                 CountCheck check = CountCheck::kVerify) const;

  // An all-to-all of counts carried by the handshake itself (one message round, not a handshake and
  // then an MPI_Alltoall): send holds size() blocks of w values (block j for rank j), recv receives
  // block i from rank i; w the same on every rank. Synchronous; the counts for an alltoallv that
  // follows with CountCheck::kExchanged.
  void exchange_counts(std::span<const int64_t> send, std::span<int64_t> recv) const;

  // Returns once every rank of the group has called barrier (timed like every collective).
  void barrier() const;
  Work barrier_async() const;

  // ---- Point-to-point (Note [Point-to-point] in comm/p2p.cpp) ----
  // send: `data` to rank `dst` of this group, whose matching recv passes the same dtype and numel
  // (any dtype; the bytes move as they are). recv: into `data` from rank `src`. The k-th send from A
  // to B matches the k-th recv of B from A. Each op waits for its peer (a synchronous send) and runs
  // in the World's order like a collective, so two ranks that both send to each other first would
  // deadlock: post matching pairs (one side receives first), or pass both directions to sendrecv,
  // which posts them together (what a 1F1B pipeline's steady state needs). A crossed pair (both
  // send, or both receive, each waiting for the other), or a transfer on one rank while the peer
  // waits in a collective the first has not reached, throws CommError on both ranks at once.
  // Errors, on both ranks: a dtype or numel mismatch with the peer at once; a peer that does not
  // arrive or stops within config.timeout_s, naming the op, the group, the peer and the sizes (the
  // group is then unusable). The peer must be another rank of the group: a group of one has none,
  // and a rank naming itself throws CommError (copy the tensor instead). Counted in bytes_sent /
  // bytes_received and tallied as send, recv and sendrecv in op_stats (and in the collectives count).
  // At most INT_MAX bytes per tensor. The async forms return at once; tensors stay alive and
  // untouched until wait() returns, as for collectives.
  void send(const Tensor& data, int dst) const;
  void recv(const Tensor& data, int src) const;
  Work send_async(const Tensor& data, int dst) const;
  Work recv_async(const Tensor& data, int src) const;
  // `send` to dst and `recv` from src at once (dst and src may be the same rank, or differ: a ring).
  void sendrecv(const Tensor& send, int dst, const Tensor& recv, int src) const;
  Work sendrecv_async(const Tensor& send, int dst, const Tensor& recv, int src) const;

 private:
  friend struct detail::GroupAccess;
  // split with the child's config (dup's own): its transport is chosen from it (Note [Transports]).
  Group split_as(int color, int key, const std::string& name, const CommConfig& config) const;
  std::shared_ptr<detail::GroupState> state_;
};

}  // namespace zs::comm
