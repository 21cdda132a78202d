// The hierarchical transport: a group whose ranks lie on several nodes, several on at least one.
// An allreduce runs through each node's window into its leader's fp32 accumulator, the leaders (each
// node's first member) allreduce that over MPI, and every rank copies the result out of its leader's
// slot (Note [Shared-memory collectives] in comm/detail/shm.h). So it composes the node's shared
// memory (the window, its barriers and sum kernels) with an MPI transport over the leaders'
// communicator. Reduce-scatter, allgather(v), all-to-all(v), broadcast and the count exchanges span
// nodes through MPI's collective on the whole group, as do allreduces that comm.shared_memory "auto"
// leaves to MPI (Note [Transports] in comm/detail/transport.h).
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
  }
  const char* name() const override { return "hierarchical"; }

  void allreduce(const Op& op, const memory::Tensor& data, ReduceOp r) override {
    ShmGroup* s = usable(g_, op, static_cast<size_t>(data.numel()) * memory::dtype_size(data.dtype()));
    if (s == nullptr) return mpi_->allreduce(op, data, r);
    across_nodes(*s, op, data, r == ReduceOp::kAverage ? static_cast<float>(g_.size) : 1.0f);
    barrier(g_, *s, op);
    g_.runtime->count_shared_memory();
  }
  void reduce_scatter(const Op& op, const memory::Tensor& input, const memory::Tensor& output, const Counts& c,
                      ReduceOp r) override {
    mpi_->reduce_scatter(op, input, output, c, r);
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

  GroupState& g_;
  std::unique_ptr<Transport> mpi_;  // the whole group's
  Leaders leaders_comm_;
  std::unique_ptr<Transport> leaders_;  // on the leaders only: MPI over leaders_comm_
};

}  // namespace

std::unique_ptr<Transport> make_hierarchical_transport(GroupState& g, std::unique_ptr<Transport> mpi) {
  return std::make_unique<HierarchicalTransport>(g, std::move(mpi));
}

}  // namespace zs::comm::detail
