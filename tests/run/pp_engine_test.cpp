// Pipeline parallelism through the engine (Note [pipeline stages in the engine] in
// engine/pipeline_model.h): run::GptPipelineModel stages at pp 2 (np 2: pp 2; np 4: pp 2 x dp 2,
// pp 2 x tp 2) and pp 4 (np 4) train the built-in GPT like nn::GptModel at pp 1 over every rank (the
// same global batch): losses and gradient norms equal to 1e-5 relative (fp32) for every schedule at
// ZeRO 0, 1 and 2 with gradient accumulation, clipping below the gradient norm (a norm missing a stage,
// or counting the tied embedding twice, is compared directly), tied and untied embeddings, recomputed blocks, bf16 and fp16
// (1e-2; fp16's overflowing first steps skipped alike on every stage) and optimizer offload to the
// host. The config's pipeline keys and their mistakes are checked at
// the end (no MPI needed).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "comm/topology.h"
#include "core/errors.h"
#include "core/json.h"
#include "engine/dataset_source.h"
#include "engine/engine.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "run/run.h"
#include "tests/support/mpi_test_env.h"

namespace zs::run {
namespace {

constexpr int kSteps = 4;

struct Case {
  int pp = 2, tp = 1;
  std::string schedule = "1f1b";
  int virtual_size = 1;
  int zero = 1;
  bool bf16 = false, tied = true, recompute = false, offload = false, fp16 = false;
  double clip = 0.3;  // gradient_clipping (0: off)
  std::string describe() const {
    return fmt::format("pp {} tp {} {}{} zero {}{}{}{}{}", pp, tp, schedule,
                       virtual_size > 1 ? fmt::format(" v{}", virtual_size) : "", zero, bf16 ? " bf16" : fp16 ? " fp16" : "",
                       tied ? " tied" : " untied", recompute ? " recompute" : "", offload ? " offload" : "");
  }
};

std::string config_json(const Case& c, bool reference) {
  const int pp = reference ? 1 : c.pp, tp = reference ? 1 : c.tp;
  std::string zero = fmt::format(R"({{"stage": {}, "reduce_bucket_size": 3000{}}})", c.zero,
                                 c.offload ? R"(, "offload_optimizer": {"device": "cpu"})" : "");
  std::string pipeline =
      reference ? "" : fmt::format(R"(, "pipeline": {{"schedule": "{}"}})", c.schedule);
  return fmt::format(
      R"({{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": {},
          "optimizer": {{"type": "AdamW", "params": {{"lr": 0.01, "weight_decay": 0.01}}}},
          "zero_optimization": {}, "bf16": {{"enabled": {}}}, "fp16": {{"enabled": {}, "initial_scale_power": 18}},
          "device": {{"memory_mb": 256}},
          "comm": {{"timeout_s": 60}},
          "activation_checkpointing": {{"checkpoint_blocks": "{}"}},
          "model": {{"n_layer": 8, "d_model": 32, "n_head": 2, "seq_len": 16, "tied_embeddings": {},
                    "tensor_parallel_size": {}, "pipeline_parallel_size": {}, "virtual_pipeline_size": {}}}{}}})",
      c.clip, zero, c.bf16, c.fp16, c.recompute ? "all" : "none", c.tied, tp, pp, reference ? 1 : c.virtual_size,
      pipeline);
}

