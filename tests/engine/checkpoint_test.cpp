// Engine::save_checkpoint / load_checkpoint (docs/checkpoints.md).
//   - Resume: 10 steps straight, or 5 steps, save, a new engine loads, 5 steps: bit-identical fp32
//     losses and parameter digest, for every ZeRO stage, every optimizer, offload none/cpu/nvme.
//   - Elastic (np 4): saved at stage 3 on 4 ranks, loaded at 1 rank stage 0, 3 ranks stage 2, 2 ranks
//     stage 1 with cpu offload: the loaded parameters equal the saved ones bit for bit, and training on
//     equals a run never interrupted at the new configuration within 1e-5.
//   - Errors: another model's checkpoint, a corrupt or missing rank file, another optimizer, an
//     unwritable directory: the same error on every rank, never a hang.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/errors.h"
#include "checkpoint/h5.h"
#include "engine/dataset_source.h"
#include "engine/engine.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "optim/adam.h"
#include "optim/cadam.h"
#include "optim/lamb.h"
#include "optim/lion.h"
#include "optim/onebit_adam.h"
#include "tests/support/mpi_test_env.h"
#include "run/run_config.h"

namespace zs::engine {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kBatch = 12;  // divides over 1-4 ranks

nn::GptConfig tiny_gpt(int64_t d_model = 33) {
  return {.n_layer = 2, .d_model = d_model, .n_head = 3, .seq_len = 8, .vocab_size = 256};
}

OptimizerConfig optimizer(const std::string& name) {
  if (name == "AdamW") return OptimizerConfig("AdamW", optim::AdamConfig{.lr = 3e-3, .weight_decay = 0.1});
  if (name == "Lamb") return OptimizerConfig("Lamb", optim::LambConfig{.lr = 3e-3});
  if (name == "Lion") return OptimizerConfig("Lion", optim::LionConfig{.lr = 1e-3});
  if (name == "CAdam") return OptimizerConfig("CAdam", optim::CAdamConfig{.lr = 3e-3});
  // The compressed phases start inside the second half of the run.
  if (name == "OneBitAdam") return OptimizerConfig("OneBitAdam", optim::OneBitAdamConfig{.lr = 3e-3, .freeze_step = 3});
  return OptimizerConfig("ZeroOneAdam", optim::ZeroOneAdamConfig{.lr = 3e-3,
                                                                .var_freeze_step = 4,
                                                                .var_update_scaler = 2,
                                                                .local_step_scaler = 2,
                                                                .local_step_clipper = 4});
}

zs::run::RunConfig make_config(int world, int stage, const std::string& opt, OffloadDevice offload = OffloadDevice::kNone,
                         const std::string& nvme = "") {
  zs::run::RunConfig c;
  c.batch = resolve_batch(kBatch, 0, 1, world);
  c.zero.stage = stage;
  c.zero.reduce_bucket_size = 3000;
  c.zero.allgather_bucket_size = 5000;
  c.zero.stage3_param_persistence_threshold = 100;
  c.zero.offload_optimizer.device = offload;
  c.zero.offload_optimizer.nvme_path = nvme;
  c.zero.sub_group_size = 4000;  // several NVMe sub-groups
  c.optimizer = optimizer(opt);
  c.gradient_clipping = 1.0;
  c.scheduler = {.type = optim::ScheduleType::kWarmupLR, .warmup_min_lr = 0.0, .warmup_max_lr = 3e-3,
                 .warmup_num_steps = 4, .warmup_type = optim::WarmupType::kLinear};
  c.device.memory_mb = 64;
  c.seed = 42;
  c.model = tiny_gpt();
  return c;
}

// A directory every rank of `g` sees (the working directory is the build tree, shared by the ranks).
fs::path shared_dir(const comm::Group& g, const std::string& name) {
  fs::path dir = fs::current_path() / ("zs-ckpt-test-" + name);
  if (g.rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  g.barrier();
  return dir;
}

struct RunResult {
  std::vector<double> losses;
  std::string digest;
};

// Steps [from, to) of a run, after loading `load` (when not empty); saves to `save` at the end.
RunResult train(const comm::Group& g, const zs::run::RunConfig& cfg, int from, int to, const fs::path& load = {},
          const fs::path& save = {}) {
  nn::GptModel model(*cfg.model);
  Engine engine(model, cfg, g);
  DatasetSource source(nn::Dataset::builtin(cfg.model->seq_len), 7);
  if (!load.empty()) engine.load_checkpoint(load);
  EXPECT_EQ(engine.global_step(), from);
  RunResult r;
  while (engine.global_step() < to) r.losses.push_back(engine.train_batch(source).loss);
  if (!save.empty()) {
    engine.save_checkpoint(save);
    engine.wait_checkpoint();  // checkpoint.async: commit before the engine goes
  }
  r.digest = engine.param_digest();
  return r;
}

struct Case {
  int stage;
  std::string optimizer;
  OffloadDevice offload = OffloadDevice::kNone;
  Precision precision = Precision::kFp32;
  bool reuse_fp32_param = false;
  bool async = false;
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  return fmt::format("stage{}_{}_{}_{}{}", info.param.stage, info.param.optimizer, offload_device_name(info.param.offload),
                     precision_name(info.param.precision),
                     std::string(info.param.reuse_fp32_param ? "_reuse" : "") + (info.param.async ? "_async" : ""));
}

class ResumeTest : public testing::TestWithParam<Case> {};

TEST_P(ResumeTest, TenStepsEqualFivePlusFive) {
  const comm::Group& g = test::world().group();
  if (g.size() > 2) GTEST_SKIP() << "the resume matrix runs at 1 and 2 ranks (the elastic test at 4)";
  const Case& c = GetParam();
  const fs::path dir = shared_dir(g, case_name({c, 0}));
  const std::string nvme = (dir / "swap").string();
  if (g.rank() == 0) fs::create_directories(nvme);
  g.barrier();
  zs::run::RunConfig cfg = make_config(g.size(), c.stage, c.optimizer, c.offload, nvme);
  cfg.precision = c.precision;
  cfg.memory.reuse_fp32_param = c.reuse_fp32_param;
  cfg.checkpoint.async = c.async;
  cfg.loss_scaler.initial_scale_power = 8;
  const RunResult whole = train(g, cfg, 0, 10);
  const RunResult first = train(g, cfg, 0, 5, {}, dir / "ckpt");
  const RunResult second = train(g, cfg, 5, 10, dir / "ckpt");
  ASSERT_EQ(first.losses.size() + second.losses.size(), whole.losses.size());
  for (size_t i = 0; i < 10; ++i) {
    const double resumed = i < 5 ? first.losses[i] : second.losses[i - 5];
    EXPECT_EQ(resumed, whole.losses[i]) << "step " << i + 1;  // bit for bit
  }
  EXPECT_EQ(second.digest, whole.digest);
  g.barrier();
  if (g.rank() == 0) fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, ResumeTest,
    testing::Values(Case{0, "AdamW"}, Case{1, "AdamW"}, Case{2, "AdamW"}, Case{3, "AdamW"},
                    Case{2, "AdamW", OffloadDevice::kCpu}, Case{3, "AdamW", OffloadDevice::kNvme},
                    Case{1, "Lamb"}, Case{3, "Lamb", OffloadDevice::kCpu}, Case{2, "Lion"}, Case{3, "CAdam"},
                    Case{1, "CAdam", OffloadDevice::kNvme}, Case{0, "OneBitAdam"}, Case{2, "OneBitAdam"},
                    Case{0, "ZeroOneAdam"}, Case{3, "ZeroOneAdam"},
                    // The loss scaler's state; the master kept inside the bf16 parameters.
                    Case{2, "AdamW", OffloadDevice::kNone, Precision::kFp16},
                    Case{1, "AdamW", OffloadDevice::kNone, Precision::kBf16, true},
                    Case{3, "AdamW", OffloadDevice::kNvme, Precision::kBf16},
                    Case{2, "AdamW", OffloadDevice::kCpu, Precision::kFp32, false, true},
                    Case{0, "OneBitAdam", OffloadDevice::kNone, Precision::kFp32, false, true}),
    case_name);

// checkpoint.async: training goes on while the file is written; what is committed is the snapshot
// of the step the save was called at.
TEST(CheckpointAsync, CommitsTheSnapshot) {
  const comm::Group& g = test::world().group();
  if (g.size() > 2) GTEST_SKIP();
  const fs::path dir = shared_dir(g, "async");
  zs::run::RunConfig cfg = make_config(g.size(), 3, "AdamW");
  cfg.checkpoint.async = true;
  std::string at_save;
  {
    nn::GptModel model(*cfg.model);
    Engine engine(model, cfg, g);
    DatasetSource source(nn::Dataset::builtin(cfg.model->seq_len), 7);
    for (int i = 0; i < 3; ++i) engine.train_batch(source);
    EXPECT_EQ(engine.save_checkpoint(dir.string()), "global_step3");
    at_save = engine.param_digest();
    for (int i = 0; i < 2; ++i) engine.train_batch(source);  // overlaps the write
    EXPECT_FALSE(fs::exists(dir / "latest"));                 // not committed yet
    engine.wait_checkpoint();
    EXPECT_TRUE(fs::exists(dir / "global_step3" / "zs_metadata.h5"));
    // A save pending when the engine goes is never committed: `latest` still names step 3.
    engine.save_checkpoint(dir.string());
  }
  nn::GptModel model(*cfg.model);
  Engine engine(model, cfg, g);
  EXPECT_EQ(engine.load_checkpoint(dir.string()), "global_step3");
  EXPECT_EQ(engine.global_step(), 3);
  EXPECT_EQ(engine.param_digest(), at_save);
  g.barrier();
  if (g.rank() == 0) fs::remove_all(dir);
}

// checkpoint.async with keep_last: the tag pruned at a commit is out of sight at once and its files
// are gone once the prune thread is joined (Note [background prune]); the engine reports where the
// save's time went.
TEST(CheckpointAsync, PrunesInTheBackground) {
  const comm::Group& g = test::world().group();
  if (g.size() > 2) GTEST_SKIP();
  const fs::path dir = shared_dir(g, "async_prune");
  zs::run::RunConfig cfg = make_config(g.size(), 1, "AdamW");
  cfg.checkpoint.async = true;
  cfg.checkpoint.keep_last = 1;
  {
    nn::GptModel model(*cfg.model);
    Engine engine(model, cfg, g);
    DatasetSource source(nn::Dataset::builtin(cfg.model->seq_len), 7);
    engine.train_batch(source);
    engine.save_checkpoint(dir.string());
    engine.wait_checkpoint();
    const Engine::AsyncSaveTimes t = engine.last_async_save();
    EXPECT_GT(t.writer_cpu_s, 0);
    EXPECT_GT(t.write_data_s, 0);
    EXPECT_GT(t.commit_s, 0);
    engine.train_batch(source);
    engine.save_checkpoint(dir.string());
    engine.wait_checkpoint();
    g.barrier();
    EXPECT_FALSE(fs::exists(dir / "global_step1"));  // renamed out of sight by the commit
    EXPECT_TRUE(fs::exists(dir / "global_step2" / "zs_metadata.h5"));
  }
  g.barrier();  // every engine gone: rank 0's prune thread joined
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"global_step2", "latest"}));
  g.barrier();
  if (g.rank() == 0) fs::remove_all(dir);
}

