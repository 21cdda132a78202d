// A deliberately stalled pipeline for the expected-failure test (tests/pp/CMakeLists.txt): the world
// is one pipeline (comm::Topology's "pp" group) running 1F1B; after a healthy step the last stage stops
// inside the next step's schedule (its Context's first allocation, a stuck rank) while the others send
// to it or wait for its gradients. The comm timeout (2 s)
// ends them with a CommError naming the transfer, the pp group and the peer; World::abort then ends
// every rank, the stuck one too.
#include <chrono>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "nn/host_context.h"
#include "pp/pp.h"

using namespace zs;

namespace {

// A HostContext that stops for good at its first allocation once `stall` is set.
class StallContext : public nn::HostContext {
 public:
  bool stall = false;
  memory::Tensor allocate(memory::Shape shape, memory::DType dtype, nn::MemoryUse use) override {
    if (stall) std::this_thread::sleep_for(std::chrono::seconds(40));  // killed by the others' abort
    return HostContext::allocate(std::move(shape), dtype, use);
  }
};

}  // namespace

int main() {
  try {
    auto world = comm::World::create(comm::CommConfig{.timeout_s = 2.0});
    comm::Topology topo(world.group(), {.pipeline_parallel_size = world.size()});
    const nn::GptConfig cfg{.n_layer = 4, .d_model = 8, .n_head = 2, .seq_len = 4, .vocab_size = 8};
    pp::GptPipeline gpt(cfg, topo.pipeline_parallel(), {});
    gpt.materialize(1);
    std::vector<nn::Batch> mbs;
    for (int i = 0; i < 4; ++i) {
      nn::Batch b{memory::Tensor::empty({1, 4}, memory::DType::kI32), memory::Tensor::empty({1, 4}, memory::DType::kI32)};
      for (int j = 0; j < 4; ++j) b.inputs.data<int32_t>()[j] = b.targets.data<int32_t>()[j] = (i + j) % 8;
      mbs.push_back(b);
    }
    StallContext ctx;
    gpt.step(ctx, mbs, 0.25f);  // a healthy step first
    ctx.stall = world.rank() == world.size() - 1;
    gpt.step(ctx, mbs, 0.25f);
    return 0;
  } catch (const std::exception& e) {
    comm::World::abort(e.what(), 3);
  }
}
