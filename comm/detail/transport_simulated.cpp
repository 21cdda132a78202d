// The simulated transport (Group::simulated, for the memory estimator): it moves nothing. The Runtime
// counts a simulated group's ops without running their bodies (Runtime::simulate), so these are
// reached only by code that calls a transport directly; they leave every output as it was, which is
// what Group::simulated promises ("nothing it receives is valid").
#include "comm/detail/transport.h"

namespace zs::comm::detail {

namespace {

class SimulatedTransport final : public Transport {
 public:
  const char* name() const override { return "simulated"; }
  void allreduce(const Op&, const memory::Tensor&, ReduceOp) override {}
  void reduce_scatter(const Op&, const memory::Tensor&, const memory::Tensor&, const Counts&, ReduceOp) override {}
  void allgatherv(const Op&, const memory::Tensor&, const memory::Tensor&, const Counts&) override {}
  void broadcast(const Op&, const memory::Tensor&, int) override {}
  void alltoallv(const Op&, memory::DType, const ExchangeSide&, const Counts&, const ExchangeSide&, const Counts&,
                 bool) override {}
  void allgather_counts(const Op&, std::span<const int32_t>, std::span<int32_t>) override {}
  void alltoall_counts(const Op&, std::span<const int64_t>, std::span<int64_t>) override {}
  void split(const Op&, int, int, GroupState&) override {}  // the child is a local group of one, as before
};

}  // namespace

std::unique_ptr<Transport> make_simulated_transport() { return std::make_unique<SimulatedTransport>(); }

}  // namespace zs::comm::detail
