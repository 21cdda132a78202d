// Question: does a GPT-MoE with 8x the dense model's parameters train on N ranks, experts spread over
// all of them (ep_size N) at ZeRO-3, in no more device memory per rank than the dense GPT at stage 0?
//
//   mpirun -np 4 --oversubscribe build/release/benchmarks/moe_memory_bench [--json out.json] [--ratio 8]
//          [--n-layer 4] [--d-model 256] [--n-head 4] [--seq-len 64] [--micro-batch 4] [--steps 2]
//          [--memory-mb 2048] [--precision fp32|bf16] [--bucket 1000000]
//
// Models (--precision for both: fp32, or bf16 with fp32 master weights; AdamW, untied head, byte vocabulary): the dense nn::GptModel, and moe::GptMoeModel
// with the same GptConfig whose every block's MLP is an MoE layer (every_n_layers 1, top-2, experts
// as wide as the dense MLP, ep_size = ranks) with the fewest experts (a multiple of the ranks) that make
// its parameter count >= --ratio x the dense model's.
// Cases, each its own Engine (own device arena, so its own peaks), trained --steps optimizer steps on
// the built-in corpus:
//   dense  stage 0                                 (the baseline)
//   moe    stage 3
//   moe    stage 3, optimizer offloaded (cpu)
//   moe    stage 3, optimizer and parameters offloaded (cpu)
//   the three moe cases again with small buckets: reduce_bucket_size and stage3_max_live_parameters
//          --bucket elements, stage3_prefetch_bucket_size half of it (DeepSpeed's defaults, 5e8 and 5e7,
//          keep all of a small model's gradients and gathered parameters on the device at once)
// Per case: the device arena's measured peak (Engine::memory_report().device_peak_bytes, the summary's
// device_peak_bytes), max over ranks, and the estimator's prediction of it (zeroshard estimate's
// device_peak: the engine's code over the measuring backend), max over ranks; the device model states
// per rank (rank 0) measured and estimated, and what rank 0's peak was made of (by memory category). ratio = case's measured peak / the dense stage-0 peak
// (target <= 1). Note the arithmetic: with ep_size = ranks the expert-data-parallel group is one
// rank, so ZeRO-3 cannot shard an expert's states further: the model states per rank are 16 bytes x
// (dense part / N + experts / N), about 16 x 8Ψ/N = 2 x 16Ψ at N = 4 for 8x the parameters Ψ; only
// offloading the optimizer states (12 of the 16 bytes) brings them under the dense model's 16Ψ.
#include <algorithm>
#include <cstdio>
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
#include "estimate/estimate.h"
#include "memory/category.h"
#include "moe/moe.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "optim/adam.h"
#include "run/run_config.h"

using namespace zs;

