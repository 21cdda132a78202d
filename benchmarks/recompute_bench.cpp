// Question: what does activation checkpointing buy and cost? (1) On the example GPT (gpt_small.json's
// model, micro-batch 8), the device peak and step time of no recompute, every block recomputed,
// selective recompute (attention's scores) and every block with the kept inputs on the host
// (cpu_checkpointing), at the world size it is launched with (np 1 and 2); targets: full recompute
// <= 1.4x the plain step time, selective <= 1.1x. (2) The largest GPT by layers at a fixed width that
// trains in a 1 GiB device arena at np 1, without and with every block recomputed.
//
//   build/release/benchmarks/recompute_bench [--json out.json] [--steps 6] [--warmup 1]
//          [--n-layer 4 --d-model 256 --n-head 4 --seq-len 128] [--micro-batch 8]
//          [--fit-d-model 128 --fit-seq-len 256 --fit-micro-batch 8 --fit-memory-mb 1024] [--no-verify] [--no-fit]
//   mpirun -np 2 --oversubscribe build/release/benchmarks/recompute_bench   (part 1 only)
//
// Method (1): one engine per mode, all built up front, stepped round-robin (mode A step, mode B step,
// ...) so a load change on a shared machine touches every mode alike; a step's time is the slowest
// rank's, the figure the median over --steps after --warmup; also the process's CPU seconds per step
// (all threads), steadier than wall time on a machine shared with other jobs. Ratios are to the plain
// mode of the same run. Device peak: rank 0's allocated peak of the arena (Engine::memory_report) and its activations.
// Method (2): the estimator's step replay (estimate/measure.h: the engine's own code over the
// measuring backend) predicts the reserved device peak of n layers; a binary search over n finds the
// largest that fits the arena, for each mode; then one real training step of each largest model in an
// arena of that size checks that it trains (skipped with --no-verify).
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/support/bench_args.h"
#include "benchmarks/support/bench_group.h"
#include "benchmarks/support/bench_json.h"
#include "comm/comm.h"
#include "core/errors.h"
#include "core/log.h"
#include "engine/config.h"
#include "engine/dataset_source.h"
#include "engine/engine.h"
#include "estimate/measure.h"
#include "launch/launch.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "optim/adam.h"
#include "run/run_config.h"

using namespace zs;
using Blocks = engine::RecomputeConfig::Blocks;

namespace {

struct Mode {
  std::string name;
  Blocks blocks;
  bool cpu = false;
};

const std::vector<Mode> kModes = {{"none", Blocks::kNone},
                                  {"every_block", Blocks::kEvery},
                                  {"selective", Blocks::kSelective},
                                  {"cpu_checkpointing", Blocks::kEvery, true}};

zs::run::RunConfig make_config(const nn::GptConfig& g, int64_t micro, int world, int64_t memory_mb, const Mode& m) {
  zs::run::RunConfig c;
  c.batch = engine::resolve_batch(0, micro, 1, world);
  c.zero.stage = world > 1 ? 1 : 0;
  c.optimizer = engine::OptimizerConfig("AdamW", optim::AdamConfig{.lr = 1e-3, .weight_decay = 0.1});
  c.device.memory_mb = memory_mb;
  c.model = g;
  c.recompute.blocks = m.blocks;
  c.recompute.cpu_checkpointing = m.cpu;
  return c;
}

double mib(uint64_t b) { return static_cast<double>(b) / (1 << 20); }

// CPU seconds of this process, all its threads (CLOCK_PROCESS_CPUTIME_ID).
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The reserved device peak the estimator predicts for `g` under `m` on one rank.
uint64_t predicted_peak(const nn::GptConfig& g, int64_t micro, int64_t memory_mb, const Mode& m) {
  const zs::run::RunConfig c = make_config(g, micro, 1, memory_mb, m);
  nn::GptModel model(g);
  engine::DatasetSource source(nn::Dataset::builtin(g.seq_len), 1);
  return engine::estimate(model, c, 1, source).classes.front().memory.device_reserved_peak_bytes;
}

}  // namespace

