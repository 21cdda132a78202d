// Question: does a GPT-MoE (8 experts, top-2, experts spread over every rank) train as fast, per token,
// and as well as the dense GPT that does the same FLOPs per token?
//
//   mpirun -np 2 --oversubscribe build/release/benchmarks/moe_train_bench --data FILE [--json out.json]
//          [--seeds 1,2,3] [--steps 150] [--warmup 3] [--eval-batches 8] [--n-layer 4] [--d-model 128]
//          [--n-head 4] [--seq-len 64] [--micro-batch 8] [--experts 8] [--every 2] [--lr 2e-3]
//
// Models (same GptConfig, untied head, byte vocabulary):
//   dense  nn::GptModel: every block's MLP is Linear(C, 4C), Linear(4C, C).
//   moe    moe::GptMoeModel: the MLP of every `--every`-th block is an MoE layer of `--experts` experts
//          of hidden 2C (model.moe.expert_hidden), top-2, ep_size = the number of ranks, capacity
//          factor 1.25, aux_loss_coef 0.01. Each token runs two 2C experts: the dense MLP's FLOPs (plus
//          the gate's C x E), so both models do the same active FLOPs per token.
// Method. The corpus (--data, required: the benchmark ships no data) is split 95% / 5% (training /
// held-out). Per seed, both models are built with that seed and trained side by side on the same
// global batches (engine::DatasetSource, ZeRO stage 0, AdamW, clipping 1.0), their optimizer steps
// interleaved: dense step i, then MoE step i (odd i: the other order), each timed from a barrier to
// the slowest rank, so both see the same machine load. tokens/s = global batch x seq_len / step time;
// ratio = median over steps (after --warmup) of dense step time / MoE step time, per seed, and the
// median over seeds (target >= 0.7). Quality: the held-out cross-entropy after the last step
// (Engine::eval_batch over --eval-batches global batches; the MoE's evaluation loss is its language-
// model loss, without the load-balancing term), per seed, side by side. a2a%: the share of the MoE's
// step time rank 0 spent in its all-to-alls (count exchanges included; the op stats' wall time).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>
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
#include "moe/moe.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "optim/adam.h"

using namespace zs;

