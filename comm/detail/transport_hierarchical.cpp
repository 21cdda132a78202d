// The hierarchical transport: a group whose ranks lie on several nodes (hosts), several on at least
// one. An fp32 allreduce runs through each node's window into its leader's fp32 accumulator, node
// after node (Note [Sum order across hosts]), and every rank copies the result out of the last
// leader's broadcast (Note [Shared-memory collectives] in comm/detail/shm.h). So it composes the
// node's shared memory (the window, its barriers and sum kernels) with MPI between the node leaders.
// Reduce-scatter and 16-bit allreduce span nodes through MPI with sums in rank order (an ordered MPI
// transport); allgather(v), all-to-all(v), broadcast and the count exchanges through MPI's collective
// on the whole group, as do reductions that comm.shared_memory "auto" leaves to MPI (Note
// [Transports] in comm/detail/transport.h).
//
// Note [Sum order across hosts]
// One host's shared-memory transport sums in rank order in fp32 (((a0 + a1) + a2) + a3), where MPI's
// collectives sum in their algorithm's order. A job on two hosts of two ranks once summed (a0 + a1) +
// (a2 + a3) (each node's partial, then the leaders' MPI allreduce) and reduce-scattered in MPI's order:
// the same losses to the printed digits, but parameters a few ulps apart, so its param_digest differed
// from one host's at the same world size. Now the hierarchical transport sums in the order the flat
// one does wherever the flat one uses shared memory (usable(), the same rule): the same bits on any
// host layout whose hosts hold consecutive ranks (OpenMPI's default mapping by slot):
//  - fp32 allreduce: a chain. Node 0 sums its ranks' pieces in rank order into its leader's fp32
//    accumulator; the leader sends it to node 1's leader, whose ranks add theirs to it in rank order
//    (the accumulator is the first source of the same kernel), and so on; the last leader broadcasts
//    the total to the leaders, and every rank divides it once (kAverage) as the flat kernel does. The
//    chain costs H - 1 sequential hops per round of kSlotBytes / 8 elements instead of an allreduce's
//    log H, which is nothing at the two to few hosts this runs on.
//  - reduce-scatter and 16-bit allreduce: the ordered MPI transport's direct path (each rank receives
//    every rank's block and sums them in rank order, Note [16-bit reductions]).
//  - int32 sums wrap and are exact, so any order gives the same bits: each node's partial, then the
//    leaders' MPI allreduce.
// Where the flat transport leaves a reduction to MPI (comm.shared_memory "auto" under
// kShmAutoMinBytes), so does this one: MPI's algorithm depends on the sizes, not on the hosts. Hosts
// whose ranks are not consecutive in the group (a round-robin mapping) take the ordered MPI path for
// fp32 allreduce too: still rank order, without the node windows.
#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/detail/runtime.h"
#include "comm/detail/shm.h"
#include "comm/detail/shm_reduce.h"
#include "comm/detail/transport.h"
#include "comm/mpi_check.h"
#include "memory/dtype.h"

namespace zs::comm::detail {

using memory::DType;

namespace {

// Owns the leaders' communicator (MPI_COMM_NULL on the other ranks).
struct Leaders {
  MPI_Comm comm = MPI_COMM_NULL;
  Leaders() = default;
  Leaders(const Leaders&) = delete;
  Leaders& operator=(const Leaders&) = delete;
  ~Leaders() {
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
};

class HierarchicalTransport final : public Transport {
 public:
  // Collective over g.comm.
  HierarchicalTransport(GroupState& g, std::unique_ptr<Transport> mpi) : g_(g), mpi_(std::move(mpi)) {
    const ShmGroup& s = *g.shm;
    ZS_MPI_CHECK(MPI_Comm_split(g.comm, s.me == 0 ? 0 : MPI_UNDEFINED, g.rank, &leaders_comm_.comm),
                 "connecting the node leaders of {}", g.where());
    if (leaders_comm_.comm != MPI_COMM_NULL) {
      int rank = 0, size = 1;
      MPI_Comm_rank(leaders_comm_.comm, &rank);
      MPI_Comm_size(leaders_comm_.comm, &size);
      leaders_ = make_mpi_transport(leaders_comm_.comm, rank, size, ": allreduce between the node leaders");
    }
    ordered_ = make_mpi_transport(g.comm, g.rank, g.size, {}, true);
    // Note [Sum order across hosts]: the chain needs each node's members consecutive in the group.
    consecutive_ = true;
    nodes_ = 1;
    for (size_t r = 1; r < g.hosts.size(); ++r) {
      if (g.hosts[r] == g.hosts[r - 1]) continue;
      for (size_t q = 0; q + 1 < r; ++q) consecutive_ = consecutive_ && g.hosts[q] != g.hosts[r];
      if (static_cast<int>(r) <= g.rank) ++node_index_;
      ++nodes_;
    }
  }
  const char* name() const override { return "hierarchical"; }

