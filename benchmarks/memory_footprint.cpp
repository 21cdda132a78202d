// Question: how many bytes of model states does each rank hold at ZeRO stages 0-3, measured in a real
// training run, against the ZeRO paper's formula (bf16 + Adam: 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N,
// Ψ = the model's parameter count) and the engine's own estimator (estimate/estimate.h)? Beside them:
// the device arena's allocated and reserved peaks and the activation peak.
//
//   mpirun -np N build/release/benchmarks/memory_footprint [--json out.json] [--stages 0,1,2,3]
//          [--n-layer 4] [--d-model 768] [--n-head 12] [--seq-len 128] [--micro-batch 2] [--vocab 256]
//          [--steps 2] [--precision bf16|fp32] [--memory-mb 1536] [--bucket 2000000]
//          [--release-fp32-grad 1|0] [--reuse-fp32-param 0|1]
//   benchmarks/memory_footprint.sh BUILD_DIR     runs np 1..4, merges the JSONs, draws the chart
//
// Default model: GPT n_layer 4, d_model 768 (GPT-2 small's width), n_head 12, seq_len 128, byte
// vocabulary, 28.6 M parameters. Big enough that the FlatLayout's per-parameter padding to 32 elements
// (at most 31 x 52 parameters) and the shard rounding are below 0.01% of Ψ, so the paper's formula with
// Ψ = the real count is a fair target; small enough that a step takes a fraction of a second.
//
// Method. In one process run, for each stage: build the GPT and an Engine on the world group (own
// device arena, so peaks are per stage), train `--steps` optimizer steps on the built-in corpus, then
// gather every rank's Engine::memory_report() to rank 0 (allgather of uint64 fields sent as int32
// pairs, as engine/summary.cpp does). Per rank:
//   measured   = model_states_bytes {params, grads, optimizer} (the engine's flat buffers)
//   estimator  = engine::model_state_bytes(estimate_input_for_config(cfg, N), stage, rank): exact
//   paper      = the ZeRO paper's per-category figures with Ψ = Engine::param_count():
//                params b·Ψ (stage 3: b·Ψ/N), grads b·Ψ (stages 2-3: b·Ψ/N),
//                optimizer (m + k)·Ψ (stages 1-3: (m + k)·Ψ/N); bf16 b 2, m 4, k 8
//   deviation  = (measured total - paper total) / paper total, in percent (target: |dev| <= 2%).
// The JSON's ratio is rank 0's model states at each stage over stage 0's, same run.
// Memory modes (engine/config.h MemoryModes): --release-fp32-grad 0 keeps a persistent fp32 gradient
// copy of the stepped elements (+4·Ψ, stages 1-3 +4·Ψ/N, in grads); --reuse-fp32-param 1 stores the
// bf16 master as the parameter plus a 2-byte residual (m = 2 instead of 4). The paper column follows
// the mode, so the deviation still checks the engine against the formula.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "benchmarks/support/bench_args.h"
#include "benchmarks/support/bench_json.h"
#include "comm/comm.h"
#include "core/errors.h"
#include "core/log.h"
#include "engine/config.h"
#include "engine/dataset_source.h"
#include "engine/engine.h"
#include "estimate/estimate.h"
#include "launch/launch.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "run/run_config.h"

using namespace zs;

namespace {

std::vector<int> stages_arg(int argc, char** argv) {
  const std::string v = bench::arg_value(argc, argv, "--stages", "0,1,2,3");
  std::vector<int> stages;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] == ',') continue;
    if (v[i] < '0' || v[i] > '3' || (i + 1 < v.size() && v[i + 1] != ',')) {
      throw ConfigError(fmt::format("--stages expects a comma list of 0..3 (e.g. 0,1,2,3), got '{}'", v));
    }
    stages.push_back(v[i] - '0');
  }
  if (stages.empty()) throw ConfigError("--stages is empty: give e.g. --stages 0,3");
  return stages;
}

// Per-rank figures gathered to every rank, in this order.
enum Field : size_t {
  kParams, kGrads, kOptimizer, kDevicePeak, kReservedPeak, kActivationPeak, kStagingPeak, kGatheredPeak,
  kGatheredBound, kFieldCount
};
using Fields = std::array<uint64_t, kFieldCount>;

