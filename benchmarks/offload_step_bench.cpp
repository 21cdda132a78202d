// Question: what does NVMe optimizer offload cost in step time against CPU optimizer offload of the
// same model, the same ranks and the same moment of the machine? Target (issue): <= 1.3x.
//
//   [mpirun -np N] build/release/benchmarks/offload_step_bench [--json out.json] [--dir /local_nvme]
//          [--stage 2] [--n-layer 4] [--d-model 768] [--n-head 12] [--seq-len 128] [--micro-batch 8]
//          [--reps 5] [--warmup 1] [--sub-group 10000000] [--buffers 4] [--params-too 0|1]
//
// Default model: GPT n_layer 4, d_model 768, n_head 12, seq_len 128, byte vocabulary (28.6 M
// parameters), bf16 + AdamW at ZeRO stage 2, micro batch 8 (1024 tokens per rank and step). Its
// offloaded states are 12 bytes per parameter (343 MB): an NVMe step reads and writes them all once.
// --params-too 1 runs stage 3 with the parameters offloaded as well (ZeRO-Infinity), each run of the
// pair with the same device for both kinds of state.
//
// Method. Both engines (cpu, nvme; own arena, own swap file under --dir) are built first; each takes
// --warmup untimed steps. Then --reps repetitions, each running one step of each engine in alternating
// order (so slow drift of the machine and of the disk hits both alike). A step is (barrier,
// Engine::train_batch) and its time the slowest rank's. Ratio = median over repetitions of (nvme step
// / cpu step of the same repetition). Losses must be equal (offload changes where states live, not
// the arithmetic).
#include <algorithm>
#include <cstdio>
#include <filesystem>
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
#include "launch/launch.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "run/run_config.h"

using namespace zs;

