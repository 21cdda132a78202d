// The shared-memory transport: a group whose ranks are all on one node moves its data through the
// node's window (Note [Shared-memory collectives] in comm/detail/shm.h), or reads the peers' tensors
// in place (Note [Direct collectives] in comm/detail/shm_direct.h). The shm_* functions decline a
// call (returning false, the same on every rank) under comm.shared_memory "auto" for small tensors;
// that call and the count exchanges go to the MPI transport on the group's communicator
// (Note [Transports] in comm/detail/transport.h). No MPI call is made here.
#include "comm/detail/runtime.h"
#include "comm/detail/shm.h"
#include "comm/detail/transport.h"
#include "memory/dtype.h"

namespace zs::comm::detail {

namespace {

class ShmTransport final : public Transport {
 public:
  ShmTransport(GroupState& g, std::unique_ptr<Transport> mpi) : g_(g), mpi_(std::move(mpi)) {}
  const char* name() const override { return "shm"; }

  void allreduce(const Op& op, const memory::Tensor& data, ReduceOp r) override {
    if (!shm_allreduce(g_, op, data, r)) mpi_->allreduce(op, data, r);
  }
  void reduce_scatter(const Op& op, const memory::Tensor& input, const memory::Tensor& output, const Counts& c,
                      ReduceOp r) override {
    if (!shm_reduce_scatter(g_, op, input, output, c.counts, c.displs, r)) mpi_->reduce_scatter(op, input, output, c, r);
  }
  void allgatherv(const Op& op, const memory::Tensor& input, const memory::Tensor& output, const Counts& c) override {
    if (!shm_allgatherv(g_, op, input, output, c.counts, c.displs)) mpi_->allgatherv(op, input, output, c);
  }
  void broadcast(const Op& op, const memory::Tensor& data, int root) override {
    if (!shm_broadcast(g_, op, data, root)) mpi_->broadcast(op, data, root);
  }
  void alltoallv(const Op& op, memory::DType t, const ExchangeSide& send, const Counts& s, const ExchangeSide& recv,
                 const Counts& r, bool uneven) override {
    const bool stream = r.total * memory::dtype_size(t) >= kShmStreamMinBytes;
    if (!shm_alltoallv(g_, op, send.blocks, recv.blocks, stream)) mpi_->alltoallv(op, t, send, s, recv, r, uneven);
  }
  void allgather_counts(const Op& op, std::span<const int32_t> mine, std::span<int32_t> all) override {
    mpi_->allgather_counts(op, mine, all);
  }
  void alltoall_counts(const Op& op, std::span<const int64_t> send, std::span<int64_t> recv) override {
    mpi_->alltoall_counts(op, send, recv);
  }
  void split(const Op& op, int color, int key, GroupState& child) override { mpi_->split(op, color, key, child); }

 private:
  GroupState& g_;
  std::unique_ptr<Transport> mpi_;
};

}  // namespace

std::unique_ptr<Transport> make_shm_transport(GroupState& g, std::unique_ptr<Transport> mpi) {
  return std::make_unique<ShmTransport>(g, std::move(mpi));
}

}  // namespace zs::comm::detail
