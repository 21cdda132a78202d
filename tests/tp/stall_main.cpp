// A deliberately stalled tensor-parallel job for the expected-failure test (tests/tp/CMakeLists.txt):
// every rank of one tensor-parallel group (all ranks, comm::Topology's "tp") runs a ParallelMlp's
// forward, then rank 1 stops (a stuck rank) while the others enter the backward's all-reduce (the fc
// layer's input gradient). The comm timeout (2 s) ends them with a CommError naming the allreduce and
// the tp group; World::abort then ends every rank, the stuck one too.
#include <chrono>
#include <thread>

#include "comm/comm.h"
#include "nn/host_context.h"
#include "tp/tp.h"

using namespace zs;

int main() {
  try {
    auto world = comm::World::create(comm::CommConfig{.timeout_s = 2.0});
    comm::Topology topo(world.group(), {.tensor_parallel_size = world.size()});
    tp::ParallelMlp mlp(8, {.group = &topo.tensor_parallel()});
    nn::materialize(mlp, 1);
    nn::HostContext ctx;
    memory::Tensor x = memory::Tensor::empty({2, 4, 8}, memory::DType::kF32);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(i % 11) - 5.0f;
    memory::Tensor y = ctx.forward(mlp, x);
    if (world.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(40));  // killed by the others' abort
    ctx.backward(mlp, y);
    return 0;
  } catch (const std::exception& e) {
    comm::World::abort(e.what(), 3);
  }
}