std::vector<Fields> gather_fields(const comm::Group& group, const Fields& mine) {
  std::vector<Fields> all(static_cast<size_t>(group.size()));
  if (group.size() == 1) {
    all[0] = mine;
    return all;
  }
  Fields in = mine;
  // The collectives move bytes as they are: each uint64 travels as two int32.
  group.allgather(memory::Tensor(in.data(), memory::DType::kI32, {static_cast<int64_t>(2 * kFieldCount)}),
                  memory::Tensor(all.data(), memory::DType::kI32, {static_cast<int64_t>(2 * kFieldCount * all.size())}));
  return all;
}

struct PaperBytes {
  double params = 0, grads = 0, optimizer = 0;
  double total() const { return params + grads + optimizer; }
};

// The ZeRO paper's per-rank figures (Ψ the real parameter count, no padding).
PaperBytes paper_bytes(int stage, double psi, int ranks, double b, double m, double k, double fp32_grad) {
  const double n = ranks;
  return {.params = b * (stage == 3 ? psi / n : psi),
          .grads = b * (stage >= 2 ? psi / n : psi) + fp32_grad * (stage >= 1 ? psi / n : psi),
          .optimizer = (m + k) * (stage >= 1 ? psi / n : psi)};
}

// The per-rank formula with b bytes per parameter, m master bytes, k = 8 state bytes and an optional
// persistent fp32 gradient copy g (bytes per stepped element).
std::string paper_formula(int stage, engine::Precision p, double m, double g) {
  const int b = p == engine::Precision::kFp32 ? 4 : 2;
  const int total = static_cast<int>(2 * b + m + 8 + g);
  const int sharded_opt = static_cast<int>(m + 8 + g);
  switch (stage) {
    case 0: return fmt::format("{}Ψ", total);
    case 1: return fmt::format("{}Ψ + {}Ψ/N", 2 * b, sharded_opt);
    case 2: return fmt::format("{}Ψ + {}Ψ/N", b, b + sharded_opt);
    default: return fmt::format("{}Ψ/N", total);
  }
}