// The fp32 parameters of an engine by name (collective).
std::map<std::string, std::vector<float>> all_params(Engine& e, nn::Model& m) {
  std::map<std::string, std::vector<float>> out;
  for (nn::Parameter* p : m.all_params()) out[p->full_name()] = e.fp32_param(p->full_name());
  return out;
}

TEST(Elastic, SavedAtFourRanksStage3ContinuesAnywhere) {
  const comm::Group& world = test::world().group();
  if (world.size() != 4) GTEST_SKIP() << "saves on 4 ranks";
  const fs::path dir = shared_dir(world, "elastic");
  std::map<std::string, std::vector<float>> saved;
  std::string saved_digest;
  {
    const zs::run::RunConfig cfg = make_config(4, 3, "AdamW");
    nn::GptModel model(*cfg.model);
    Engine engine(model, cfg, world);
    DatasetSource source(nn::Dataset::builtin(cfg.model->seq_len), 7);
    for (int i = 0; i < 4; ++i) engine.train_batch(source);
    engine.save_checkpoint(dir.string());
    saved = all_params(engine, model);
    saved_digest = engine.param_digest();
  }
  // Loads and continues 3 steps; compares with 7 uninterrupted steps at the same configuration.
  auto check = [&](const comm::Group& g, int stage, OffloadDevice offload) {
    const std::string what = fmt::format("{} rank(s), stage {}, offload {}", g.size(), stage, offload_device_name(offload));
    const zs::run::RunConfig cfg = make_config(g.size(), stage, "AdamW", offload);
    nn::GptModel model(*cfg.model);
    Engine engine(model, cfg, g);
    DatasetSource source(nn::Dataset::builtin(cfg.model->seq_len), 7);
    engine.load_checkpoint(dir.string());
    EXPECT_EQ(engine.param_digest(), saved_digest) << what;
    EXPECT_EQ(all_params(engine, model), saved) << what;  // bit for bit
    std::vector<double> resumed;
    while (engine.global_step() < 7) resumed.push_back(engine.train_batch(source).loss);
    const auto after = all_params(engine, model);
    nn::GptModel ref_model(*cfg.model);
    Engine ref(ref_model, cfg, g);
    std::vector<double> straight;
    for (int i = 0; i < 7; ++i) straight.push_back(ref.train_batch(source).loss);
    const auto ref_params = all_params(ref, ref_model);
    ASSERT_EQ(resumed.size(), 3u) << what;
    for (size_t i = 0; i < resumed.size(); ++i) {
      EXPECT_NEAR(resumed[i], straight[4 + i], 1e-5 * std::abs(straight[4 + i])) << what << ", step " << 5 + i;
    }
    for (const auto& [name, values] : ref_params) {
      const std::vector<float>& got = after.at(name);
      for (size_t i = 0; i < values.size(); ++i) {
        ASSERT_NEAR(got[i], values[i], 1e-5) << what << ": " << name << "[" << i << "]";
      }
    }
  };
  {
    comm::Group g = world.split(world.rank() == 0 ? 0 : 1, world.rank(), "elastic_a");
    if (world.rank() == 0) check(g, 0, OffloadDevice::kNone);
    else check(g, 2, OffloadDevice::kNone);
  }
  {
    comm::Group g = world.split(world.rank() < 2 ? 0 : 1, world.rank(), "elastic_b");
    if (world.rank() < 2) check(g, 1, OffloadDevice::kCpu);
  }
  world.barrier();
  if (world.rank() == 0) fs::remove_all(dir);
}