int main(int argc, char** argv) {
  launch::select_blas_kernels(argv);
  try {
    auto world = comm::World::create();
    const comm::Group& group = world.group();
    const bool root = group.rank() == 0;
    const int threads = launch::set_blas_threads(launch::local_rank_count());
    init_logging({group.rank(), group.size()}, LogConfig{.level = "warn"});

    const nn::GptConfig gcfg = bench::gpt_config_arg(
        argc, argv, {.n_layer = 4, .d_model = 768, .n_head = 12, .seq_len = 128, .vocab_size = 256});
    const int64_t micro = bench::int_arg(argc, argv, "--micro-batch", 8);
    const int64_t reps = bench::int_arg(argc, argv, "--reps", 5);
    const int64_t warmup = bench::int_arg(argc, argv, "--warmup", 1, 0);
    const bool params_too = bench::int_arg(argc, argv, "--params-too", 0, 0) != 0;
    const int stage = params_too ? 3 : static_cast<int>(bench::int_arg(argc, argv, "--stage", 2));
    if (stage < 1 || stage > 3) throw ConfigError("--stage: optimizer offload needs ZeRO stage 1, 2 or 3");
    const std::string dir = bench::arg_value(argc, argv, "--dir", std::filesystem::temp_directory_path().string());

    zs::run::RunConfig base;
    base.batch = engine::resolve_batch(0, micro, 1, group.size());
    base.model = gcfg;
    base.precision = engine::Precision::kBf16;
    base.device.memory_mb = 2048;
    base.zero.stage = stage;
    base.zero.reduce_bucket_size = 2'000'000;
    base.zero.allgather_bucket_size = 2'000'000;
    base.zero.stage3_prefetch_bucket_size = 2'000'000;
    base.zero.sub_group_size = bench::int_arg(argc, argv, "--sub-group", 10'000'000);
    base.zero.offload_optimizer.buffer_count = bench::int_arg(argc, argv, "--buffers", 4);

    const engine::OffloadDevice devices[2] = {engine::OffloadDevice::kCpu, engine::OffloadDevice::kNvme};
    std::vector<std::unique_ptr<nn::GptModel>> models;
    std::vector<std::unique_ptr<engine::Engine>> engines;
    std::vector<zs::run::RunConfig> cfgs(2, base);
    for (int i = 0; i < 2; ++i) {
      auto& c = cfgs[static_cast<size_t>(i)];
      c.zero.offload_optimizer.device = devices[i];
      c.zero.offload_optimizer.nvme_path = dir;
      if (params_too) c.zero.offload_param = {.device = devices[i], .nvme_path = dir};
      models.push_back(std::make_unique<nn::GptModel>(gcfg));
      engines.push_back(std::make_unique<engine::Engine>(*models.back(), c, group));
    }
    std::vector<engine::DatasetSource> sources(2, engine::DatasetSource(nn::Dataset::builtin(gcfg.seq_len), 7));
    const int64_t params = engines[0]->param_count();
    if (root) {
      std::printf("offload_step_bench: GPT n_layer %lld d_model %lld (%lld params), bf16 + AdamW, ZeRO stage %d, %d rank(s), "
                  "micro batch %lld, %d BLAS thread(s) per rank; optimizer%s offloaded; swap dir %s; sub_group_size %lld, "
                  "%lld buffers\n",
                  (long long)gcfg.n_layer, (long long)gcfg.d_model, (long long)params, stage, group.size(), (long long)micro,
                  threads, params_too ? " and parameters" : "", dir.c_str(), (long long)base.zero.sub_group_size,
                  (long long)base.zero.offload_optimizer.buffer_count);
    }
    for (int64_t i = 0; i < warmup; ++i) {
      for (size_t e = 0; e < 2; ++e) engines[e]->train_batch(sources[e]);
    }
    std::vector<double> step[2], opt[2], loss[2], ratio;
    for (int64_t r = 0; r < reps; ++r) {
      double t[2] = {0, 0};
      for (int j = 0; j < 2; ++j) {
        const size_t e = static_cast<size_t>((r + j) % 2);
        group.barrier();
        const double t0 = bench::now_seconds();
        const engine::StepReport rep = engines[e]->train_batch(sources[e]);
        t[e] = bench::slowest(group, bench::now_seconds() - t0);
        step[e].push_back(t[e]);
        opt[e].push_back(bench::slowest(group, rep.optimizer_s));
        loss[e].push_back(rep.loss);
      }
      ratio.push_back(t[1] / t[0]);
    }
    const double median_ratio = bench::median(ratio);
    bench::Report report;
    report.benchmark = "offload_step_bench";
    report.config = {{"n_layer", gcfg.n_layer}, {"d_model", gcfg.d_model}, {"params", params},  {"stage", stage},
                     {"ranks", group.size()},  {"micro_batch", micro},   {"reps", reps},       {"dir", dir},
                     {"params_offloaded", params_too}, {"sub_group_size", base.zero.sub_group_size},
                     {"buffer_count", base.zero.offload_optimizer.buffer_count}};
    const char* names[2] = {"cpu", "nvme"};
    if (root) std::printf("\n%6s %9s %11s %9s  %s\n", "device", "step s", "optimizer s", "min s", "losses");
    bool same_losses = true;
    for (size_t e = 0; e < 2; ++e) {
      same_losses = same_losses && loss[e] == loss[0];
      boost::json::array steps_json;
      for (double v : step[e]) steps_json.push_back(v);
      boost::json::object row{{"offload", names[e]},
                              {"step_s", bench::median(step[e])},
                              {"optimizer_s", bench::median(opt[e])},
                              {"step_s_min", *std::min_element(step[e].begin(), step[e].end())},
                              {"step_s_all", steps_json}};
      if (e == 0) report.baseline = row;
      report.results.push_back(std::move(row));
      if (root) {
        std::printf("%6s %9.3f %11.3f %9.3f ", names[e], bench::median(step[e]), bench::median(opt[e]),
                    *std::min_element(step[e].begin(), step[e].end()));
        for (double l : loss[e]) std::printf(" %.4f", l);
        std::printf("\n");
      }
    }
    report.ratio = boost::json::object{{"nvme_over_cpu_step", median_ratio}, {"same_losses", same_losses}};
    if (root) {
      std::printf("\nnvme / cpu step time (median of per-repetition ratios): %.3f (target <= 1.3); losses %s\n", median_ratio,
                  same_losses ? "identical" : "DIFFER");
    }
    const std::string path = bench::json_path_arg(argc, argv);
    if (!path.empty() && root) report.write(path);
    return 0;
  } catch (const std::exception& e) {
    comm::World::abort(std::string("offload_step_bench: ") + e.what(), 1);
  }
}