namespace {

std::vector<uint64_t> seeds_arg(int argc, char** argv) {
  std::vector<uint64_t> seeds;
  std::stringstream in(bench::arg_value(argc, argv, "--seeds", "1,2,3"));
  for (std::string item; std::getline(in, item, ',');) seeds.push_back(std::stoull(item));
  if (seeds.empty()) throw ConfigError("--seeds: give at least one seed, e.g. 1,2,3");
  return seeds;
}

engine::EngineConfig engine_config(int world, int64_t micro, uint64_t seed, double lr) {
  engine::EngineConfig c;
  c.batch = engine::resolve_batch(micro * world, micro, 1, world);
  c.zero.stage = 0;
  c.optimizer = engine::OptimizerConfig("AdamW", optim::AdamConfig{.lr = lr, .weight_decay = 0.01});
  c.gradient_clipping = 1.0;
  c.device.memory_mb = 1024;
  c.seed = seed;
  return c;
}

struct SeedResult {
  uint64_t seed = 0;
  double dense_eval = 0, moe_eval = 0;
  double dense_tokens_s = 0, moe_tokens_s = 0;
  double ratio = 0;  // median of dense step time / MoE step time
  double moe_dropped = 0;
  double moe_alltoall_share = 0;  // of the MoE's step time: its all-to-alls (count exchange included)
};

// Seconds this rank has spent in all-to-all(v) collectives so far (the World's op stats).
double alltoall_seconds(const comm::Group& g) {
  double s = 0;
  for (const comm::OpStats& op : g.op_stats())
    if (op.name == "alltoall" || op.name == "alltoallv") s += op.seconds;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto world = comm::World::create();
    const comm::Group& g = world.group();
    const int n = g.size();
    init_logging({g.rank(), n}, LogConfig{.level = "warn"});
    const std::string data_path = bench::arg_value(argc, argv, "--data", "");
    if (data_path.empty()) throw ConfigError("--data: give a text corpus to train on (e.g. tinyshakespeare.txt)");
    const std::vector<uint64_t> seeds = seeds_arg(argc, argv);
    const int64_t steps = bench::int_arg(argc, argv, "--steps", 150);
    const int64_t warmup = bench::int_arg(argc, argv, "--warmup", 3, 0);
    const int64_t eval_batches = bench::int_arg(argc, argv, "--eval-batches", 8);
    const int64_t micro = bench::int_arg(argc, argv, "--micro-batch", 8);
    const int experts = static_cast<int>(bench::int_arg(argc, argv, "--experts", 8));
    const int every = static_cast<int>(bench::int_arg(argc, argv, "--every", 2));
    const double lr = std::stod(bench::arg_value(argc, argv, "--lr", "2e-3"));
    nn::GptConfig gpt = bench::gpt_config_arg(argc, argv, {.n_layer = 4, .d_model = 128, .n_head = 4, .seq_len = 64});
    gpt.tied_embeddings = false;
    moe::GptMoeConfig moe_cfg{.gpt = gpt,
                              .moe = {.num_experts = experts, .ep_size = n, .k = 2, .capacity_factor = 1.25},
                              .every_n_layers = every,
                              .aux_loss_coef = 0.01f,
                              .expert_hidden = 2 * gpt.d_model};
    moe::validate(moe_cfg);
    comm::ExpertGroups groups = world.split_groups(n);

    const nn::Dataset corpus = nn::Dataset::open(data_path, gpt.seq_len);
    const uint64_t cut = corpus.bytes().size() * 95 / 100;
    const nn::Dataset train_part = corpus.slice(0, cut, data_path + " (first 95%)");
    const nn::Dataset held_out = corpus.slice(cut, corpus.bytes().size(), data_path + " (last 5%)");
    const double tokens_per_step = static_cast<double>(micro * n * gpt.seq_len);

    if (g.rank() == 0) {
      std::printf("moe_train_bench: %d ranks, GPT n_layer %ld d_model %ld seq_len %ld, micro-batch %ld per rank, "
                  "%ld steps; MoE: %d experts of hidden %ld, top-2, every %d block(s), ep_size %d\n",
                  n, static_cast<long>(gpt.n_layer), static_cast<long>(gpt.d_model), static_cast<long>(gpt.seq_len),
                  static_cast<long>(micro), static_cast<long>(steps), experts, static_cast<long>(2 * gpt.d_model),
                  every, n);
      std::printf("%6s %12s %12s %12s %12s %8s %10s %10s\n", "seed", "dense_tok/s", "moe_tok/s", "dense_eval", "moe_eval",
                  "ratio", "dropped%", "a2a%");
    }
    std::vector<SeedResult> results;
    int64_t dense_params = 0, moe_params = 0;
    for (uint64_t seed : seeds) {
      nn::GptModel dense(gpt);
      moe::GptMoeModel moe_model(moe_cfg, &groups);
      const engine::EngineConfig cfg = engine_config(n, micro, seed, lr);
      engine::Engine de(dense, cfg, g);
      engine::Engine me(moe_model, cfg, g);
      dense_params = de.param_count();
      moe_params = me.param_count();
      engine::DatasetSource dsrc(train_part, seed), msrc(train_part, seed);
      std::vector<double> ratios, t_dense, t_moe;
      double dropped = 0, routed = 0, a2a_s = 0, moe_s = 0;
      for (int64_t i = 0; i < steps; ++i) {
        auto timed = [&](engine::Engine& e, engine::DatasetSource& src) {
          g.barrier();
          const double t0 = bench::now_seconds();
          e.train_batch(src);
          return bench::slowest(g, bench::now_seconds() - t0);
        };
        double td = 0, tm = 0;
        const double a2a_before = alltoall_seconds(g);  // only the MoE runs all-to-alls
        if (i % 2 == 0) {
          td = timed(de, dsrc), tm = timed(me, msrc);
        } else {
          tm = timed(me, msrc), td = timed(de, dsrc);
        }
        if (i >= warmup) a2a_s += alltoall_seconds(g) - a2a_before, moe_s += tm;
        for (const moe::MoE* layer : moe_model.moe_layers()) {
          dropped += static_cast<double>(layer->stats().dropped);
          routed += static_cast<double>(layer->stats().tokens * layer->options().k);
        }
        if (i < warmup) continue;
        t_dense.push_back(td), t_moe.push_back(tm), ratios.push_back(td / tm);
      }
      engine::DatasetSource held_d(held_out, 1000 + seed), held_m(held_out, 1000 + seed);
      SeedResult r{.seed = seed};
      for (int64_t b = 0; b < eval_batches; ++b) {
        r.dense_eval += de.eval_batch(held_d, b) / static_cast<double>(eval_batches);
        r.moe_eval += me.eval_batch(held_m, b) / static_cast<double>(eval_batches);
      }
      r.dense_tokens_s = tokens_per_step / bench::median(t_dense);
      r.moe_tokens_s = tokens_per_step / bench::median(t_moe);
      r.ratio = bench::median(ratios);
      r.moe_dropped = routed > 0 ? dropped / routed : 0.0;
      r.moe_alltoall_share = moe_s > 0 ? a2a_s / moe_s : 0.0;
      if (g.rank() == 0) {
        std::printf("%6lu %12.0f %12.0f %12.4f %12.4f %8.3f %10.2f %10.1f\n", static_cast<unsigned long>(seed),
                    r.dense_tokens_s, r.moe_tokens_s, r.dense_eval, r.moe_eval, r.ratio, 100.0 * r.moe_dropped,
                    100.0 * r.moe_alltoall_share);
        std::fflush(stdout);
      }
      results.push_back(r);
    }

    std::vector<double> ratio_all, dense_eval, moe_eval;
    bench::Report report;
    report.benchmark = "moe_train_bench";
    report.config = {{"ranks", n},          {"n_layer", gpt.n_layer},    {"d_model", gpt.d_model},
                     {"n_head", gpt.n_head}, {"seq_len", gpt.seq_len},    {"micro_batch_per_rank", micro},
                     {"steps", steps},       {"warmup", warmup},          {"eval_batches", eval_batches},
                     {"experts", experts},   {"k", 2},                    {"expert_hidden", 2 * gpt.d_model},
                     {"every_n_layers", every}, {"ep_size", n},           {"lr", lr},
                     {"zero_stage", 0},      {"data", data_path},         {"dense_params", dense_params},
                     {"moe_params", moe_params}};
    for (const SeedResult& r : results) {
      report.results.push_back(boost::json::object{{"seed", r.seed},
                                                   {"dense_tokens_per_s", r.dense_tokens_s},
                                                   {"moe_tokens_per_s", r.moe_tokens_s},
                                                   {"dense_eval_loss", r.dense_eval},
                                                   {"moe_eval_loss", r.moe_eval},
                                                   {"tokens_per_s_ratio", r.ratio},
                                                   {"moe_dropped_fraction", r.moe_dropped},
                                                   {"moe_alltoall_time_fraction_rank0", r.moe_alltoall_share}});
      ratio_all.push_back(r.ratio), dense_eval.push_back(r.dense_eval), moe_eval.push_back(r.moe_eval);
    }
    double mean_dense = 0, mean_moe = 0;
    for (size_t i = 0; i < results.size(); ++i) mean_dense += dense_eval[i], mean_moe += moe_eval[i];
    mean_dense /= static_cast<double>(results.size());
    mean_moe /= static_cast<double>(results.size());
    report.baseline = {{"dense_eval_loss_mean", mean_dense}};
    report.ratio = boost::json::object{{"tokens_per_s_moe_over_dense_median", bench::median(ratio_all)},
                                       {"eval_loss_moe_minus_dense_mean", mean_moe - mean_dense}};
    if (g.rank() == 0) {
      std::printf("median tokens/s ratio (MoE / dense): %.3f (target >= 0.7); mean held-out loss dense %.4f, MoE %.4f; "
                  "params dense %ld, MoE %ld\n",
                  bench::median(ratio_all), mean_dense, mean_moe, static_cast<long>(dense_params),
                  static_cast<long>(moe_params));
    }
    const std::string path = bench::json_path_arg(argc, argv);
    if (!path.empty() && g.rank() == 0) report.write(path);
    return 0;
  } catch (const std::exception& e) {
    comm::World::abort(std::string("moe_train_bench: ") + e.what(), 1);
  }
}