double mib(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

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
        argc, argv, {.n_layer = 4, .d_model = 768, .n_head = 12, .seq_len = 128, .vocab_size = 256});
    const int64_t micro = bench::int_arg(argc, argv, "--micro-batch", 2);
    const int64_t steps = bench::int_arg(argc, argv, "--steps", 2);
    const int64_t bucket = bench::int_arg(argc, argv, "--bucket", 2'000'000);
    const std::vector<int> stages = stages_arg(argc, argv);
    const std::string precision = bench::arg_value(argc, argv, "--precision", "bf16");
    if (precision != "bf16" && precision != "fp32") {
      throw ConfigError(fmt::format("--precision expects bf16 or fp32, got '{}'", precision));
    }

    zs::run::RunConfig base;
    base.batch = engine::resolve_batch(0, micro, 1, ranks);
    base.model = gcfg;
    base.precision = precision == "bf16" ? engine::Precision::kBf16 : engine::Precision::kFp32;
    base.device.memory_mb = bench::int_arg(argc, argv, "--memory-mb", 1536);
    base.zero.reduce_bucket_size = bucket;
    base.zero.allgather_bucket_size = bucket;
    base.zero.stage3_prefetch_bucket_size = bucket;
    const double b = base.precision == engine::Precision::kFp32 ? 4 : 2;
    base.memory.release_fp32_grad = bench::int_arg(argc, argv, "--release-fp32-grad", 1, 0) != 0;
    base.memory.reuse_fp32_param = bench::int_arg(argc, argv, "--reuse-fp32-param", 0, 0) != 0;
    if (base.memory.reuse_fp32_param && base.precision != engine::Precision::kBf16) {
      throw ConfigError("--reuse-fp32-param 1 needs --precision bf16");
    }
    const bool mixed = base.precision != engine::Precision::kFp32;
    const double m = !mixed ? 0 : base.memory.reuse_fp32_param ? 2 : 4;
    const double fp32_grad = mixed && !base.memory.release_fp32_grad ? 4 : 0;
    const double k = 8;  // Adam/AdamW: two fp32 moments

    engine::DatasetSource source(nn::Dataset::builtin(gcfg.seq_len), 7);
    bench::Report report;
    report.benchmark = "memory_footprint";
    int64_t psi_real = 0;
    uint64_t flat = 0;
    uint64_t stage0_rank0 = 0;
    boost::json::object ratios;
    double worst_dev = 0;

    for (int stage : stages) {
      zs::run::RunConfig cfg = base;
      cfg.zero.stage = stage;
      nn::GptModel model(gcfg);
      engine::Engine eng(model, cfg, group);
      psi_real = eng.param_count();
      std::vector<double> losses, step_s;
      for (int64_t i = 0; i < steps; ++i) {
        group.barrier();
        const double t0 = bench::now_seconds();
        losses.push_back(eng.train_batch(source).loss);
        step_s.push_back(bench::now_seconds() - t0);
      }
      const engine::Engine::MemoryReport mem = eng.memory_report();
      const Fields mine = {mem.model_states.params,   mem.model_states.grads,     mem.model_states.optimizer,
                           mem.device_peak_bytes,     mem.device_reserved_peak_bytes, mem.activation_peak_bytes,
                           mem.grad_staging_peak_bytes, mem.gathered_param_peak_bytes, mem.gathered_param_bound_bytes};
      const std::vector<Fields> all = gather_fields(group, mine);

      const engine::EstimateInput est_in = engine::estimate_input_for_config(cfg, ranks);
      flat = est_in.model.flat_elements;
      const engine::StageEstimate est = engine::estimate_stage(est_in, stage);
      const PaperBytes paper = paper_bytes(stage, static_cast<double>(psi_real), ranks, b, m, k, fp32_grad);

      boost::json::array per_rank;
      double stage_worst = 0;
      bool estimator_exact = true;
      for (int r = 0; r < ranks; ++r) {
        const Fields& v = all[static_cast<size_t>(r)];
        const uint64_t total = v[kParams] + v[kGrads] + v[kOptimizer];
        const engine::StateBytes e = engine::model_state_bytes(est_in, stage, r);
        const bool exact = e.params == v[kParams] && e.grads == v[kGrads] && e.optimizer == v[kOptimizer];
        estimator_exact = estimator_exact && exact;
        const double dev = 100.0 * (static_cast<double>(total) - paper.total()) / paper.total();
        if (std::abs(dev) > std::abs(stage_worst)) stage_worst = dev;
        per_rank.push_back(boost::json::object{
            {"rank", r},
            {"model_states_bytes", {{"params", v[kParams]}, {"grads", v[kGrads]}, {"optimizer", v[kOptimizer]}, {"total", total}}},
            {"estimator_bytes", {{"params", e.params}, {"grads", e.grads}, {"optimizer", e.optimizer}, {"total", e.total()}}},
            {"estimator_exact", exact},
            {"deviation_from_paper_pct", dev},
            {"device_peak_bytes", v[kDevicePeak]},
            {"device_reserved_peak_bytes", v[kReservedPeak]},
            {"activation_peak_bytes", v[kActivationPeak]},
            {"grad_staging_peak_bytes", v[kStagingPeak]},
            {"gathered_param_peak_bytes", v[kGatheredPeak]},
            {"gathered_param_bound_bytes", v[kGatheredBound]}});
      }
      if (std::abs(stage_worst) > std::abs(worst_dev)) worst_dev = stage_worst;
      const uint64_t rank0_total = all[0][kParams] + all[0][kGrads] + all[0][kOptimizer];
      if (stage == 0) stage0_rank0 = rank0_total;
      if (stage0_rank0 > 0) {
        ratios[fmt::format("stage{}_over_stage0", stage)] = static_cast<double>(rank0_total) / static_cast<double>(stage0_rank0);
      }
      boost::json::array loss_json, step_json;
      for (double l : losses) loss_json.push_back(l);
      for (double t : step_s) step_json.push_back(t);
      report.results.push_back(boost::json::object{
          {"stage", stage},
          {"world_size", ranks},
          {"paper_formula", paper_formula(stage, base.precision, m, fp32_grad)},
          {"paper_bytes", {{"params", paper.params}, {"grads", paper.grads}, {"optimizer", paper.optimizer}, {"total", paper.total()}}},
          {"activation_peak_estimate_bytes", est.activations_peak.bytes},
          {"max_abs_deviation_pct", std::abs(stage_worst)},
          {"estimator_exact", estimator_exact},
          {"loss_history", loss_json},
          {"step_s", step_json},
          {"per_rank", per_rank}});

      if (root) {
        if (stage == stages.front()) {
          std::printf("memory_footprint: GPT n_layer %lld d_model %lld n_head %lld seq_len %lld vocab %lld, Ψ = %lld "
                      "parameters (flat %llu), %s + AdamW, micro batch %lld, %d rank(s), %d BLAS thread(s) each, "
                      "%lld step(s) per stage\n\n",
                      (long long)gcfg.n_layer, (long long)gcfg.d_model, (long long)gcfg.n_head, (long long)gcfg.seq_len,
                      (long long)gcfg.vocab_size, (long long)psi_real, (unsigned long long)flat, precision.c_str(),
                      (long long)micro, ranks, threads, (long long)steps);
          std::printf("%5s %4s %11s %11s %11s %11s %11s %8s %5s %11s %11s %11s  (MiB per rank)\n", "stage", "rank",
                      "params", "grads", "optimizer", "total", "paper", "dev %", "est=", "dev peak", "reserved",
                      "activ pk");
        }
        for (int r = 0; r < ranks; ++r) {
          const auto& o = per_rank[static_cast<size_t>(r)].as_object();
          const Fields& v = all[static_cast<size_t>(r)];
          std::printf("%5d %4d %11.2f %11.2f %11.2f %11.2f %11.2f %+8.4f %5s %11.2f %11.2f %11.2f\n", stage, r,
                      mib(v[kParams]), mib(v[kGrads]), mib(v[kOptimizer]), mib(v[kParams] + v[kGrads] + v[kOptimizer]),
                      paper.total() / (1 << 20), o.at("deviation_from_paper_pct").as_double(),
                      o.at("estimator_exact").as_bool() ? "yes" : "NO", mib(v[kDevicePeak]), mib(v[kReservedPeak]),
                      mib(v[kActivationPeak]));
        }
        std::printf("      paper %s; losses", paper_formula(stage, base.precision, m, fp32_grad).c_str());
        for (double l : losses) std::printf(" %.5f", l);
        std::printf("\n");
      }
    }

    report.config = {{"n_layer", gcfg.n_layer},   {"d_model", gcfg.d_model},
                     {"n_head", gcfg.n_head},     {"seq_len", gcfg.seq_len},
                     {"vocab_size", gcfg.vocab_size}, {"micro_batch", micro},
                     {"ranks", ranks},            {"precision", precision},
                     {"release_fp32_grad", base.memory.release_fp32_grad},
                     {"reuse_fp32_param", base.memory.reuse_fp32_param},
                     {"optimizer", "AdamW"},      {"params", psi_real},
                     {"flat_elements", flat},     {"steps", steps},
                     {"bucket_elements", bucket}, {"memory_mb", base.device.memory_mb},
                     {"blas_threads_per_rank", threads}};
    report.baseline = {{"what", "stage 0 model states of rank 0, same run (paper: 16Ψ)"}, {"bytes", stage0_rank0}};
    ratios["max_abs_deviation_from_paper_pct"] = std::abs(worst_dev);
    report.ratio = ratios;
    if (root) {
      std::printf("\nlargest |deviation| from the paper's formula: %.4f%% (target <= 2%%)\n", std::abs(worst_dev));
    }
    const std::string path = bench::json_path_arg(argc, argv);
    if (!path.empty() && root) report.write(path);
    return 0;
  } catch (const std::exception& e) {
    comm::World::abort(std::string("memory_footprint: ") + e.what(), 1);
  }
}