// Losses and gradient norms of kSteps optimizer steps of one run of the case (or of its pp 1 reference
// over every rank): losses[s], then norms at losses[kSteps + s]. Adam hides a wrong clipping scale
// in the losses (its update is nearly invariant to a gradient's scale), so the norms are compared too.
// Checkpoints: `load` (a directory; empty: none) is loaded before training, `save` written after
// `save_after` steps.
std::vector<double> train(const Case& c, bool reference, int steps = kSteps, const std::string& load = "",
                          const std::string& save = "", int save_after = 0) {
  const comm::Group& world = test::world().group();
  RunConfig cfg = parse_run_config(parse_json_text(config_json(c, reference), "case"), world.size());
  const int pp = cfg.pipeline.pipeline_parallel_size, tp = cfg.tensor_parallel.tensor_parallel_size;
  comm::Topology topo(world, {.tensor_parallel_size = tp, .pipeline_parallel_size = pp});
  std::unique_ptr<nn::Model> model;
  const comm::Group* tp_group = tp > 1 ? &topo.tensor_parallel() : nullptr;
  if (pp > 1) {
    if (cfg.recompute.blocks != engine::RecomputeConfig::Blocks::kNone) cfg.recompute.applied_by_program = true;
    model = std::make_unique<GptPipelineModel>(*cfg.model, topo.pipeline_parallel(), gpt_pipeline_config(cfg, tp_group));
  } else {
    model = std::make_unique<nn::GptModel>(*cfg.model);
  }
  engine::DatasetSource source(nn::Dataset::builtin(cfg.model->seq_len), cfg.seed);
  engine::Engine engine = tp_group != nullptr ? engine::Engine(*model, cfg, topo.data_parallel(), *tp_group)
                                              : engine::Engine(*model, cfg, topo.data_parallel());
  if (!load.empty()) engine.load_checkpoint(load);
  std::vector<double> losses, norms;
  int skipped = 0;
  for (int s = 0; s < steps; ++s) {
    if (!save.empty() && s == save_after) engine.save_checkpoint(save);
    const engine::StepReport& r = engine.train_batch(source);
    losses.push_back(r.loss);
    norms.push_back(std::isfinite(r.grad_norm) ? r.grad_norm : -1.0);  // an fp16 overflow: the same on every run
    skipped += r.skipped ? 1 : 0;
    if (pp > 1 && !reference) {
      EXPECT_GT(r.pipeline.seconds, 0.0);
      EXPECT_GT(r.pipeline.bytes_sent, 0);
    }
  }
  if (!save.empty() && steps == save_after) engine.save_checkpoint(save);
  if (c.fp16) EXPECT_TRUE(skipped > 0 && skipped < steps) << c.describe() << ": " << skipped << " skipped steps";
  losses.insert(losses.end(), norms.begin(), norms.end());
  return losses;
}

void expect_same_losses(const Case& c) {
  const std::vector<double> ref = train(c, /*reference=*/true);
  const std::vector<double> got = train(c, /*reference=*/false);
  const double tol = c.bf16 || c.fp16 ? 1e-2 : 1e-5;
  double worst = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double rel = std::abs(got[i] - ref[i]) / std::abs(ref[i]);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, tol) << c.describe() << ": step " << i % kSteps + 1 << (i < kSteps ? " loss " : " grad norm ")
                        << got[i] << " vs pp 1 " << ref[i];
  }
  if (test::world().rank() == 0) std::printf("%s: losses and gradient norms within %.2e relative of pp 1's\n", c.describe().c_str(), worst);
}

// Every schedule at ZeRO 0, 1 and 2 (interleaved with 2 chunks per rank), tied embeddings, clipping.
void every_schedule_and_stage(int pp, int tp) {
  for (const char* schedule : {"afab", "1f1b", "interleaved", "zb-h1"}) {
    for (int zero : {0, 1, 2}) {
      Case c{.pp = pp, .tp = tp, .schedule = schedule, .virtual_size = std::string(schedule) == "interleaved" ? 2 : 1,
             .zero = zero};
      expect_same_losses(c);
    }
  }
}

TEST(PipelineEngine, Pp2EverySchedule) {
  if (test::world().size() == 4) {
    every_schedule_and_stage(2, 1);  // pp 2 x dp 2
  } else if (test::world().size() == 2) {
    every_schedule_and_stage(2, 1);  // pp 2
  } else {
    GTEST_SKIP() << "pp 2 over 2 or 4 ranks";
  }
}