// Every rank throws an error of type E whose message contains `text`.
template <typename E, typename F>
void expect_everywhere(const comm::Group& g, F&& fn, const std::string& text) {
  std::string message;
  try {
    fn();
    message = "<no error>";
  } catch (const E& e) {
    message = e.what();
  } catch (const std::exception& e) {
    message = std::string("<other error> ") + e.what();
  }
  EXPECT_NE(message.find(text), std::string::npos) << "rank " << g.rank() << ": " << message;
}

TEST(CheckpointErrors, AgreedOnEveryRank) {
  const comm::Group& g = test::world().group();
  if (g.size() > 2) GTEST_SKIP();
  const fs::path dir = shared_dir(g, "errors");
  const zs::run::RunConfig cfg = make_config(g.size(), 1, "AdamW");
  train(g, cfg, 0, 2, {}, dir / "good");

  // Another model: a parameter of another shape.
  {
    zs::run::RunConfig other = cfg;
    other.model = tiny_gpt(36);
    nn::GptModel model(*other.model);
    Engine engine(model, other, g);
    expect_everywhere<CheckpointError>(g, [&] { engine.load_checkpoint((dir / "good").string()); },
                                       "has shape [256, 33] there but [256, 36] in this model");
  }
  // Another optimizer.
  {
    const zs::run::RunConfig lion = make_config(g.size(), 1, "Lion");
    nn::GptModel model(*lion.model);
    Engine engine(model, lion, g);
    expect_everywhere<CheckpointError>(g, [&] { engine.load_checkpoint((dir / "good").string()); },
                                       "holds AdamW optimizer states, which Lion cannot continue from");
  }
  nn::GptModel model(*cfg.model);
  Engine engine(model, cfg, g);
  // Flipped bytes in the last rank's data: the rank that reads them fails, every rank reports it.
  const int last = g.size() - 1;
  const fs::path shard = dir / "good" / "global_step2" / fmt::format("zs_rank_{:05d}.h5", last);
  if (g.rank() == 0) {
    fs::copy(dir / "good", dir / "corrupt", fs::copy_options::recursive);
    const fs::path bad = dir / "corrupt" / "global_step2" / shard.filename();
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    const auto size = static_cast<std::streamoff>(fs::file_size(bad));
    for (std::streamoff at = size / 3; at < size * 2 / 3; at += 997) {
      f.seekp(at);
      f.put('\x5a');
    }
  }
  g.barrier();
  expect_everywhere<CheckpointError>(g, [&] { engine.load_checkpoint((dir / "corrupt").string()); },
                                     shard.filename().string());
  // A missing rank file.
  if (g.rank() == 0) fs::remove(dir / "corrupt" / "global_step2" / shard.filename());
  g.barrier();
  expect_everywhere<CheckpointError>(g, [&] { engine.load_checkpoint((dir / "corrupt").string()); },
                                     shard.filename().string());
  // No checkpoint at all.
  expect_everywhere<CheckpointError>(g, [&] { engine.load_checkpoint((dir / "none").string()); }, "no 'latest' file");
  // An unwritable directory (a file where the directory should be): the save fails on rank 0, every
  // rank throws.
  if (g.rank() == 0) std::ofstream(dir / "a_file") << "x";
  g.barrier();
  expect_everywhere<Error>(g, [&] { engine.save_checkpoint((dir / "a_file").string()); }, "a_file");
  // The engine still trains and saves after the errors.
  EXPECT_EQ(engine.save_checkpoint((dir / "good").string(), "again"), "again");
  g.barrier();
  if (g.rank() == 0) fs::remove_all(dir);
}