  void allreduce(const Op& op, const memory::Tensor& data, ReduceOp r) override {
    ShmGroup* s = usable(g_, op, static_cast<size_t>(data.numel()) * memory::dtype_size(data.dtype()));
    if (s == nullptr) return mpi_->allreduce(op, data, r);
    const float divisor = r == ReduceOp::kAverage ? static_cast<float>(g_.size) : 1.0f;
    if (data.dtype() == DType::kI32) {
      across_nodes(*s, op, data, divisor);
    } else if (data.dtype() == DType::kF32 && consecutive_) {
      chain(*s, op, data, divisor);
    } else {
      return ordered_->allreduce(op, data, r);  // Note [Sum order across hosts]
    }
    barrier(g_, *s, op);
    g_.runtime->count_shared_memory();
  }
  void reduce_scatter(const Op& op, const memory::Tensor& input, const memory::Tensor& output, const Counts& c,
                      ReduceOp r) override {
    // Rank order where the flat transport's shared memory would sum (Note [Sum order across hosts]).
    const bool flat_sums = usable(g_, op, static_cast<size_t>(input.numel()) * memory::dtype_size(input.dtype()));
    (flat_sums ? ordered_ : mpi_)->reduce_scatter(op, input, output, c, r);
  }
  void allgatherv(const Op& op, const memory::Tensor& input, const memory::Tensor& output, const Counts& c) override {
    mpi_->allgatherv(op, input, output, c);
  }
  void broadcast(const Op& op, const memory::Tensor& data, int root) override { mpi_->broadcast(op, data, root); }
  void alltoallv(const Op& op, DType t, const ExchangeSide& send, const Counts& s, const ExchangeSide& recv,
                 const Counts& r, bool uneven) override {
    mpi_->alltoallv(op, t, send, s, recv, r, uneven);
  }
  void allgather_counts(const Op& op, std::span<const int32_t> mine, std::span<int32_t> all) override {
    mpi_->allgather_counts(op, mine, all);
  }
  void alltoall_counts(const Op& op, std::span<const int64_t> send, std::span<int64_t> recv) override {
    mpi_->alltoall_counts(op, send, recv);
  }
  void split(const Op& op, int color, int key, GroupState& child) override { mpi_->split(op, color, key, child); }

 private:
  // Node slots -> leader's fp32 (int32) accumulator, in rank order per node -> the leaders' MPI sum
  // -> every rank, rounded once to the tensor's dtype.
  void across_nodes(ShmGroup& s, const Op& op, const memory::Tensor& tensor, float divisor) {
    const ShmNode& node = *g_.runtime->shm_node();
    const DType t = tensor.dtype();
    const size_t n = static_cast<size_t>(tensor.numel());
    auto* data = static_cast<unsigned char*>(tensor.raw());
    const size_t es = memory::dtype_size(t);
    const size_t L = s.local.size();
    const size_t me = static_cast<size_t>(s.me);
    const DType acc_t = t == DType::kI32 ? DType::kI32 : DType::kF32;
    const size_t M = ShmNode::kSlotBytes / 8;  // elements per round: data in a slot's first half, fp32 sums in its second
    std::vector<const void*> srcs(L);
    for (size_t k = 0; k * M < n; ++k) {
      const int b = static_cast<int>(k & 1);
      const size_t nk = std::min(M, n - k * M);
      unsigned char* base = data + k * M * es;
      unsigned char* mine = node.slot(s.local[me], b);
      auto* acc = node.slot(s.local[0], b) + ShmNode::kSlotBytes / 2;
      const auto [lo, hi] = sub_slice(nk, L, me);
      std::memcpy(mine, base, lo * es);
      std::memcpy(mine + hi * es, base + hi * es, (nk - hi) * es);
      barrier(g_, s, op);
      for (size_t p = 0; p < L; ++p) srcs[p] = p == me ? base + lo * es : node.slot(s.local[p], b) + lo * es;
      if (hi > lo) reduce_sum(srcs, t, acc + lo * 4, acc_t, hi - lo, 1.0f);
      barrier(g_, s, op);
      if (leaders_ != nullptr) leaders_->allreduce(op, memory::Tensor(acc, acc_t, {static_cast<int64_t>(nk)}), ReduceOp::kSum);
      barrier(g_, s, op);
      const void* one[1] = {acc};
      reduce_sum(one, acc_t, base, t, nk, divisor);
    }
  }

