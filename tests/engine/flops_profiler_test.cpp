// The flops profiler (engine/flops_profiler.h): FLOPs counted exactly per module (each Linear's
// 2*N*in*out forward and 4*N*in*out backward, a parent's figures its children's plus its own
// products), only the profiled step recorded, the report's three parts and their options, and the
// engine's own profile of a training step through the config (figures equal to the same model's
// passes run by hand).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "comm/world.h"
#include "core/errors.h"
#include "core/json.h"
#include "engine/config.h"
#include "engine/dataset_source.h"
#include "engine/engine.h"
#include "engine/flops_profiler.h"
#include "nn/data.h"
#include "nn/flops.h"
#include "nn/gpt.h"
#include "nn/host_context.h"
#include "nn/module.h"
#include "run/run_config.h"

namespace zs::engine {
namespace {

namespace fs = std::filesystem;

constexpr nn::GptConfig kGpt{.n_layer = 2, .d_model = 32, .n_head = 2, .seq_len = 16, .vocab_size = 256};
constexpr int64_t kMicroBatch = 4;

zs::run::RunConfig parse(const std::string& text) { return zs::run::parse_run_config(parse_json_text(text), 1); }

// A host context that reports every module boundary to a profiler, as the engine's does.
class ProfilingContext final : public nn::HostContext {
 public:
  explicit ProfilingContext(FlopsProfiler& p) : profiler_(p) {}

 protected:
  void before_forward(nn::Module& m) override { profiler_.enter(m); }
  void after_forward(nn::Module& m) override { profiler_.leave(m, FlopsProfiler::Pass::kForward); }
  void before_backward(nn::Module& m) override { profiler_.enter(m); }
  void after_backward(nn::Module& m) override { profiler_.leave(m, FlopsProfiler::Pass::kBackward); }

