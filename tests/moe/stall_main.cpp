// A deliberately stalled MoE job for the expected-failure test (tests/moe/CMakeLists.txt): every rank
// runs the layer's forward with expert parallelism over all ranks, then rank 1 stops (a stuck rank)
// while the others enter the backward's all-to-all. The comm timeout (2 s) ends them with a CommError
// naming the alltoallv; World::abort then ends every rank, the stuck one too.
#include <chrono>
#include <thread>

#include "comm/comm.h"
#include "moe/moe.h"
#include "nn/host_context.h"
#include "nn/transformer.h"

using namespace zs;

int main() {
  try {
    auto world = comm::World::create(comm::CommConfig{.timeout_s = 2.0});
    comm::ExpertGroups groups = world.split_groups(world.size());
    moe::MoE layer(8, [] { return std::make_unique<nn::Mlp>(8); },
                   {.num_experts = 2 * world.size(), .ep_size = world.size(), .use_rts = false}, &groups);
    nn::materialize(layer, 1);
    nn::HostContext ctx;
    memory::Tensor x = memory::Tensor::empty({16, 8}, memory::DType::kF32);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>((i * 7 + world.rank()) % 11) - 5.0f;
    memory::Tensor y = ctx.forward(layer, x);
    if (world.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(40));  // killed by the others' abort
    layer.set_aux_loss_grad(0.0f);
    ctx.backward(layer, y);
    return 0;
  } catch (const std::exception& e) {
    comm::World::abort(e.what(), 3);
  }
}