namespace {

struct Case {
  std::string name;
  bool moe = false;
  int stage = 0;
  bool offload_optimizer = false;
  bool offload_param = false;
  bool small_buckets = false;  // --bucket elements for reduce_bucket_size, stage3_prefetch_bucket_size
};

// Parameter elements of the GPT-MoE with `experts` experts (the whole model, every expert once).
int64_t moe_param_count(const moe::GptMoeConfig& c) {
  moe::GptMoeConfig one = c;
  one.moe.ep_size = 1;
  moe::GptMoeModel m(one);
  return m.param_count();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto world = comm::World::create();
    const comm::Group& g = world.group();
    const int n = g.size();
    init_logging({g.rank(), n}, LogConfig{.level = "warn"});
    const double target_ratio = std::stod(bench::arg_value(argc, argv, "--ratio", "8"));
    const int64_t micro = bench::int_arg(argc, argv, "--micro-batch", 4);
    const int64_t steps = bench::int_arg(argc, argv, "--steps", 2);
    nn::GptConfig gpt = bench::gpt_config_arg(argc, argv, {.n_layer = 4, .d_model = 256, .n_head = 4, .seq_len = 64});
    gpt.tied_embeddings = false;
    const int64_t dense_params = nn::gpt_param_count(gpt);
    moe::GptMoeConfig moe_cfg{.gpt = gpt, .moe = {.num_experts = n, .ep_size = n, .k = 2, .capacity_factor = 1.25},
                              .every_n_layers = 1, .aux_loss_coef = 0.01f};
    while (static_cast<double>(moe_param_count(moe_cfg)) < target_ratio * static_cast<double>(dense_params))
      moe_cfg.moe.num_experts += n;
    const int64_t moe_params = moe_param_count(moe_cfg);
    comm::ExpertGroups groups = world.split_groups(n);

    zs::run::RunConfig base;
    base.batch = engine::resolve_batch(0, micro, 1, n);
    base.optimizer = engine::OptimizerConfig("AdamW", optim::AdamConfig{.lr = 1e-3});
    base.device.memory_mb = bench::int_arg(argc, argv, "--memory-mb", 2048);
    const std::string precision = bench::arg_value(argc, argv, "--precision", "fp32");
    if (precision != "fp32" && precision != "bf16") throw ConfigError("--precision: fp32 or bf16");
    base.precision = precision == "bf16" ? engine::Precision::kBf16 : engine::Precision::kFp32;
    base.model = gpt;
    engine::DatasetSource source(nn::Dataset::builtin(gpt.seq_len), 7);

    const std::vector<Case> cases = {{"dense stage 0", false, 0, false, false},
                                     {"moe stage 3", true, 3, false, false},
                                     {"moe stage 3 + optimizer offload", true, 3, true, false},
                                     {"moe stage 3 + optimizer and param offload", true, 3, true, true},
                                     {"moe stage 3, small buckets", true, 3, false, false, true},
                                     {"moe stage 3 + optimizer offload, small buckets", true, 3, true, false, true},
                                     {"moe stage 3 + opt. and param offload, small buckets", true, 3, true, true, true}};
    // DeepSpeed's bucket defaults (reduce 5e8, prefetch 5e7 elements) hold a small model's every gradient and
    // gathered parameter at once; its users set them lower to save memory, as the "small buckets" cases do.
    const int64_t bucket = bench::int_arg(argc, argv, "--bucket", 1'000'000);
    if (g.rank() == 0) {
      std::printf("moe_memory_bench: %d ranks; dense GPT n_layer %ld d_model %ld: %ld parameters; GPT-MoE with %d "
                  "experts per layer (every block, top-2, ep_size %d): %ld parameters (%.2fx)\n",
                  n, static_cast<long>(gpt.n_layer), static_cast<long>(gpt.d_model), static_cast<long>(dense_params),
                  moe_cfg.moe.num_experts, n, static_cast<long>(moe_params),
                  static_cast<double>(moe_params) / static_cast<double>(dense_params));
      std::printf("%-52s %14s %14s %14s %14s %8s\n", "case", "peak_MiB", "est_peak_MiB", "states_MiB", "est_states_MiB",
                  "ratio");
    }
    bench::Report report;
    report.benchmark = "moe_memory_bench";
    report.config = {{"ranks", n},         {"n_layer", gpt.n_layer},    {"d_model", gpt.d_model},
                     {"n_head", gpt.n_head}, {"seq_len", gpt.seq_len},  {"micro_batch_per_rank", micro},
                     {"steps", steps},     {"precision", precision},       {"optimizer", "AdamW"},
                     {"dense_params", dense_params}, {"moe_params", moe_params},
                     {"moe_experts", moe_cfg.moe.num_experts}, {"small_bucket_elements", bucket}, {"ep_size", n}, {"k", 2}, {"every_n_layers", 1}};
    boost::json::object ratios;
    double dense_peak = 0;
    for (const Case& c : cases) {
      zs::run::RunConfig cfg = base;
      cfg.zero.stage = c.stage;
      if (c.offload_optimizer) cfg.zero.offload_optimizer.device = engine::OffloadDevice::kCpu;
      if (c.offload_param) cfg.zero.offload_param.device = engine::OffloadDevice::kCpu;
      if (c.moe) cfg.model_moe = moe_cfg;
      if (c.small_buckets) {
        cfg.zero.reduce_bucket_size = bucket;
        cfg.zero.stage3_prefetch_bucket_size = bucket / 2;
        cfg.zero.stage3_max_live_parameters = bucket;
      }
      uint64_t peak = 0;
      engine::ModelStateBytes states;
      boost::json::object by_category;
      std::string breakdown;
      {
        std::unique_ptr<nn::Model> model;
        if (c.moe) {
          model = std::make_unique<moe::GptMoeModel>(moe_cfg, &groups);
        } else {
          model = std::make_unique<nn::GptModel>(gpt);
        }
        engine::Engine e(*model, cfg, g);
        for (int64_t i = 0; i < steps; ++i) e.train_batch(source);
        const engine::Engine::MemoryReport mem = e.memory_report();
        peak = static_cast<uint64_t>(bench::slowest(g, static_cast<double>(mem.device_peak_bytes)));
        states = mem.device_states;
        for (memory::Category cat : memory::kAllCategories) {
          const uint64_t b = mem.device_peak_by_category[static_cast<size_t>(cat)];
          by_category[std::string(memory::category_name(cat))] = b;
          if (b > 0) breakdown += fmt::format(" {} {:.2f}", memory::category_name(cat), b / 1048576.0);
        }
      }
      // The estimator (zeroshard estimate --config with this model section): every rank's predicted
      // device peak, and rank 0's device model states.
      const engine::EstimateInput in = engine::estimate_input_for_config(cfg, n);
      const engine::StageEstimate est = engine::estimate_stage(in, c.stage);
      uint64_t est_peak = 0;
      for (const engine::ShardGroup& s : est.shards) est_peak = std::max(est_peak, s.device_peak.bytes);
      const engine::StateBytes est_states = engine::tiered_state_bytes(in, c.stage, 0).device;
      const uint64_t got_states = states.params + states.grads + states.optimizer;
      if (!c.moe) dense_peak = static_cast<double>(peak);
      const double ratio = static_cast<double>(peak) / dense_peak;
      if (g.rank() == 0) {
        std::printf("%-52s %14.2f %14.2f %14.2f %14.2f %8.3f\n%52s rank 0's peak, MiB:%s\n", c.name.c_str(),
                    peak / 1048576.0, est_peak / 1048576.0, got_states / 1048576.0, est_states.total() / 1048576.0,
                    ratio, "", breakdown.c_str());
        std::fflush(stdout);
      }
      report.results.push_back(boost::json::object{{"case", c.name},
                                                   {"zero_stage", c.stage},
                                                   {"offload_optimizer", c.offload_optimizer},
                                                   {"offload_param", c.offload_param},
                                                   {"small_buckets", c.small_buckets},
                                                   {"device_peak_bytes_max_rank", peak},
                                                   {"estimated_device_peak_bytes_max_rank", est_peak},
                                                   {"device_model_states_bytes_rank0", got_states},
                                                   {"estimated_device_model_states_bytes_rank0", est_states.total()},
                                                   {"rank0_device_peak_by_category_bytes", by_category},
                                                   {"peak_over_dense_stage0", ratio}});
      if (c.moe) ratios[c.name] = ratio;
      else report.baseline = {{"dense_stage0_device_peak_bytes", peak}};
    }
    report.ratio = ratios;
    const std::string path = bench::json_path_arg(argc, argv);
    if (!path.empty() && g.rank() == 0) report.write(path);
    return 0;
  } catch (const std::exception& e) {
    comm::World::abort(std::string("moe_memory_bench: ") + e.what(), 1);
  }
}