TEST(PipelineEngine, Pp4AndPp2xTp2) {
  if (test::world().size() != 4) GTEST_SKIP() << "pp 4 and pp 2 x tp 2 over 4 ranks";
  for (const char* schedule : {"1f1b", "interleaved", "zb-h1"}) {
    expect_same_losses({.pp = 4, .schedule = schedule, .virtual_size = std::string(schedule) == "interleaved" ? 2 : 1,
                        .zero = 2});
    expect_same_losses({.pp = 2, .tp = 2, .schedule = schedule,
                        .virtual_size = std::string(schedule) == "interleaved" ? 2 : 1, .zero = 1});
  }
}

TEST(PipelineEngine, Bf16RecomputeUntiedOffload) {
  const int n = test::world().size();
  if (n != 2 && n != 4) GTEST_SKIP() << "pp 2 over 2 or 4 ranks";
  expect_same_losses({.schedule = "1f1b", .zero = 2, .bf16 = true});
  expect_same_losses({.schedule = "zb-h1", .zero = 1, .bf16 = true});
  // fp16 from a loss scale of 2^18: the first 2 steps overflow and are skipped on every stage alike.
  expect_same_losses({.schedule = "1f1b", .zero = 2, .fp16 = true});
  expect_same_losses({.schedule = "zb-h1", .zero = 1, .recompute = true});
  expect_same_losses({.schedule = "interleaved", .virtual_size = 2, .zero = 0, .tied = false, .recompute = true});
  expect_same_losses({.schedule = "1f1b", .zero = 2, .offload = true});
  expect_same_losses({.schedule = "zb-h1", .zero = 1, .offload = true});
}

// Checkpoints by parameter name: a pp 2 x dp 2 run's checkpoint after 2 steps resumes at pp 1 x dp 4
// and at pp 4 with the same continued losses and gradient norms as the pp 2 x dp 2 run itself.
TEST(PipelineEngine, CheckpointResumesAtAnotherPp) {
  const comm::Group& world = test::world().group();
  if (world.size() != 4) GTEST_SKIP() << "pp 2 x dp 2, pp 1 x dp 4 and pp 4 over 4 ranks";
  namespace fs = std::filesystem;
  const fs::path dir = fs::current_path() / "zs-pp-ckpt-test";
  if (world.rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  world.barrier();
  const Case pp2{.pp = 2, .schedule = "zb-h1", .zero = 2};
  const std::vector<double> straight = train(pp2, false, 4, "", (dir / "pp2").string(), 2);
  const std::vector<double> tail(straight.begin() + 2, straight.begin() + 4);
  const std::vector<double> tail_norms(straight.begin() + 6, straight.begin() + 8);
  for (const Case& at : {Case{.pp = 1, .schedule = "1f1b", .zero = 1}, Case{.pp = 4, .schedule = "1f1b", .zero = 2}}) {
    const std::vector<double> got = train(at, at.pp == 1, 2, (dir / "pp2").string());
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_NEAR(got[i], tail[i], 1e-5 * tail[i]) << "resumed at pp " << at.pp << ", step " << i + 3 << " loss";
      EXPECT_NEAR(got[2 + i], tail_norms[i], 1e-5 * tail_norms[i]) << "resumed at pp " << at.pp << ", step " << i + 3 << " norm";
    }
  }
  world.barrier();
  if (world.rank() == 0) fs::remove_all(dir);
}

// The whole model's fp32_param and param_digest at pp > 1 (Note [whole-model digest] in
// engine/param_digest.cpp). Untied and without clipping, a pp 2 run (np 2: pp 2; np 4: pp 2 x dp 2)
// does the pp 1 run's arithmetic in the same order, so its losses and parameters are equal to the bit
// to those of pp 1 over the same data-parallel size (the reference runs on blocks of dp ranks): the
// digest must then be equal too, on every rank, as must fp32_param of a parameter only the last
// stage holds. (With the tied embedding or
// clipping the two runs sum in another order, the head's gradient and the norm over pp, so they agree
// to 1e-7, not bitwise; there every rank must still report the same digest.)
struct Whole {
  std::vector<double> losses;
  std::string digest;
  std::vector<float> head, qkv;
};

