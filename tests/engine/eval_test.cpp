// Engine::eval_batch: the loss of a held-out batch with no gradient. The same at every ZeRO stage and
// world size, it leaves training exactly as it was (the step losses and the parameters of a run with
// evaluations interleaved are bit for bit those of a run without), saves no activations (its
// activation peak is below a training forward's), and may run between micro-batches of a window.
#include <gtest/gtest.h>

#include <vector>

#include "engine/dataset_source.h"
#include "engine/engine.h"
#include "examples/mlp_model.h"
#include "nn/gpt.h"
#include "optim/adam.h"
#include "tests/support/mpi_test_env.h"

namespace zs::engine {
namespace {

using examples::MlpConfig;
using examples::Regressor;
using examples::TeacherData;

constexpr int64_t kBatch = 8;

EngineConfig mlp_config(int stage, int64_t accumulation, int ranks) {
  EngineConfig c;
  c.batch = resolve_batch(kBatch, 0, accumulation, ranks);
  c.zero.stage = stage;
  c.zero.stage3_param_persistence_threshold = 0;  // every stage-3 parameter is gathered and released
  c.optimizer = OptimizerConfig("AdamW", optim::AdamConfig{.lr = 1e-2});
  c.device.memory_mb = 16;
  c.seed = 7;
  return c;
}

struct TrainRun {
  std::vector<double> step_losses;
  std::vector<double> eval_losses;
  std::string digest;
};

// `steps` optimizer steps; with `evaluate`, an evaluation of two held-out batches before the first
// step and after each.
TrainRun train(int stage, int64_t accumulation, int steps, bool evaluate) {
  const comm::Group& world = test::world().group();
  MlpConfig mlp;
  Regressor model(mlp);
  Engine engine(model, mlp_config(stage, accumulation, world.size()), world);
  TeacherData data(mlp, 7, kBatch);
  TeacherData held_out(mlp, 99, kBatch);  // another seed: samples training never sees
  TrainRun run;
  auto eval = [&] {
    if (evaluate) run.eval_losses.push_back(engine.eval_batch(held_out, 0) + engine.eval_batch(held_out, 1));
  };
  eval();
  for (int i = 0; i < steps; ++i) {
    run.step_losses.push_back(engine.train_batch(data).loss);
    eval();
  }
  run.digest = engine.param_digest();
  return run;
}

TEST(EvalBatch, SameLossAtEveryStage) {
  const TrainRun reference = train(0, 2, 3, true);
  ASSERT_EQ(reference.eval_losses.size(), 4u);
  EXPECT_NE(reference.eval_losses.front(), reference.eval_losses.back());  // training moved it
  for (int stage : {1, 2, 3}) {
    const TrainRun r = train(stage, 2, 3, true);
    for (size_t i = 0; i < r.eval_losses.size(); ++i) {
      EXPECT_NEAR(r.eval_losses[i], reference.eval_losses[i], 1e-5 * reference.eval_losses[i])
          << "stage " << stage << " evaluation " << i;
    }
  }
}

TEST(EvalBatch, TrainingIsIdenticalWithAndWithoutEvaluations) {
  for (int stage : {0, 1, 2, 3}) {
    const TrainRun plain = train(stage, 2, 3, false);
    const TrainRun interleaved = train(stage, 2, 3, true);
    EXPECT_EQ(plain.step_losses, interleaved.step_losses) << "stage " << stage;
    EXPECT_EQ(plain.digest, interleaved.digest) << "stage " << stage;
  }
}

// Between micro-batches of a window: the gradients accumulated so far survive the evaluation.
TEST(EvalBatch, BetweenMicroBatchesLeavesTheWindowAlone) {
  const comm::Group& world = test::world().group();
  for (int stage : {0, 2, 3}) {
    MlpConfig mlp;
    TeacherData data(mlp, 7, kBatch);
    TeacherData held_out(mlp, 99, kBatch);
    std::string digests[2];
    for (int with_eval = 0; with_eval < 2; ++with_eval) {
      Regressor model(mlp);
      Engine engine(model, mlp_config(stage, 2, world.size()), world);
      const int64_t micro = engine.config().batch.micro_batch_per_rank;
      nn::Batch batch;
      for (int64_t m = 0; m < 2; ++m) {
        data.fill(batch, 0, m * micro * world.size() + world.rank() * micro, micro);
        engine.forward(batch);
        if (with_eval) EXPECT_THROW(engine.eval_batch(held_out), UsageError);  // forward pending
        engine.backward();
        if (with_eval) engine.eval_batch(held_out);
        engine.step();
      }
      digests[with_eval] = engine.param_digest();
    }
    EXPECT_EQ(digests[0], digests[1]) << "stage " << stage;
  }
}

// A GPT saves several tensors per block for its backward; evaluation keeps only a forward's working set.
TEST(EvalBatch, SavesNoActivations) {
  const comm::Group& world = test::world().group();
  const nn::GptConfig gpt{.n_layer = 3, .d_model = 32, .n_head = 2, .seq_len = 16};
  DatasetSource data(nn::Dataset::builtin(gpt.seq_len), 7);
  for (int stage : {0, 3}) {
    uint64_t peak[2];
    for (int training = 0; training < 2; ++training) {
      nn::GptModel model(gpt);
      Engine engine(model, mlp_config(stage, 1, world.size()), world);
      const int64_t micro = engine.config().batch.micro_batch_per_rank;
      if (training) {
        nn::Batch batch;
        data.fill(batch, 0, world.rank() * micro, micro);
        engine.forward(batch);
      } else {
        engine.eval_batch(data);
      }
      peak[training] = engine.memory_report().activation_peak_bytes;
      EXPECT_EQ(model.forward_pending(), training == 1);
    }
    // Measured at np 2: 98,304 B against 503,808 B (stages 0 and 3 alike); the bound leaves room for layout changes.
    EXPECT_LT(peak[0], peak[1] / 2) << "stage " << stage << ": evaluation " << peak[0] << " B, training forward " << peak[1];
  }
}

}  // namespace
}  // namespace zs::engine