TEST(CheckpointTags, ValidatedAcrossRanksAsDeepSpeed) {
  const comm::Group& g = test::world().group();
  if (g.size() != 2) GTEST_SKIP() << "needs two ranks";
  const fs::path dir = shared_dir(g, "tags");
  zs::run::RunConfig cfg = make_config(2, 1, "AdamW");
  nn::GptModel model(*cfg.model);
  cfg.checkpoint.tag_validation = TagValidation::kFail;
  {
    Engine engine(model, cfg, g);
    expect_everywhere<CheckpointError>(g, [&] { engine.save_checkpoint(dir.string(), fmt::format("t{}", g.rank())); },
                                       "checkpoint tag 't1' on rank 1 differs from rank 0's 't0'");
  }
  cfg.checkpoint.tag_validation = TagValidation::kWarn;  // warns and saves under rank 0's tag
  Engine engine(model, cfg, g);
  EXPECT_EQ(engine.save_checkpoint(dir.string(), fmt::format("t{}", g.rank())), "t0");
  EXPECT_EQ(engine.load_checkpoint(dir.string()), "t0");
  g.barrier();
  if (g.rank() == 0) fs::remove_all(dir);
}

// stage3_gather_16bit_weights_on_model_save: <tag>/zs_model_16bit.h5 holds every parameter whole, by
// name, in the training dtype, equal to the engine's (the master rounded).
TEST(Checkpoint16Bit, WholeParametersByName) {
  const comm::Group& g = test::world().group();
  if (g.size() > 2) GTEST_SKIP();
  const fs::path dir = shared_dir(g, "16bit");
  zs::run::RunConfig cfg = make_config(g.size(), 3, "AdamW");
  cfg.precision = Precision::kBf16;
  cfg.checkpoint.gather_16bit_weights = true;
  nn::GptModel model(*cfg.model);
  Engine engine(model, cfg, g);
  DatasetSource source(nn::Dataset::builtin(cfg.model->seq_len), 7);
  for (int i = 0; i < 2; ++i) engine.train_batch(source);
  engine.save_checkpoint(dir.string());
  const std::vector<float> wte = engine.fp32_param("wte");
  if (g.rank() == 0) {
    namespace h5 = checkpoint::h5;
    const fs::path path = dir / "global_step2" / "zs_model_16bit.h5";
    h5::Handle file = h5::file_open(path);
    EXPECT_EQ(h5::read_attr_string(file.get(), "dtype", path), "bf16");
    h5::Handle ds = h5::dataset_open(file.get(), "wte", path);
    std::vector<uint16_t> bits(wte.size());
    ASSERT_GE(H5Dread(ds.get(), H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, bits.data()), 0);
    std::vector<uint16_t> want(wte.size());
    memory::convert(wte.data(), memory::DType::kF32, want.data(), memory::DType::kBF16, wte.size());
    EXPECT_EQ(bits, want);
  }
  g.barrier();
  if (g.rank() == 0) fs::remove_all(dir);
}