 private:
  FlopsProfiler& profiler_;
};

nn::Batch batch_of(int64_t rows, uint64_t step) {
  nn::Batch b;
  nn::Dataset::builtin(kGpt.seq_len).fill_batch(b, 1, step, 0, rows);
  return b;
}

// One forward/backward of the GPT under the profiler, as profiled step 1.
struct Profiled {
  nn::GptModel model{kGpt};
  FlopsProfiler profiler;
  explicit Profiled(FlopsProfilerConfig c = {.enabled = true}, memory::DType dtype = memory::DType::kF32) : profiler(c) {
    nn::materialize(model, 3, dtype);
    ProfilingContext ctx(profiler);
    profiler.window_started(1);
    EXPECT_TRUE(profiler.recording());
    ctx.forward_loss(model, batch_of(kMicroBatch, 0));
    ctx.backward_loss(model, 1.0f);
    EXPECT_TRUE(profiler.window_finished());
  }
};

class FlopsProfilerDtype : public ::testing::TestWithParam<memory::DType> {};

// In bf16 too: on a CPU with AVX512-BF16 the products take the bf16 kernel (nn/detail/gemm.h), which
// counts itself like the sgemm path.
TEST_P(FlopsProfilerDtype, LinearFlopsAreExact) {
  Profiled p({.enabled = true}, GetParam());
  const uint64_t n = kMicroBatch * kGpt.seq_len;  // rows through every Linear
  int linears = 0;
  for (nn::Module* m : p.model.named_modules()) {
    if (m->type_name() != "Linear") continue;
    ++linears;
    const nn::Parameter& w = *m->params().front();  // (out, in)
    const uint64_t mn = n * static_cast<uint64_t>(w.shape()[0]) * static_cast<uint64_t>(w.shape()[1]);
    const FlopsProfiler::ModuleStats s = p.profiler.stats(*m);
    EXPECT_EQ(s.forward_flops, 2 * mn) << m->name();
    EXPECT_EQ(s.backward_flops, 4 * mn) << m->name();  // dX = dY W and dW += dY^T X
    EXPECT_EQ(s.forward_calls, 1) << m->name();
    EXPECT_GT(s.forward_s, 0.0) << m->name();
  }
  EXPECT_EQ(linears, 4 * kGpt.n_layer);  // qkv, attention proj, fc, mlp proj
}
INSTANTIATE_TEST_SUITE_P(Dtypes, FlopsProfilerDtype, ::testing::Values(memory::DType::kF32, memory::DType::kBF16));

TEST(FlopsProfiler, ParentsIncludeTheirChildren) {
  Profiled p;
  for (nn::Module* m : p.model.named_modules()) {
    const FlopsProfiler::ModuleStats s = p.profiler.stats(*m);
    uint64_t fwd = 0, bwd = 0;
    for (nn::Module* c : m->children()) {
      fwd += p.profiler.stats(*c).forward_flops;
      bwd += p.profiler.stats(*c).backward_flops;
    }
    if (m->children().empty()) continue;
    if (m->type_name() == "CausalSelfAttention") {
      // Its own score and value products come on top of qkv and proj.
      EXPECT_GT(s.forward_flops, fwd);
      EXPECT_GT(s.backward_flops, bwd);
    } else if (m == &p.model) {
      // The tied lm head is the root's own product: logits = x wte^T (N x C x V), and twice that back.
      const uint64_t head = 2ull * kMicroBatch * kGpt.seq_len * kGpt.d_model * kGpt.vocab_size;
      EXPECT_EQ(s.forward_flops, fwd + head);
      EXPECT_EQ(s.backward_flops, bwd + 2 * head);
    } else {
      EXPECT_EQ(s.forward_flops, fwd) << m->display_name();  // blocks, MLPs: only their children multiply
      EXPECT_EQ(s.backward_flops, bwd) << m->display_name();
    }
  }
}

TEST(FlopsProfiler, RecordsOnlyTheProfiledStep) {
  FlopsProfiler p({.enabled = true, .profile_step = 2});
  nn::GptModel model(kGpt);
  p.window_started(0);
  EXPECT_FALSE(p.recording());
  EXPECT_FALSE(p.window_finished());
  p.window_started(2);
  EXPECT_TRUE(p.recording());
  p.enter(model);
  nn::add_flops(1000);
  p.leave(model, FlopsProfiler::Pass::kForward);
  EXPECT_TRUE(p.window_finished());
  EXPECT_EQ(p.stats(model).forward_flops, 1000u);
  p.window_started(2);  // a step counted twice (never in the engine) does not profile again
  EXPECT_FALSE(p.recording());
  p.window_started(3);
  EXPECT_FALSE(p.recording());
}

TEST(FlopsProfiler, ReportLayoutAndOptions) {
  const ProfiledRun run{.world_size = 1, .micro_batch = kMicroBatch, .accumulation = 1, .step_latency_s = 1e-3,
                        .iter_latency_s = 0.05};
  {
    Profiled p;
    const std::string r = p.profiler.report(p.model, run);
    EXPECT_NE(r.find("Profile summary at step 1"), std::string::npos) << r;
    EXPECT_NE(r.find("batch size per rank:"), std::string::npos);
    EXPECT_NE(r.find("fwd MACs per rank:"), std::string::npos);
    EXPECT_NE(r.find("samples/second:                                               80.00"), std::string::npos) << r;
    EXPECT_NE(r.find("Aggregated Profile per rank"), std::string::npos);
    EXPECT_NE(r.find("depth 3:"), std::string::npos) << r;  // Gpt > Sequential > Block > attention and MLP
    EXPECT_NE(r.find("Detailed Profile per rank"), std::string::npos);
    EXPECT_NE(r.find("Gpt(\n  "), std::string::npos) << r;
    EXPECT_NE(r.find("    (0): Block(\n"), std::string::npos) << r;
    EXPECT_NE(r.find("        (qkv): Linear("), std::string::npos) << r;
  }
  {
    Profiled p({.enabled = true, .module_depth = 1, .top_modules = 2, .detailed = true});
    const std::string r = p.profiler.report(p.model, run);
    EXPECT_EQ(r.find("depth 2:"), std::string::npos) << r;
    EXPECT_EQ(r.find("(0): Block"), std::string::npos) << r;  // depth 2 is below module_depth
    EXPECT_NE(r.find("  (blocks): Sequential("), std::string::npos) << r;  // printed as a leaf at depth 1
    // Two types at depth 1 (the blocks' Sequential, ln_f's LayerNorm; the embeddings are the root's own).
    const size_t params = r.find("params      - {'Sequential': ");
    ASSERT_NE(params, std::string::npos) << r;
    EXPECT_NE(r.substr(params, r.find('\n', params) - params).find("', 'LayerNorm': '64'"), std::string::npos) << r;
  }
  {
    Profiled p({.enabled = true, .detailed = false});
    EXPECT_EQ(p.profiler.report(p.model, run).find("Detailed Profile"), std::string::npos);
  }
}

TEST(FlopsProfiler, ConfigKeys) {
  const zs::run::RunConfig c = parse(R"({"train_batch_size": 4, "flops_profiler": {"enabled": true,
      "profile_step": 3, "module_depth": 2, "top_modules": 4, "detailed": false, "output_file": null,
      "recompute_fwd_factor": 0.5}})");
  EXPECT_TRUE(c.monitor.flops.enabled);
  EXPECT_EQ(c.monitor.flops.profile_step, 3);
  EXPECT_EQ(c.monitor.flops.module_depth, 2);
  EXPECT_EQ(c.monitor.flops.top_modules, 4);
  EXPECT_FALSE(c.monitor.flops.detailed);
  EXPECT_EQ(c.monitor.flops.output_file, "");
  bool noted = false;
  for (const std::string& n : c.notes) noted |= n.find("flops_profiler.recompute_fwd_factor") != std::string::npos;
  EXPECT_TRUE(noted);
  try {
    parse(R"({"train_batch_size": 4, "flops_profiler": {"enabled": true, "top_modules": 0}})");
    FAIL() << "top_modules 0 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("flops_profiler.top_modules"), std::string::npos) << e.what();
  }
}