Whole train_whole(const Case& c, bool reference, const comm::Group& group) {
  RunConfig cfg = parse_run_config(parse_json_text(config_json(c, reference), "case"), group.size());
  const int pp = cfg.pipeline.pipeline_parallel_size;
  comm::Topology topo(group, {.pipeline_parallel_size = pp});
  std::unique_ptr<nn::Model> model;
  if (pp > 1) {
    model = std::make_unique<GptPipelineModel>(*cfg.model, topo.pipeline_parallel(), gpt_pipeline_config(cfg, nullptr));
  } else {
    model = std::make_unique<nn::GptModel>(*cfg.model);
  }
  engine::DatasetSource source(nn::Dataset::builtin(cfg.model->seq_len), cfg.seed);
  engine::Engine engine(*model, cfg, topo.data_parallel());
  Whole w;
  for (int s = 0; s < kSteps; ++s) w.losses.push_back(engine.train_batch(source).loss);
  w.digest = engine.param_digest();
  w.head = engine.fp32_param(c.tied ? "wte" : "lm_head.weight");
  w.qkv = engine.fp32_param("blocks.0.attn.qkv.weight");
  return w;
}

TEST(PipelineEngine, DigestAndFp32ParamAreTheWholeModels) {
  const comm::Group& world = test::world().group();
  if (world.size() != 2 && world.size() != 4) GTEST_SKIP() << "pp 2 over 2 or 4 ranks";
  // pp 2 x dp D puts stage s on ranks s * D .. s * D + D - 1: each block of D ranks trains the pp 1
  // reference over dp D with the same samples as the pp run's dp ranks.
  const int dp = world.size() / 2;
  const comm::Group block = world.split(world.rank() / dp, world.rank(), "reference");
  const Case untied{.schedule = "1f1b", .zero = 1, .tied = false, .clip = 0.0};
  const Whole ref = train_whole(untied, /*reference=*/true, block);
  const Whole got = train_whole(untied, /*reference=*/false, world);
  for (int s = 0; s < kSteps; ++s) EXPECT_EQ(got.losses[s], ref.losses[s]) << "step " << s + 1;
  EXPECT_EQ(got.digest, ref.digest) << "rank " << world.rank();
  EXPECT_TRUE(got.head == ref.head) << "fp32_param(\"lm_head.weight\") on rank " << world.rank();
  EXPECT_TRUE(got.qkv == ref.qkv) << "fp32_param(\"blocks.0.attn.qkv.weight\") on rank " << world.rank();

  // Tied and clipped: not bitwise pp 1's, but one whole-model digest on every rank, and the tied
  // embedding's values on every stage.
  const Whole tied = train_whole({.schedule = "zb-h1", .zero = 2}, /*reference=*/false, world);
  ASSERT_EQ(tied.digest.size(), 64u);  // hex SHA-256: 16 int32 words
  std::string mine = tied.digest, all(64 * static_cast<size_t>(world.size()), ' ');
  world.allgather(memory::Tensor(mine.data(), memory::DType::kI32, {16}),
                  memory::Tensor(all.data(), memory::DType::kI32, {16 * world.size()}));
  for (int r = 0; r < world.size(); ++r) {
    EXPECT_EQ(all.substr(64 * static_cast<size_t>(r), 64), tied.digest) << "rank " << r << "'s digest, on rank " << world.rank();
  }
  EXPECT_FALSE(tied.head.empty());
}

// ---- config keys (no MPI) ---------------------------------------------------------------------------

