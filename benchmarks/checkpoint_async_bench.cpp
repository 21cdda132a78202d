// Question: what does saving a checkpoint cost a training run, synchronously and with
// checkpoint.async (snapshot to host memory, file written on a background thread at SCHED_IDLE)?
// Reports the mean wall time per optimizer step (train_batch plus the save call where one falls) of
// three engines of the same model in the same process: no saves (the baseline), a synchronous save
// every --every steps, an asynchronous one; ratios to the baseline (of the sums, and the median over
// rounds of each round's ratio). Also, per save, the time in the save call (sync: the whole save;
// async: the snapshot and the setup; the first async one apart, as it maps the snapshot's memory
// that later saves reuse), in the commit's wait, and in the steps alone.
//
//   build/release/benchmarks/checkpoint_async_bench [--json out.json] [--dir DIR] [--rounds 6] [--every 4]
//          [--n-layer 4] [--d-model 256] [--n-head 4] [--seq-len 64] [--micro-batch 8] [--memory-mb 1024]
//
// Method: one rank, fp32, ZeRO stage 0, AdamW (3 x 4 bytes of states per parameter saved: fp32,
// exp_avg, exp_avg_sq). Two warm-up steps per engine, then --rounds rounds; in each, every engine runs
// one timed segment: its save (none, sync or async), then --every steps, then (async) its commit
// (Engine::wait_checkpoint), so each async write overlaps only its own engine's steps and no write
// is left unpaid. The engines take turns, the first one rotating each round, so a drift in the
// machine's load falls on all three alike (one engine after another, the first run also paid the
// process's warm-up). Saves go to DIR/sync and DIR/async (keep_last 2; default
// ./checkpoint_async_bench.ckpt), removed afterwards.
#include <filesystem>
#include <memory>
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

// One engine of the comparison and the time its segments took.
struct Runner {
  Mode mode;
  std::string dir;
  nn::GptModel model;
  engine::Engine engine;
  engine::DatasetSource source;
  double seconds = 0;
  double save_s = 0;    // in save_checkpoint (sync: the whole save; async: snapshot and setup)
  double first_save_s = 0;  // the first of them (async: it also maps the snapshot's memory)
  double steps_s = 0;   // in the training steps alone
  double commit_s = 0;  // in wait_checkpoint (async: waiting for the writer, then the commit)
  std::vector<double> segments;  // each round's segment, seconds

  Runner(const comm::Group& group, engine::EngineConfig cfg, Mode m, std::string d)
      : mode(m), dir(std::move(d)), model(*cfg.model), engine(model, with_mode(std::move(cfg), m), group),
        source(nn::Dataset::builtin(model.config().seq_len), 7) {}

  static engine::EngineConfig with_mode(engine::EngineConfig cfg, Mode m) {
    cfg.checkpoint.async = m == Mode::kAsync;
    cfg.checkpoint.keep_last = 2;
    return cfg;
  }

  void segment(int64_t steps) {
    const double t0 = bench::now_seconds();
    if (mode != Mode::kNone) engine.save_checkpoint(dir);
    const double t1 = bench::now_seconds();
    for (int64_t i = 0; i < steps; ++i) engine.train_batch(source);
    const double t2 = bench::now_seconds();
    engine.wait_checkpoint();
    const double t3 = bench::now_seconds();
    seconds += t3 - t0;
    segments.push_back(t3 - t0);
    if (save_s == 0) first_save_s = t1 - t0;
    save_s += t1 - t0;
    steps_s += t2 - t1;
    commit_s += t3 - t2;
  }
};

}  // namespace

