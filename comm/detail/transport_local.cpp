// The local transport: a group of one rank without MPI (a world started without mpirun). A sum over
// one rank is the value itself, so only the out-of-place forms copy (Note [Transports]).
#include <algorithm>
#include <cstring>

#include "comm/detail/runtime.h"
#include "comm/detail/transport.h"
#include "memory/dtype.h"

namespace zs::comm::detail {

namespace {

void move_bytes(void* dst, const void* src, size_t n) {  // in place is a no-op; overlap is allowed
  if (dst != src && n > 0) std::memmove(dst, src, n);
}

class LocalTransport final : public Transport {
 public:
  const char* name() const override { return "local"; }

  void allreduce(const Op&, const memory::Tensor&, ReduceOp) override {}

  void reduce_scatter(const Op&, const memory::Tensor& input, const memory::Tensor& output, const Counts& c,
                      ReduceOp) override {
    move_bytes(output.raw(), input.raw(), static_cast<size_t>(c.counts[0]) * memory::dtype_size(input.dtype()));
  }

  void allgatherv(const Op&, const memory::Tensor& input, const memory::Tensor& output, const Counts& c) override {
    move_bytes(output.raw(), input.raw(), static_cast<size_t>(c.counts[0]) * memory::dtype_size(input.dtype()));
  }

  void broadcast(const Op&, const memory::Tensor&, int) override {}

  void alltoallv(const Op&, memory::DType t, const ExchangeSide& send, const Counts& s, const ExchangeSide& recv,
                 const Counts&, bool) override {
    // memmove: the contiguous form may pass one tensor as input and output.
    copy_block(send.blocks[0], recv.blocks[0], static_cast<size_t>(s.counts[0]) * memory::dtype_size(t),
               [](void* d, const void* from, size_t n) { std::memmove(d, from, n); });
  }

  void allgather_counts(const Op&, std::span<const int32_t> mine, std::span<int32_t> all) override {
    std::copy(mine.begin(), mine.end(), all.begin());
  }
  void alltoall_counts(const Op&, std::span<const int64_t> send, std::span<int64_t> recv) override {
    std::copy(send.begin(), send.end(), recv.begin());
  }

  void split(const Op&, int, int, GroupState&) override {}  // the child is a local group of one too
};

}  // namespace

std::unique_ptr<Transport> make_local_transport() { return std::make_unique<LocalTransport>(); }

}  // namespace zs::comm::detail