  // fp32 only (Note [Sum order across hosts]): per round, node h's ranks add their pieces in rank
  // order to the accumulator node h - 1's leader sent, then the last leader broadcasts the total.
  void chain(ShmGroup& s, const Op& op, const memory::Tensor& tensor, float divisor) {
    const ShmNode& node = *g_.runtime->shm_node();
    const size_t n = static_cast<size_t>(tensor.numel());
    auto* data = static_cast<unsigned char*>(tensor.raw());
    constexpr size_t es = sizeof(float);
    const size_t L = s.local.size();
    const size_t me = static_cast<size_t>(s.me);
    const size_t M = ShmNode::kSlotBytes / 8;  // elements per round: data in a slot's first half, sums in its second
    const size_t first = node_index_ > 0 ? 1 : 0;  // the accumulator leads the sources after node 0
    std::vector<const void*> srcs(L + first);
    for (size_t k = 0; k * M < n; ++k) {
      const int b = static_cast<int>(k & 1);
      const size_t nk = std::min(M, n - k * M);
      const int count = static_cast<int>(nk);
      unsigned char* base = data + k * M * es;
      unsigned char* mine = node.slot(s.local[me], b);
      auto* acc = node.slot(s.local[0], b) + ShmNode::kSlotBytes / 2;
      const auto [lo, hi] = sub_slice(nk, L, me);
      std::memcpy(mine, base, lo * es);
      std::memcpy(mine + hi * es, base + hi * es, (nk - hi) * es);
      if (leaders_ != nullptr && node_index_ > 0) {
        ZS_MPI_CHECK(MPI_Recv(acc, count, MPI_FLOAT, node_index_ - 1, 0, leaders_comm_.comm, MPI_STATUS_IGNORE),
                     "{}: receiving the partial sums of the previous node", op.describe());
      }
      barrier(g_, s, op);
      if (first) srcs[0] = acc + lo * es;
      for (size_t p = 0; p < L; ++p) srcs[first + p] = p == me ? base + lo * es : node.slot(s.local[p], b) + lo * es;
      if (hi > lo) reduce_sum(srcs, DType::kF32, acc + lo * es, DType::kF32, hi - lo, 1.0f);
      barrier(g_, s, op);
      if (leaders_ != nullptr) {
        if (node_index_ + 1 < nodes_) {
          ZS_MPI_CHECK(MPI_Send(acc, count, MPI_FLOAT, node_index_ + 1, 0, leaders_comm_.comm),
                       "{}: sending the partial sums to the next node", op.describe());
        }
        ZS_MPI_CHECK(MPI_Bcast(acc, count, MPI_FLOAT, nodes_ - 1, leaders_comm_.comm),
                     "{}: broadcasting the sums from the last node", op.describe());
      }
      barrier(g_, s, op);
      const void* one[1] = {acc};
      reduce_sum(one, DType::kF32, base, DType::kF32, nk, divisor);
    }
  }

  GroupState& g_;
  std::unique_ptr<Transport> mpi_;  // the whole group's
  std::unique_ptr<Transport> ordered_;  // the whole group's, fp32 sums in rank order
  bool consecutive_ = true;  // each node's members are consecutive group ranks
  int nodes_ = 1, node_index_ = 0;  // nodes of the group, and this rank's in rank order
  Leaders leaders_comm_;
  std::unique_ptr<Transport> leaders_;  // on the leaders only: MPI over leaders_comm_
};

}  // namespace

std::unique_ptr<Transport> make_hierarchical_transport(GroupState& g, std::unique_ptr<Transport> mpi) {
  return std::make_unique<HierarchicalTransport>(g, std::move(mpi));
}

}  // namespace zs::comm::detail
