// ZeRO-3's one-sided parameter gathers (Note [one-sided parameter gathers] in
// engine/detail/param_gatherer.h): on one node with the shared arena, a stage-3 run trains bit for bit
// as with the collectives (losses, evaluation losses, parameter digest; gradient accumulation,
// persistent and released modules), sends and tallies the same bytes and collectives, and a forward
// no longer waits for a peer that is late to the step.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "engine/dataset_source.h"
#include "engine/engine.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "tests/support/mpi_test_env.h"

namespace zs::engine {
namespace {

nn::GptConfig tiny() { return {.n_layer = 2, .d_model = 64, .n_head = 4, .seq_len = 32, .vocab_size = 256}; }

EngineConfig config(bool shared_arena, int64_t accumulation) {
  EngineConfig c;
  c.batch = resolve_batch(0, 2, accumulation, test::world().size());
  c.zero.stage = 3;
  c.zero.stage3_param_persistence_threshold = 1000;  // LayerNorms stay gathered; linears gathered per use
  c.zero.stage3_prefetch_bucket_size = 20000;
  c.precision = Precision::kBf16;
  c.device.memory_mb = 64;
  c.comm.shared_arena = shared_arena;  // false: the staged collectives (main's gather path, same bits)
  c.seed = 5;
  return c;
}

uint64_t allgatherv_count(const comm::Group& g, uint64_t* bytes) {
  for (const comm::OpStats& s : g.op_stats()) {
    if (s.name == "allgatherv") {
      *bytes = s.bytes_sent;
      return s.count;
    }
  }
  *bytes = 0;
  return 0;
}

struct TrainRun {
  std::vector<double> losses, evals;
  std::vector<uint64_t> step_bytes;
  std::string digest;
  uint64_t gathers = 0, gather_bytes = 0, collectives = 0, bytes_sent = 0;
};

TrainRun train(bool shared_arena) {
  const comm::Group& world = test::world().group();
  nn::GptModel model(tiny());
  Engine engine(model, config(shared_arena, 2), world);
  DatasetSource data(nn::Dataset::builtin(tiny().seq_len), 7), held_out(nn::Dataset::builtin(tiny().seq_len), 99);
  TrainRun r;
  uint64_t b0 = 0;
  const uint64_t g0 = allgatherv_count(world, &b0);
  const comm::CommCounters c0 = world.counters();
  for (int i = 0; i < 3; ++i) {
    const StepReport rep = engine.train_batch(data);
    r.losses.push_back(rep.loss);
    r.step_bytes.push_back(rep.comm_bytes_sent);
    r.evals.push_back(engine.eval_batch(held_out));  // between steps: reads the new version
  }
  uint64_t b1 = 0;
  r.gathers = allgatherv_count(world, &b1) - g0;
  r.gather_bytes = b1 - b0;
  const comm::CommCounters c1 = world.counters();
  r.collectives = c1.collectives - c0.collectives;
  r.bytes_sent = c1.bytes_sent - c0.bytes_sent;
  r.digest = engine.param_digest();
  return r;
}

TEST(OneSidedGathers, TrainBitForBitAndCountAsTheCollectives) {
  const TrainRun one_sided = train(true), collective = train(false);
  EXPECT_EQ(one_sided.losses, collective.losses);
  EXPECT_EQ(one_sided.evals, collective.evals);
  EXPECT_EQ(one_sided.digest, collective.digest);
  EXPECT_EQ(one_sided.step_bytes, collective.step_bytes);
  EXPECT_EQ(one_sided.gathers, collective.gathers);
  EXPECT_EQ(one_sided.gather_bytes, collective.gather_bytes);
  EXPECT_EQ(one_sided.collectives, collective.collectives);
  EXPECT_EQ(one_sided.bytes_sent, collective.bytes_sent);
  if (test::world().size() > 1) {
    EXPECT_GT(one_sided.gathers, 0u);
  }
}

// Rank 1 comes to the second step 0.8 s late. With the collectives every gather of rank 0's forward
// meets rank 1 (its forward takes the 0.8 s); one-sided, rank 0's forward reads the shards rank 1
// published at the end of step 1 and waits for nobody (the meeting moves to the backward's
// reduce-scatters, as at stage 0).
double late_peer_forward_s(bool shared_arena) {
  const comm::Group& world = test::world().group();
  nn::GptModel model(tiny());
  Engine engine(model, config(shared_arena, 1), world);
  DatasetSource data(nn::Dataset::builtin(tiny().seq_len), 7);
  engine.train_batch(data);
  world.barrier();
  if (world.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(800));
  return engine.train_batch(data).forward_s;
}

TEST(OneSidedGathers, AForwardDoesNotWaitForALatePeer) {
  if (test::world().size() < 2) GTEST_SKIP() << "needs two ranks";
  const double one_sided = late_peer_forward_s(true);
  const double collective = late_peer_forward_s(false);
  if (test::world().rank() == 0) {
    EXPECT_GT(collective, 0.5) << "the collective path should have waited for rank 1";
    EXPECT_LT(one_sided, 0.3) << "rank 0's forward waited for the late rank 1";
  }
}

}  // namespace
}  // namespace zs::engine