// Through the engine: the config turns it on, step 1 (the second) is profiled on rank 0, and the
// figures are the hand-run passes' times the micro-batches of the step.
TEST(FlopsProfiler, EngineProfilesTheConfiguredStep) {
  const fs::path out = fs::temp_directory_path() / fmt::format("zs_flops_profile_{}.txt", getpid());
  fs::remove(out);
  zs::run::RunConfig cfg = parse(fmt::format(R"({{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
      "device": {{"memory_mb": 64}}, "flops_profiler": {{"enabled": true, "profile_step": 1, "output_file": "{}"}}}})",
                                       out.string()));
  cfg.model = kGpt;
  nn::GptModel model(kGpt);
  comm::World world(comm::World::Launch::kLocal);
  Engine engine(model, cfg, world.group());
  DatasetSource data(nn::Dataset::builtin(kGpt.seq_len), 1);
  engine.train_batch(data);
  ASSERT_TRUE(fs::exists(out));  // made when the engine starts: an unwritable path fails before training
  EXPECT_EQ(fs::file_size(out), 0u);  // step 0 is not the profiled one
  engine.train_batch(data);
  std::stringstream text;
  text << std::ifstream(out).rdbuf();
  const std::string r = text.str();
  EXPECT_NE(r.find("Profile summary at step 1"), std::string::npos) << r;
  EXPECT_NE(r.find("batch size per rank:                                          8 (micro-batch 4 x 2 accumulation steps)"),
            std::string::npos)
      << r;

  Profiled by_hand;  // one micro-batch of the same shape: the engine's step runs two
  const FlopsProfiler::ModuleStats s = by_hand.profiler.stats(by_hand.model);
  const ProfiledRun run{.micro_batch = kMicroBatch, .accumulation = 2};
  const std::string expected = by_hand.profiler.report(by_hand.model, run);
  auto value_of = [](const std::string& report, const std::string& label) {
    const size_t at = report.find(label);
    EXPECT_NE(at, std::string::npos) << label;
    return report.substr(at, report.find('\n', at) - at);
  };
  // Twice the hand-run figure, formatted by the same rule.
  FlopsProfiler twice({.enabled = true});
  nn::GptModel shape_only(kGpt);
  twice.window_started(1);
  twice.enter(shape_only);
  nn::add_flops(2 * s.forward_flops);
  twice.leave(shape_only, FlopsProfiler::Pass::kForward);
  twice.enter(shape_only);
  nn::add_flops(2 * s.backward_flops);
  twice.leave(shape_only, FlopsProfiler::Pass::kBackward);
  twice.window_finished();
  const std::string doubled = twice.report(shape_only, run);
  EXPECT_EQ(value_of(r, "fwd flops per rank:"), value_of(doubled, "fwd flops per rank:"));
  EXPECT_EQ(value_of(r, "bwd flops per rank:"), value_of(doubled, "bwd flops per rank:"));
  EXPECT_EQ(value_of(r, "params of model:"), value_of(expected, "params of model:"));
  fs::remove(out);
}

}  // namespace
}  // namespace zs::engine
