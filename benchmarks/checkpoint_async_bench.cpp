// Question: what does saving a checkpoint cost a training run, synchronously and with
// checkpoint.async (snapshot to host memory, file written on a background thread)? The target's
// figure: the wall time per optimizer step (train_batch plus the save call and the commit where one
// falls) with a save every --every steps over the same without saves, as the median over rounds of
// each round's paired ratio (with its 10th-90th percentile spread) and as the ratio of the sums.
// Beside it, figures a loaded machine moves less: the CPU seconds a save costs (the writer thread's,
// and the training thread's in the save call and the commit), per save and per step, against the
// process's CPU seconds per step without saves; the process's CPU per step of each engine as paired
// ratios; where the writer's wall time went (create, data, close + fsync) and how long the commit
// waited for it; and the steps alone (without the save call and the commit), paired, to show whether
// the steps slow down while the writer runs.
//
//   build/release/benchmarks/checkpoint_async_bench [--json out.json] [--dir DIR] [--rounds 12] [--every 4]
//          [--n-layer 4] [--d-model 256] [--n-head 4] [--seq-len 64] [--micro-batch 8] [--memory-mb 1024]
//
// Method: one rank, fp32, ZeRO stage 0, AdamW (3 x 4 bytes of states per parameter saved: fp32,
// exp_avg, exp_avg_sq). Two warm-up steps per engine, then --rounds rounds; in each, every engine runs
// one timed segment: its save (none, sync or async), then --every steps, then its commit
// (Engine::wait_checkpoint), so each async write overlaps only its own engine's steps and no write
// is left unpaid. The engines take turns interval by interval, the first one rotating each round, so
// a drift in the machine's load falls on all three alike and each round's ratio compares segments
// seconds apart. Saves go to DIR/sync and DIR/async (keep_last 2; default
// ./checkpoint_async_bench.ckpt), removed afterwards.
#include <time.h>

#include <algorithm>
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
#include "run/run_config.h"

using namespace zs;

namespace {

enum class Mode { kNone, kSync, kAsync };

double process_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The q-quantile (0..1) of `v`, nearest rank.
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

// One engine of the comparison and its segments.
struct Runner {
  struct Segment {
    double wall = 0, steps = 0, cpu = 0;  // the segment; its steps alone; the process's CPU seconds
    double steps_cpu = 0;  // the process's CPU seconds in the steps alone, less the writer's (async)
    double save_call = 0, save_call_cpu = 0, commit = 0;  // the training thread's, wall and CPU
    engine::Engine::AsyncSaveTimes async;  // async: the engine's account of this save
  };
  Mode mode;
  std::string dir;
  nn::GptModel model;
  engine::Engine engine;
  engine::DatasetSource source;
  std::vector<Segment> segments;  // one per round

  Runner(const comm::Group& group, zs::run::RunConfig cfg, Mode m, std::string d)
      : mode(m), dir(std::move(d)), model(*cfg.model), engine(model, with_mode(std::move(cfg), m), group),
        source(nn::Dataset::builtin(model.config().seq_len), 7) {}

  static zs::run::RunConfig with_mode(zs::run::RunConfig cfg, Mode m) {
    cfg.checkpoint.async = m == Mode::kAsync;
    cfg.checkpoint.keep_last = 2;
    return cfg;
  }

  void segment(int64_t steps) {
    Segment s;
    const double c0 = process_cpu_seconds(), tc0 = thread_cpu_seconds();
    const double t0 = bench::now_seconds();
    if (mode != Mode::kNone) engine.save_checkpoint(dir);
    const double t1 = bench::now_seconds(), tc1 = thread_cpu_seconds(), c1 = process_cpu_seconds();
    for (int64_t i = 0; i < steps; ++i) engine.train_batch(source);
    const double t2 = bench::now_seconds(), c2 = process_cpu_seconds();
    engine.wait_checkpoint();
    const double t3 = bench::now_seconds();
    s.cpu = process_cpu_seconds() - c0;
    s.wall = t3 - t0, s.steps = t2 - t1, s.save_call = t1 - t0, s.save_call_cpu = tc1 - tc0, s.commit = t3 - t2;
    s.steps_cpu = c2 - c1;
    if (mode == Mode::kAsync) {
      s.async = engine.last_async_save();
      // The writer ran in the steps, bar its close and fsync when the commit waited for it.
      s.steps_cpu -= s.async.writer_cpu_s;
    }
    segments.push_back(s);
  }