int main(int argc, char** argv) {
  init_logging({0, 1}, LogConfig{.level = "warn"});
  auto world = comm::World::create();
  const int64_t rounds = bench::int_arg(argc, argv, "--rounds", 6);
  const int64_t every = bench::int_arg(argc, argv, "--every", 4);
  const int64_t steps = rounds * every;
  const std::string dir = bench::arg_value(argc, argv, "--dir", "checkpoint_async_bench.ckpt");
  engine::EngineConfig cfg;
  cfg.model = bench::gpt_config_arg(argc, argv, {.n_layer = 4, .d_model = 256, .n_head = 4, .seq_len = 64, .vocab_size = 256});
  const int64_t micro = bench::int_arg(argc, argv, "--micro-batch", 8);
  cfg.batch = engine::resolve_batch(0, micro, 1, 1);
  cfg.optimizer = engine::OptimizerConfig("AdamW");
  cfg.device.memory_mb = bench::int_arg(argc, argv, "--memory-mb", 1024);
  std::vector<std::unique_ptr<Runner>> runners;
  runners.push_back(std::make_unique<Runner>(world.group(), cfg, Mode::kNone, dir + "/none"));
  runners.push_back(std::make_unique<Runner>(world.group(), cfg, Mode::kSync, dir + "/sync"));
  runners.push_back(std::make_unique<Runner>(world.group(), cfg, Mode::kAsync, dir + "/async"));
  for (auto& r : runners) {
    for (int i = 0; i < 2; ++i) r->engine.train_batch(r->source);
  }
  for (int64_t round = 0; round < rounds; ++round) {
    for (size_t k = 0; k < runners.size(); ++k) runners[(k + static_cast<size_t>(round)) % runners.size()]->segment(every);
  }
  std::filesystem::remove_all(dir);
  const double none = runners[0]->seconds / static_cast<double>(steps);
  const double sync = runners[1]->seconds / static_cast<double>(steps);
  const double async = runners[2]->seconds / static_cast<double>(steps);
  // Per round, each engine's segment over the baseline's of the same round, and their median: a
  // burst of other work on the machine falls on one round's segments, not on the whole figure.
  auto round_median = [&](const Runner& r) {
    std::vector<double> ratios;
    for (size_t i = 0; i < r.segments.size(); ++i) ratios.push_back(r.segments[i] / runners[0]->segments[i]);
    return bench::median(ratios);
  };
  const double sync_median = round_median(*runners[1]);
  const double async_median = round_median(*runners[2]);
  nn::GptModel probe(*cfg.model);
  int64_t params = 0;
  probe.visit_params([&](nn::Parameter& p) { params += memory::shape_numel(p.shape()); });
  std::printf("checkpoint_async_bench: %lld parameters (%.1f MiB saved per checkpoint), a save every %lld of %lld steps\n",
              static_cast<long long>(params), 12.0 * static_cast<double>(params) / (1 << 20),
              static_cast<long long>(every), static_cast<long long>(steps));
  std::printf("  no saves      %8.4f s/step\n  sync saves    %8.4f s/step  %.3fx (median of rounds %.3fx)\n"
              "  async saves   %8.4f s/step  %.3fx (median of rounds %.3fx)\n",
              none, sync, sync / none, sync_median, async, async / none, async_median);
  std::printf("  per save: sync save call %.4f s; async save call %.4f s (the first %.4f s), commit wait %.4f s\n",
              runners[1]->save_s / static_cast<double>(rounds), runners[2]->save_s / static_cast<double>(rounds),
              runners[2]->first_save_s, runners[2]->commit_s / static_cast<double>(rounds));
  // Whether the steps themselves slow down while a write is under way (the writer's CPU, the kernel's
  // writeback of its dirty pages), apart from the save call and the commit.
  const double k = static_cast<double>(steps);
  std::printf("  steps alone: no saves %.4f s/step, sync %.4f, async %.4f\n", runners[0]->steps_s / k,
              runners[1]->steps_s / k, runners[2]->steps_s / k);
  bench::Report r;
  r.benchmark = "checkpoint_async_bench";
  r.config = {{"params", params}, {"steps", steps}, {"rounds", rounds}, {"every", every}, {"n_layer", cfg.model->n_layer},
              {"d_model", cfg.model->d_model}, {"micro_batch", micro}};
  const double n = static_cast<double>(rounds);
  r.results = {boost::json::object{{"mode", "sync"}, {"step_s", sync}, {"save_call_s", runners[1]->save_s / n},
                                   {"steps_only_s", runners[1]->steps_s / k}},
               boost::json::object{{"mode", "async"}, {"step_s", async}, {"save_call_s", runners[2]->save_s / n},
                                   {"first_save_call_s", runners[2]->first_save_s},
                                   {"commit_wait_s", runners[2]->commit_s / n},
                                   {"steps_only_s", runners[2]->steps_s / k}}};
  r.baseline = {{"mode", "no saves"}, {"step_s", none}, {"steps_only_s", runners[0]->steps_s / k}};
  r.ratio = boost::json::object{{"sync", sync / none}, {"async", async / none}, {"sync_round_median", sync_median},
                                {"async_round_median", async_median}};
  const std::string json = bench::json_path_arg(argc, argv);
  if (!json.empty()) r.write(json);
  return 0;
}
