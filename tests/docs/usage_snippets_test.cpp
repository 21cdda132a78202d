// The usage comments atop the main public headers, line for line: engine/engine.h,
// estimate/measure.h, memory/backend.h. Each test holds the same lines as its header's comment
// between "---- from <header>" markers, with only what the comment leaves to the reader defined
// around them (a config, a data source, a kernel). When a signature changes, this test fails to
// compile until the comment and these lines are fixed together.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "comm/world.h"
#include "engine/config.h"
#include "engine/engine.h"
#include "estimate/measure.h"
#include "memory/backend.h"
#include "nn/gpt.h"
#include "nn/model.h"
#include "optim/adam.h"

namespace zs {
namespace {

nn::GptConfig tiny_gpt() { return {.n_layer = 1, .d_model = 32, .n_head = 2, .seq_len = 8, .vocab_size = 64}; }

engine::EngineConfig tiny_config(int world_size) {
  engine::EngineConfig cfg;
  cfg.batch = engine::resolve_batch(16 * world_size, 0, 2, world_size);
  cfg.optimizer = engine::OptimizerConfig("AdamW", optim::AdamConfig{.lr = 1e-3});
  cfg.device.memory_mb = 16;
  cfg.train_steps = 2;
  cfg.model = tiny_gpt();
  return cfg;
}

TEST(UsageSnippets, EngineHeader) {
  const engine::EngineConfig cfg = tiny_config(1);
  int64_t filled = 0;
  // The caller's data: token ids (B, T) and their next tokens.
  auto fill_micro_batch = [&](nn::Batch& batch, int64_t step, int64_t m) {
    const nn::GptConfig& g = *cfg.model;
    batch.inputs = memory::Tensor::empty({cfg.batch.micro_batch_per_rank, g.seq_len}, memory::DType::kI32);
    batch.targets = memory::Tensor::empty({cfg.batch.micro_batch_per_rank, g.seq_len}, memory::DType::kI32);
    int32_t* x = batch.inputs.data<int32_t>();
    int32_t* y = batch.targets.data<int32_t>();
    for (int64_t i = 0; i < batch.inputs.numel(); ++i) {
      x[i] = static_cast<int32_t>((i + step + m) % g.vocab_size);
      y[i] = static_cast<int32_t>((i + step + m + 1) % g.vocab_size);
    }
    ++filled;
  };

  // ---- from engine/engine.h
  auto world = comm::World::create({.timeout_s = cfg.comm.timeout_s});  // mpirun, or a world of one
  nn::GptModel model(*cfg.model);                       // declares parameters; allocates nothing
  engine::Engine engine(model, cfg, world.group());     // places and initialises the model states
  nn::Batch batch;
  for (int64_t step = 0; step < cfg.train_steps; ++step) {
    for (int64_t m = 0; m < cfg.batch.gradient_accumulation_steps; ++m) {
      fill_micro_batch(batch, step, m);                 // yours: this rank's micro-batch m of `step`
      engine.forward(batch);
      engine.backward();
      engine.step();                                    // DeepSpeed style: steps at the boundary
    }
  }
  // ----

  EXPECT_EQ(filled, cfg.train_steps * cfg.batch.gradient_accumulation_steps);
  EXPECT_EQ(engine.global_step(), cfg.train_steps);
}

// The BatchSource the training would use (values do not matter to the estimate; shapes do).
class MySource final : public engine::BatchSource {
 public:
  void fill(nn::Batch& batch, int64_t, int64_t, int64_t count) override {
    const int64_t t = tiny_gpt().seq_len;
    batch.inputs = memory::Tensor::empty({count, t}, memory::DType::kI32);
    batch.targets = memory::Tensor::empty({count, t}, memory::DType::kI32);
  }
};

TEST(UsageSnippets, MeasureHeader) {
  const engine::EngineConfig cfg = tiny_config(8);
  // ---- from estimate/measure.h
  nn::GptModel model(*cfg.model);                      // or your own nn::Model; allocates nothing
  MySource source;                                      // yours: the BatchSource training would use
  engine::Measurement m = engine::estimate(model, cfg, /*ranks=*/8, source);
  for (const auto& r : m.classes) std::printf("ranks %d-%d: device peak %llu\n", r.first_rank, r.last_rank,
                                              (unsigned long long)r.memory.device_peak_bytes);
  // ----

  EXPECT_EQ(m.ranks, 8);
  EXPECT_FALSE(m.classes.empty());
  EXPECT_GT(m.of_rank(7).memory.device_peak_bytes, 0u);
}

int kernel_calls = 0;
void my_cpu_kernel(float* p) {
  p[0] += 1.0f;
  ++kernel_calls;
}

TEST(UsageSnippets, BackendHeader) {
  using namespace memory;
  const size_t device_bytes = size_t{4} << 20;
  std::vector<std::byte> host(size_t{1} << 20, std::byte{0});
  const void* host_ptr = host.data();

  // ---- from memory/backend.h
  auto backend = make_backend("cpu", device_bytes);
  Segment seg = backend->allocate(1 << 20, Tier::kDevice);   // freed when `seg` goes out of scope
  backend->copy(seg.data(), Tier::kDevice, host_ptr, Tier::kHost, 1 << 20);   // counted: host -> device
  backend->fill_zero(seg.data(), Tier::kDevice, 1 << 20);
  run_kernel(*backend, [&] { my_cpu_kernel(static_cast<float*>(seg.data())); });  // skipped when measuring
  backend->synchronize();                                     // operations are complete after this
  // ----

  EXPECT_EQ(kernel_calls, 1);
  EXPECT_EQ(backend->transfers().host_to_device_bytes, uint64_t{1} << 20);
  EXPECT_EQ(static_cast<const float*>(seg.data())[0], 1.0f);
}

}  // namespace
}  // namespace zs