  // The mean over segments (all, or without the first: the first async save maps the snapshot).
  template <class F>
  double mean(F&& f, size_t from = 0) const {
    double sum = 0;
    for (size_t i = from; i < segments.size(); ++i) sum += f(segments[i]);
    return segments.size() > from ? sum / static_cast<double>(segments.size() - from) : 0;
  }
};

// Each round's ratio of `f` of `r`'s segment over the baseline's: median and 10th-90th percentile.
template <class F>
boost::json::object paired(const Runner& r, const Runner& base, F&& f) {
  std::vector<double> v;
  for (size_t i = 0; i < r.segments.size(); ++i) v.push_back(f(r.segments[i]) / f(base.segments[i]));
  return {{"median", quantile(v, 0.5)}, {"p10", quantile(v, 0.1)}, {"p90", quantile(v, 0.9)}};
}

double num(const boost::json::object& o, const char* key) { return o.at(key).as_double(); }

}  // namespace

int main(int argc, char** argv) {
  init_logging({0, 1}, LogConfig{.level = "warn"});
  auto world = comm::World::create();
  const int64_t rounds = bench::int_arg(argc, argv, "--rounds", 12);
  const int64_t every = bench::int_arg(argc, argv, "--every", 4);
  const int64_t steps = rounds * every;
  const std::string dir = bench::arg_value(argc, argv, "--dir", "checkpoint_async_bench.ckpt");
  zs::run::RunConfig cfg;
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
  const Runner& base = *runners[0];
  const Runner& sync = *runners[1];
  const Runner& async = *runners[2];
  const double k = static_cast<double>(every);
  auto wall = [](const Runner::Segment& s) { return s.wall; };
  auto steps_only = [](const Runner::Segment& s) { return s.steps; };
  auto cpu = [](const Runner::Segment& s) { return s.cpu; };
  auto steps_cpu = [](const Runner::Segment& s) { return s.steps_cpu; };
  const boost::json::object sync_steps_cpu = paired(sync, base, steps_cpu), async_steps_cpu = paired(async, base, steps_cpu);
  const double none_step = base.mean(wall) / k;
  const double sync_step = sync.mean(wall) / k;
  const double async_step = async.mean(wall) / k;
  const boost::json::object sync_wall = paired(sync, base, wall), async_wall = paired(async, base, wall);
  const boost::json::object sync_steps = paired(sync, base, steps_only), async_steps = paired(async, base, steps_only);
  const boost::json::object sync_cpu = paired(sync, base, cpu), async_cpu = paired(async, base, cpu);
  // The async save's cost in CPU seconds, per save (after the first, which maps the snapshot).
  using T = engine::Engine::AsyncSaveTimes;
  auto at = [&](double T::*field) { return async.mean([&](const Runner::Segment& s) { return s.async.*field; }, 1); };
  const double writer_cpu = at(&T::writer_cpu_s);
  const double call_cpu = at(&T::save_call_cpu_s);
  const double commit_cpu = at(&T::commit_cpu_s);
  const double save_cpu = writer_cpu + call_cpu + commit_cpu;
  const double base_cpu_step = base.mean(cpu) / k;
  nn::GptModel probe(*cfg.model);
  int64_t params = 0;
  probe.visit_params([&](nn::Parameter& p) { params += memory::shape_numel(p.shape()); });
  std::printf("checkpoint_async_bench: %lld parameters (%.1f MiB saved per checkpoint), a save every %lld steps, %lld rounds\n",
              static_cast<long long>(params), 12.0 * static_cast<double>(params) / (1 << 20),
              static_cast<long long>(every), static_cast<long long>(rounds));
  auto line = [](const char* name, double step, double sums, const boost::json::object& w) {
    std::printf("  %-12s %8.4f s/step  %.3fx of sums; paired rounds median %.3fx (p10-p90 %.3f-%.3f)\n", name, step, sums,
                num(w, "median"), num(w, "p10"), num(w, "p90"));
  };
  std::printf("  no saves     %8.4f s/step, %.4f CPU s/step (process)\n", none_step, base_cpu_step);
  line("sync saves", sync_step, sync_step / none_step, sync_wall);
  line("async saves", async_step, async_step / none_step, async_wall);
  std::printf("  process CPU per segment, paired median: sync %.3fx (p10-p90 %.3f-%.3f), async %.3fx (%.3f-%.3f)\n",
              num(sync_cpu, "median"), num(sync_cpu, "p10"), num(sync_cpu, "p90"), num(async_cpu, "median"),
              num(async_cpu, "p10"), num(async_cpu, "p90"));
  std::printf("  steps alone, paired median: sync %.3fx (p10-p90 %.3f-%.3f), async %.3fx (%.3f-%.3f)\n",
              num(sync_steps, "median"), num(sync_steps, "p10"), num(sync_steps, "p90"), num(async_steps, "median"),
              num(async_steps, "p10"), num(async_steps, "p90"));
  std::printf("  steps alone, process CPU (async: less the writer's), paired median: sync %.3fx (p10-p90 %.3f-%.3f), "
              "async %.3fx (%.3f-%.3f)\n",
              num(sync_steps_cpu, "median"), num(sync_steps_cpu, "p10"), num(sync_steps_cpu, "p90"),
              num(async_steps_cpu, "median"), num(async_steps_cpu, "p10"), num(async_steps_cpu, "p90"));
  std::printf("  sync save call %.4f s (%.4f CPU s on the training thread)\n", sync.mean([](const Runner::Segment& s) {
                return s.save_call; }), sync.mean([](const Runner::Segment& s) { return s.save_call_cpu; }));
  std::printf("  async, per save after the first: save call %.4f s (%.4f CPU), commit wait %.4f s, commit %.4f s "
              "(%.4f CPU for both); first save call %.4f s\n",
              at(&T::save_call_s), call_cpu, at(&T::commit_wait_s), at(&T::commit_s), commit_cpu,
              async.segments.empty() ? 0 : async.segments.front().async.save_call_s);
  std::printf("  async writer: create %.4f s, data %.4f s, close+fsync %.4f s; %.4f CPU s\n", at(&T::write_create_s),
              at(&T::write_data_s), at(&T::write_finish_s), writer_cpu);
  std::printf("  async CPU cost: %.4f s per save (writer %.4f, save call %.4f, commit %.4f) = %.4f s per step, "
              "%.1f%% of a step's %.4f CPU s without saves\n",
              save_cpu, writer_cpu, call_cpu, commit_cpu, save_cpu / k, 100 * save_cpu / k / base_cpu_step, base_cpu_step);
  bench::Report r;
  r.benchmark = "checkpoint_async_bench";
  r.config = {{"params", params}, {"steps", steps}, {"rounds", rounds}, {"every", every}, {"n_layer", cfg.model->n_layer},
              {"d_model", cfg.model->d_model}, {"micro_batch", micro}};
  r.results = {boost::json::object{{"mode", "sync"}, {"step_s", sync_step},
                                   {"save_call_s", sync.mean([](const Runner::Segment& s) { return s.save_call; })},
                                   {"steps_paired", sync_steps}, {"cpu_paired", sync_cpu},
                                   {"steps_cpu_paired", sync_steps_cpu}},
               boost::json::object{{"mode", "async"}, {"step_s", async_step}, {"save_call_s", at(&T::save_call_s)},
                                   {"save_call_cpu_s", call_cpu}, {"commit_wait_s", at(&T::commit_wait_s)},
                                   {"commit_s", at(&T::commit_s)}, {"commit_cpu_s", commit_cpu},
                                   {"write_create_s", at(&T::write_create_s)}, {"write_data_s", at(&T::write_data_s)},
                                   {"write_finish_s", at(&T::write_finish_s)}, {"writer_cpu_s", writer_cpu},
                                   {"save_cpu_s", save_cpu}, {"save_cpu_per_step_fraction", save_cpu / k / base_cpu_step},
                                   {"steps_paired", async_steps}, {"cpu_paired", async_cpu},
                                   {"steps_cpu_paired", async_steps_cpu}}};
  r.baseline = {{"mode", "no saves"}, {"step_s", none_step}, {"cpu_step_s", base_cpu_step}};
  r.ratio = boost::json::object{{"sync", sync_step / none_step}, {"async", async_step / none_step},
                                {"sync_paired", sync_wall}, {"async_paired", async_wall}};
  const std::string json = bench::json_path_arg(argc, argv);
  if (!json.empty()) r.write(json);
  return 0;
}