// A one-bit Adam checkpoint (saved in its compressed phase) continues in AdamW: the moments map by
// name, the error feedback is dropped.
TEST(CheckpointOptimizers, OneBitAdamIntoAdam) {
  const comm::Group& g = test::world().group();
  if (g.size() > 2) GTEST_SKIP();
  const fs::path dir = shared_dir(g, "onebit_adam");
  const RunResult saved = train(g, make_config(g.size(), 1, "OneBitAdam"), 0, 5, {}, dir);
  const zs::run::RunConfig adam = make_config(g.size(), 2, "AdamW");
  nn::GptModel model(*adam.model);
  Engine engine(model, adam, g);
  engine.load_checkpoint(dir.string());
  EXPECT_EQ(engine.param_digest(), saved.digest);
  DatasetSource source(nn::Dataset::builtin(adam.model->seq_len), 7);
  const double loss = engine.train_batch(source).loss;
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_EQ(engine.global_step(), 6);
  g.barrier();
  if (g.rank() == 0) fs::remove_all(dir);
}

// optimizer.params.compression_scale changed between save and load at the same world size: the error
// feedback of the other scale mode, of another length (per-tensor padding against the flat buffer's
// blocks), restarts at zero instead of failing the load or reading a prefix, as at a new world size;
// the moments load by name. Saved per tensor, loaded with blocks: the block mode's buffers are longer.
TEST(CheckpointOptimizers, OneBitAdamResumesWithAnotherCompressionScale) {
  const comm::Group& g = test::world().group();
  if (g.size() > 2) GTEST_SKIP();
  const fs::path dir = shared_dir(g, "onebit_scale");
  zs::run::RunConfig tensor = make_config(g.size(), 1, "OneBitAdam");
  tensor.optimizer.params<optim::OneBitAdamConfig>().compression_scale = optim::CompressionScale::kTensor;
  const RunResult saved = train(g, tensor, 0, 5, {}, dir);
  const zs::run::RunConfig block = make_config(g.size(), 1, "OneBitAdam");
  nn::GptModel model(*block.model);
  Engine engine(model, block, g);
  engine.load_checkpoint(dir.string());
  EXPECT_EQ(engine.param_digest(), saved.digest);
  DatasetSource source(nn::Dataset::builtin(block.model->seq_len), 7);
  const StepReport r = engine.train_batch(source);
  EXPECT_TRUE(std::isfinite(r.loss));
  EXPECT_TRUE(r.compressed);
  EXPECT_EQ(engine.global_step(), 6);
  g.barrier();
  if (g.rank() == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace zs::engine