std::string error_of(const std::string& json, int ranks) {
  try {
    (void)parse_run_config(parse_json_text(json, "case"), ranks);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

constexpr const char* kBase = R"("train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4)";

std::string with(const std::string& model, const std::string& rest = "") {
  return fmt::format(R"({{{}, "model": {{"n_layer": 4, "d_model": 32, "n_head": 2, "seq_len": 16{}}}{}}})", kBase,
                     model, rest);
}

TEST(PipelineConfig, KeysParsed) {
  RunConfig c = parse_run_config(
      parse_json_text(with(R"(, "pipeline_parallel_size": 2, "virtual_pipeline_size": 2)",
                           R"(, "pipeline": {"schedule": "interleaved", "partition_method": "uniform"})"),
                      "case"),
      4);
  EXPECT_EQ(c.pipeline.pipeline_parallel_size, 2);
  EXPECT_EQ(c.pipeline.virtual_pipeline_size, 2);
  EXPECT_EQ(c.pipeline.schedule, pp::Schedule::kInterleaved);
  EXPECT_EQ(c.pipeline.partition.method, pp::PartitionMethod::kUniform);
  EXPECT_EQ(c.batch.train_batch_size, 2 * 4 * 2);  // data-parallel size 4 / pp 2
  RunConfig e = parse_run_config(
      parse_json_text(with(R"(, "pipeline_parallel_size": 2)", R"(, "pipeline": {"partition_boundaries": [0, 1, 4]})"),
                      "case"),
      2);
  EXPECT_EQ(e.pipeline.partition.method, pp::PartitionMethod::kExplicit);
  EXPECT_EQ(e.pipeline.schedule, pp::Schedule::kOneFOneB);  // the default
  RunConfig f = parse_run_config(
      parse_json_text(with(R"(, "pipeline_parallel_size": 2)", R"(, "pipeline": {"partition_method": "compute"})"), "case"),
      2);
  EXPECT_EQ(f.pipeline.partition.method, pp::PartitionMethod::kCompute);
}

TEST(PipelineConfig, MistakesNameTheKeys) {
  auto expect = [](const std::string& json, int ranks, const std::string& part) {
    const std::string e = error_of(json, ranks);
    EXPECT_NE(e.find(part), std::string::npos) << "got: '" << e << "' for " << json;
  };
  expect(with(R"(, "pipeline_parallel_size": 8)"), 8, "model.pipeline_parallel_size: 8 stages");  // 4 layers
  expect(with(R"(, "pipeline_parallel_size": 3)"), 4, "model.pipeline_parallel_size: 3 stages x model.tensor_parallel_size 1");
  expect(with(R"(, "pipeline_parallel_size": 2, "tensor_parallel_size": 2)"), 2, "does not divide the number of ranks (2)");
  expect(with(R"(, "virtual_pipeline_size": 2)"), 2, "model.virtual_pipeline_size: 2 chunks per rank need pipeline parallelism");
  expect(with(R"(, "pipeline_parallel_size": 2, "virtual_pipeline_size": 2)"), 2, "model.virtual_pipeline_size: 2 chunks per rank need pipeline.schedule");
  expect(with(R"(, "pipeline_parallel_size": 2)", R"(, "pipeline": {"schedule": "gpipe"})"), 2, "pipeline.schedule");
  expect(with(R"(, "pipeline_parallel_size": 2)", R"(, "pipeline": {"partition_method": "type:transformer"})"), 2,
         "pipeline.partition_method");
  expect(with(R"(, "pipeline_parallel_size": 2)", R"(, "pipeline": {"partition_boundaries": [0, 3]})"), 2,
         "pipeline.partition_boundaries");
  expect(with(R"(, "pipeline_parallel_size": 2)", R"(, "pipeline": {"stages": 2})"), 2, "pipeline.stages");
  // 1F1B-like schedules need at least as many micro-batches as stages; AFAB does not.
  const std::string few = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "model": {"n_layer": 4, "d_model": 32, "n_head": 2, "seq_len": 16, "pipeline_parallel_size": 4}})";
  expect(few, 4, "gradient_accumulation_steps: 2 micro-batches per step for model.pipeline_parallel_size 4");
  EXPECT_EQ(error_of(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "model": {"n_layer": 4, "d_model": 32, "n_head": 2, "seq_len": 16, "pipeline_parallel_size": 4}, "pipeline": {"schedule": "afab"}})", 4), "");
  expect(with(R"(, "pipeline_parallel_size": 2)", R"(, "zero_optimization": {"stage": 3})"), 2,
         "zero_optimization.stage: 3 with model.pipeline_parallel_size 2");
}

}  // namespace
}  // namespace zs::run