int main(int argc, char** argv) {
  launch::select_blas_kernels(argv);
  try {
    auto world = comm::World::create();
    const comm::Group& group = world.group();
    const int ranks = group.size();
    const bool root = group.rank() == 0;
    const int threads = launch::set_blas_threads(launch::local_rank_count());
    init_logging({group.rank(), ranks}, LogConfig{.level = "warn"});

    const nn::GptConfig gcfg = bench::gpt_config_arg(
        argc, argv, {.n_layer = 4, .d_model = 256, .n_head = 4, .seq_len = 128, .vocab_size = 256});
    const int64_t micro = bench::int_arg(argc, argv, "--micro-batch", 8);
    const int64_t steps = bench::int_arg(argc, argv, "--steps", 6);
    const int64_t warmup = bench::int_arg(argc, argv, "--warmup", 1, 0);

    // ---- (1) the example GPT, every mode, stepped round-robin --------------------------------------
    std::vector<std::unique_ptr<nn::GptModel>> models;
    std::vector<zs::run::RunConfig> configs;
    std::vector<std::unique_ptr<engine::Engine>> engines;
    std::vector<std::unique_ptr<engine::DatasetSource>> sources;
    for (const Mode& m : kModes) {
      configs.push_back(make_config(gcfg, micro, ranks, 2048, m));
      models.push_back(std::make_unique<nn::GptModel>(gcfg));
      engines.push_back(std::make_unique<engine::Engine>(*models.back(), configs.back(), group));
      sources.push_back(std::make_unique<engine::DatasetSource>(nn::Dataset::builtin(gcfg.seq_len), 7));
    }
    std::vector<std::vector<double>> times(kModes.size()), cpu(kModes.size());
    for (int64_t s = 0; s < warmup + steps; ++s) {
      for (size_t i = 0; i < kModes.size(); ++i) {
        group.barrier();
        const double t0 = bench::now_seconds(), c0 = cpu_seconds();
        engines[i]->train_batch(*sources[i]);
        const double dc = bench::slowest(group, cpu_seconds() - c0);
        const double dt = bench::slowest(group, bench::now_seconds() - t0);
        if (s >= warmup) {
          times[i].push_back(dt);
          cpu[i].push_back(dc);
        }
      }
    }
    bench::Report report;
    report.benchmark = "recompute_bench";
    const double plain_s = bench::median(times[0]);
    const double plain_cpu = bench::median(cpu[0]);
    const uint64_t plain_peak = engines[0]->memory_report().device_peak_bytes;
    boost::json::object ratios;
    if (root) {
      std::printf("activation checkpointing, GPT n_layer %lld d_model %lld seq_len %lld, micro-batch %lld, %d rank(s), "
                  "%d BLAS thread(s) per rank\n", static_cast<long long>(gcfg.n_layer), static_cast<long long>(gcfg.d_model),
                  static_cast<long long>(gcfg.seq_len), static_cast<long long>(micro), ranks, threads);
      std::printf("%-18s %14s %16s %10s %8s %12s %8s %12s %12s\n", "mode", "device peak", "activation peak", "step (s)",
                  "x plain", "step cpu (s)", "x plain", "recompute s", "peak x plain");
    }
    for (size_t i = 0; i < kModes.size(); ++i) {
      const engine::Engine::MemoryReport mem = engines[i]->memory_report();
      const engine::Engine::RecomputeReport rc = engines[i]->recompute_report();
      const double t = bench::median(times[i]);
      const double step_ratio = t / plain_s;
      const double c = bench::median(cpu[i]);
      const double cpu_ratio = c / plain_cpu;
      const double peak_ratio = static_cast<double>(mem.device_peak_bytes) / static_cast<double>(plain_peak);
      if (root) {
        std::printf("%-18s %10.1f MiB %12.1f MiB %10.3f %8.3f %12.3f %8.3f %12.3f %12.3f\n", kModes[i].name.c_str(),
                    mib(mem.device_peak_bytes), mib(mem.activation_peak_bytes), t, step_ratio, c, cpu_ratio,
                    rc.recompute_s / static_cast<double>(warmup + steps), peak_ratio);
      }
      report.results.push_back(boost::json::object{{"part", "modes"},
                                                   {"mode", kModes[i].name},
                                                   {"ranks", ranks},
                                                   {"device_peak_bytes", mem.device_peak_bytes},
                                                   {"device_reserved_peak_bytes", mem.device_reserved_peak_bytes},
                                                   {"activation_peak_bytes", mem.activation_peak_bytes},
                                                   {"host_peak_bytes", mem.host_peak_bytes},
                                                   {"step_s_median", t},
                                                   {"step_time_vs_none", step_ratio},
                                                   {"step_cpu_s_median", c},
                                                   {"step_cpu_time_vs_none", cpu_ratio},
                                                   {"device_peak_vs_none", peak_ratio},
                                                   {"recompute_s_per_step", rc.recompute_s / static_cast<double>(warmup + steps)}});
      if (i > 0) {
        ratios[kModes[i].name + "_step_time_vs_none"] = step_ratio;
        ratios[kModes[i].name + "_step_cpu_time_vs_none"] = cpu_ratio;
      }
    }
    report.baseline = {{"what", "no recompute, same run, same model"},
                       {"step_s_median", plain_s},
                       {"step_cpu_s_median", plain_cpu},
                       {"device_peak_bytes", plain_peak}};
    const double full = ratios["every_block_step_time_vs_none"].as_double();
    const double selective = ratios["selective_step_time_vs_none"].as_double();
    ratios["every_block_target_1_4_met"] = full <= 1.4;
    ratios["selective_target_1_1_met"] = selective <= 1.1;
    if (root) {
      std::printf("full recompute %.3fx the plain step (target <= 1.4: %s), selective %.3fx (target <= 1.1: %s)\n", full,
                  full <= 1.4 ? "met" : "NOT met", selective, selective <= 1.1 ? "met" : "NOT met");
    }
    engines.clear();

    // ---- (2) the largest GPT in a 1 GiB arena at np 1 -----------------------------------------------
    const nn::GptConfig fit_base{.n_layer = 1,
                                 .d_model = bench::int_arg(argc, argv, "--fit-d-model", 128),
                                 .n_head = 4,
                                 .seq_len = bench::int_arg(argc, argv, "--fit-seq-len", 256),
                                 .vocab_size = 256};
    const int64_t fit_micro = bench::int_arg(argc, argv, "--fit-micro-batch", 8);
    const int64_t fit_mb = bench::int_arg(argc, argv, "--fit-memory-mb", 1024);
    const bool verify = !bench::has_flag(argc, argv, "--no-verify");
    boost::json::object largest;
    const bool fit = !bench::has_flag(argc, argv, "--no-fit");
    if (ranks == 1 && fit) {
      const uint64_t arena = static_cast<uint64_t>(fit_mb) << 20;
      for (const Mode& m : {kModes[0], kModes[1]}) {
        auto peak_of = [&](int64_t n) {
          nn::GptConfig g = fit_base;
          g.n_layer = n;
          return predicted_peak(g, fit_micro, fit_mb, m);
        };
        int64_t lo = 0, hi = 1;  // peak(lo) fits (0: nothing), peak(hi) does not
        while (peak_of(hi) <= arena) {
          lo = hi;
          hi *= 2;
        }
        while (hi - lo > 1) {
          const int64_t mid = lo + (hi - lo) / 2;
          (peak_of(mid) <= arena ? lo : hi) = mid;
        }
        const uint64_t fit_peak = lo > 0 ? peak_of(lo) : 0;
        bool trained = false;
        double step_s = 0.0;
        if (verify && lo > 0) {
          nn::GptConfig g = fit_base;
          g.n_layer = lo;
          const zs::run::RunConfig c = make_config(g, fit_micro, 1, fit_mb, m);
          nn::GptModel model(g);
          engine::Engine e(model, c, group);
          engine::DatasetSource source(nn::Dataset::builtin(g.seq_len), 1);
          const double t0 = bench::now_seconds();
          e.train_batch(source);
          step_s = bench::now_seconds() - t0;
          trained = e.memory_report().device_reserved_peak_bytes <= arena;
        }
        const std::string verdict =
            !verify ? "not verified" : trained ? fmt::format("trained one step in {:.1f} s", step_s) : "did NOT train";
        if (root) {
          std::printf("largest GPT (d_model %lld, seq_len %lld, micro-batch %lld) in a %lld MiB arena, %s: %lld layers "
                      "(predicted reserved peak %.1f MiB; %s)\n",
                      static_cast<long long>(fit_base.d_model), static_cast<long long>(fit_base.seq_len),
                      static_cast<long long>(fit_micro), static_cast<long long>(fit_mb), m.name.c_str(),
                      static_cast<long long>(lo), mib(fit_peak),
                      verdict.c_str());
        }
        largest[m.name] = lo;
        report.results.push_back(boost::json::object{{"part", "largest_in_arena"},
                                                     {"mode", m.name},
                                                     {"arena_bytes", arena},
                                                     {"d_model", fit_base.d_model},
                                                     {"seq_len", fit_base.seq_len},
                                                     {"micro_batch", fit_micro},
                                                     {"n_layer", lo},
                                                     {"predicted_reserved_peak_bytes", fit_peak},
                                                     {"verified_by_training", verify},
                                                     {"trained", trained},
                                                     {"step_s", step_s}});
      }
      ratios["largest_layers_every_block_vs_none"] =
          largest["none"].as_int64() > 0 ? static_cast<double>(largest["every_block"].as_int64()) / largest["none"].as_int64() : 0.0;
    }
    report.config = {{"n_layer", gcfg.n_layer},   {"d_model", gcfg.d_model}, {"n_head", gcfg.n_head},
                     {"seq_len", gcfg.seq_len},   {"micro_batch", micro},    {"ranks", ranks},
                     {"steps", steps},            {"warmup", warmup},        {"blas_threads_per_rank", threads},
                     {"zero_stage", ranks > 1 ? 1 : 0}};
    report.ratio = ratios;
    const std::string path = bench::json_path_arg(argc, argv);
    if (!path.empty() && root) report.write(path);
    return 0;
  } catch (const std::exception& e) {
    comm::World::abort(std::string("recompute_bench: ") + e.what(), 1);
  }
}
