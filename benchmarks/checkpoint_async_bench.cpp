// Question: what does saving a checkpoint cost a training run, synchronously and with
// checkpoint.async (snapshot to host memory, file written on a background thread)? Reports the mean
// wall time per optimizer step (train_batch plus the save call where one falls) of three runs of the
// same model in the same process: no saves (the baseline), a synchronous save every --every steps,
// an asynchronous one; ratios to the baseline.
//
//   build/release/benchmarks/checkpoint_async_bench [--json out.json] [--dir DIR] [--steps 24] [--every 4]
//          [--n-layer 4] [--d-model 256] [--n-head 4] [--seq-len 64] [--micro-batch 8] [--memory-mb 2048]
//
// Method: one rank, fp32, ZeRO stage 0, AdamW (3 x 4 bytes of states per parameter saved: fp32,
// exp_avg, exp_avg_sq). Two warm-up steps, then --steps timed steps; the async run's last save is
// committed (Engine::wait_checkpoint) inside the timed region, so no write is left unpaid. The
// checkpoint directory (--dir, default ./checkpoint_async_bench.ckpt) is removed afterwards.
#include <filesystem>
#include <string>
#include <vector>

#include "benchmarks/support/bench_args.h"
#include "benchmarks/support/bench_json.h"
#include "comm/comm.h"
#include "core/log.h"
#include "engine/config.h"
#include "engine/dataset_source.h"
#include "engine/engine.h"
#include "nn/data.h"
#include "nn/gpt.h"

using namespace zs;

namespace {

enum class Mode { kNone, kSync, kAsync };

double run(const comm::Group& group, engine::EngineConfig cfg, Mode mode, int64_t steps, int64_t every,
           const std::string& dir) {
  cfg.checkpoint.async = mode == Mode::kAsync;
  nn::GptModel model(*cfg.model);
  engine::Engine engine(model, cfg, group);
  engine::DatasetSource source(nn::Dataset::builtin(cfg.model->seq_len), 7);
  for (int i = 0; i < 2; ++i) engine.train_batch(source);
  const double t0 = bench::now_seconds();
  for (int64_t i = 1; i <= steps; ++i) {
    engine.train_batch(source);
    if (mode != Mode::kNone && i % every == 0) engine.save_checkpoint(dir);
  }
  engine.wait_checkpoint();
  const double per_step = (bench::now_seconds() - t0) / static_cast<double>(steps);
  std::filesystem::remove_all(dir);
  return per_step;
}

}  // namespace

int main(int argc, char** argv) {
  init_logging({0, 1}, LogConfig{.level = "warn"});
  auto world = comm::World::create();
  const int64_t steps = bench::int_arg(argc, argv, "--steps", 24);
  const int64_t every = bench::int_arg(argc, argv, "--every", 4);
  const std::string dir = bench::arg_value(argc, argv, "--dir", "checkpoint_async_bench.ckpt");
  engine::EngineConfig cfg;
  cfg.model = bench::gpt_config_arg(argc, argv, {.n_layer = 4, .d_model = 256, .n_head = 4, .seq_len = 64, .vocab_size = 256});
  const int64_t micro = bench::int_arg(argc, argv, "--micro-batch", 8);
  cfg.batch = engine::resolve_batch(0, micro, 1, 1);
  cfg.optimizer = engine::OptimizerConfig("AdamW");
  cfg.device.memory_mb = bench::int_arg(argc, argv, "--memory-mb", 2048);
  const double none = run(world.group(), cfg, Mode::kNone, steps, every, dir);
  const double sync = run(world.group(), cfg, Mode::kSync, steps, every, dir);
  const double async = run(world.group(), cfg, Mode::kAsync, steps, every, dir);
  nn::GptModel probe(*cfg.model);
  int64_t params = 0;
  probe.visit_params([&](nn::Parameter& p) { params += memory::shape_numel(p.shape()); });
  std::printf("checkpoint_async_bench: %lld parameters (%.1f MiB saved per checkpoint), a save every %lld of %lld steps\n",
              static_cast<long long>(params), 12.0 * static_cast<double>(params) / (1 << 20),
              static_cast<long long>(every), static_cast<long long>(steps));
  std::printf("  no saves      %8.4f s/step\n  sync saves    %8.4f s/step  %.3fx\n  async saves   %8.4f s/step  %.3fx\n",
              none, sync, sync / none, async, async / none);
  bench::Report r;
  r.benchmark = "checkpoint_async_bench";
  r.config = {{"params", params}, {"steps", steps}, {"every", every}, {"n_layer", cfg.model->n_layer},
              {"d_model", cfg.model->d_model}, {"micro_batch", micro}};
  r.results = {boost::json::object{{"mode", "sync"}, {"step_s", sync}},
               boost::json::object{{"mode", "async"}, {"step_s", async}}};
  r.baseline = {{"mode", "no saves"}, {"step_s", none}};
  r.ratio = boost::json::object{{"sync", sync / none}, {"async", async / none}};
  const std::string json = bench::json_path_arg(argc, argv);
  if (!json.empty()) r.write(json);
  return 0;
}
