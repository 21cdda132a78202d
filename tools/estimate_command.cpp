// `zeroshard estimate`: bytes per rank of the model states at each ZeRO stage and on each tier (device,
// host, NVMe), with every multiplier (estimate/estimate.h holds the rules; docs/memory.md explains them).
// Runs in one process, no MPI.
//
//   zeroshard estimate --params 1.5B --ranks 8 --stage all --dtype bf16
//   zeroshard estimate --params 13B --ranks 1 --stage 3 --offload nvme     # ZeRO-Infinity
//   zeroshard estimate --config run.json --ranks 4 --json                  # the config's offload keys
#include <boost/json/array.hpp>
#include <boost/json/serialize.hpp>
#include <boost/program_options.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <optional>

#include "core/errors.h"
#include "core/json.h"
#include "engine/config.h"
#include "run/run_config.h"
#include "estimate/estimate.h"
#include "estimate/recompute_budget.h"
#include "launch/launch.h"
#include "tools/commands.h"
#include "tools/options.h"

namespace zs::tools {
namespace {

namespace po = boost::program_options;

constexpr const char* kEstimateUsage =
    "usage: zeroshard estimate (--params N | --config FILE) [--ranks R] [--stage 0|1|2|3|all]\n"
    "                          [--dtype fp32|bf16|fp16] [--offload none|cpu|nvme] [--pp-stage S|all] [--json]\n"
    "  N: an integer, 1.5e9, or with a suffix K, M, B (or G), T: 125M, 1.3B\n"
    "  --offload X: the optimizer states (stages 1-3) and the parameters (stage 3) on X; with --config it\n"
    "               replaces the config's offload_optimizer and offload_param (default: the config's, else none)\n"
    "  --pp-stage S: with model.pipeline_parallel_size P > 1, estimate pipeline stage S (0..P-1) only; default all\n"
    "               stages, each on its own, the largest as the figure (--ranks: the world, tp x dp x pp ranks)\n"
    "  With --config the activations are measured on the compute threads each rank of `mpirun -np R zeroshard\n"
    "  train` on this machine gets (its CPUs / R, at least 1; OPENBLAS_NUM_THREADS sets another count, as for\n"
    "  train): per-thread scratch (the fused attention's) depends on it\n";

// "125000000", "1.5e9", "125M", "1.3B", "7b", "2T" -> a positive whole number of parameters.
uint64_t parse_param_count(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return ConfigError(fmt::format("--params: '{}' {}; give a whole number of parameters such as 125000000, 1.5e9, "
                                   "125M or 1.3B",
                                   text, why));
  };
  if (text.empty()) throw bad("is empty");
  std::string number = text;
  double scale = 1.0;
  switch (std::toupper(static_cast<unsigned char>(number.back()))) {
    case 'K': scale = 1e3; break;
    case 'M': scale = 1e6; break;
    case 'B':
    case 'G': scale = 1e9; break;
    case 'T': scale = 1e12; break;
    default: break;
  }
  if (scale != 1.0) number.pop_back();
  if (number.empty() || number.front() == '-' || number.front() == '+') throw bad("is not a positive number");
  uint64_t whole = 0;
  auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), whole);
  if (ec == std::errc() && end == number.data() + number.size() && scale == 1.0) {
    if (whole == 0) throw bad("is zero");
    return whole;
  }
  double value = 0.0;
  auto [dend, dec] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (dec != std::errc() || dend != number.data() + number.size()) throw bad("is not a number");
  value *= scale;
  if (!std::isfinite(value) || value > 9.0e15) throw bad("is too large (at most 9e15)");
  if (value < 1.0) throw bad("is less than one parameter");
  if (std::floor(value) != value) throw bad("is not a whole number");
  return static_cast<uint64_t>(value);
}

std::vector<int> parse_stages(const std::string& text) {
  if (text == "all") return {0, 1, 2, 3};
  if (text.size() == 1 && text[0] >= '0' && text[0] <= '3') return {text[0] - '0'};
  throw ConfigError(fmt::format("--stage: '{}' is not a ZeRO stage; use 0, 1, 2, 3 or all", text));
}

engine::Precision parse_dtype(const std::string& text) {
  if (text == "fp32") return engine::Precision::kFp32;
  if (text == "bf16") return engine::Precision::kBf16;
  if (text == "fp16") return engine::Precision::kFp16;
  throw ConfigError(fmt::format("--dtype: '{}' is not a compute dtype; use fp32, bf16 or fp16", text));
}

engine::OffloadDevice parse_offload(const std::string& text) {
  if (text == "none") return engine::OffloadDevice::kNone;
  if (text == "cpu") return engine::OffloadDevice::kCpu;
  if (text == "nvme") return engine::OffloadDevice::kNvme;
  throw ConfigError(fmt::format("--offload: '{}' is not an offload target; use none, cpu or nvme", text));
}

int parse_pp_stage(const std::string& text, int pp) {
  int s = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), s);
  if (ec != std::errc() || end != text.data() + text.size() || s < 0 || s >= pp) {
    throw ConfigError(fmt::format("--pp-stage: '{}' is not a pipeline stage of model.pipeline_parallel_size {}; use "
                                  "0..{} or all", text, pp, pp - 1));
  }
  return s;
}

// Each pipeline stage's estimate, then the figure: per ZeRO stage, the stage with the largest device
// peak (the rank that needs the most memory). JSON: one estimate object per stage under
// "pipeline_stages" and the figure under "largest"; one stage alone prints as a plain estimate.
void print_pipeline(const std::vector<engine::MemoryEstimate>& per_stage, bool json) {
  if (per_stage.size() == 1) {
    if (json) {
      std::printf("%s\n", boost::json::serialize(engine::estimate_to_json(per_stage.front())).c_str());
    } else {
      std::fputs(engine::format_estimate(per_stage.front()).c_str(), stdout);
    }
    return;
  }
  boost::json::array stages, largest;
  std::string text;
  for (const engine::MemoryEstimate& est : per_stage) {
    stages.push_back(engine::estimate_to_json(est));
    text += fmt::format("== pipeline stage {} of {} ==\n{}\n", est.input.pipeline.stage, est.input.pipeline.stages,
                        engine::format_estimate(est));
  }
  text += fmt::format("largest pipeline stage (the figure: the rank that needs the most device memory):\n");
  for (size_t z = 0; z < per_stage.front().stages.size(); ++z) {
    size_t best = 0;
    uint64_t peak = 0;
    for (size_t s = 0; s < per_stage.size(); ++s) {
      uint64_t p = 0;
      for (const engine::ShardGroup& g : per_stage[s].stages[z].shards) p = std::max(p, g.device_peak.bytes);
      if (s == 0 || p > peak) {
        best = s;
        peak = p;
      }
    }
    const int zero = per_stage[best].stages[z].stage;
    text += fmt::format("  ZeRO stage {}: pipeline stage {}, device peak {} ({} bytes)\n", zero,
                        per_stage[best].input.pipeline.stage, engine::format_bytes(peak), peak);
    largest.push_back(boost::json::object{{"zero_stage", zero},
                                          {"pipeline_stage", per_stage[best].input.pipeline.stage},
                                          {"device_peak_bytes", peak}});
  }
  if (json) {
    boost::json::object o{{"pipeline_parallel_size", per_stage.front().input.pipeline.stages},
                          {"pipeline_stages", std::move(stages)},
                          {"largest", std::move(largest)}};
    std::printf("%s\n", boost::json::serialize(o).c_str());
  } else {
    std::fputs(text.c_str(), stdout);
  }
}

int run(const po::variables_map& vm) {
  const bool have_params = vm.count("params") > 0;
  const bool have_config = vm.count("config") > 0;
  if (!have_params && !have_config) {
    throw ConfigError("estimate: give the model size with --params N (e.g. 1.5B) or a config with --config FILE");
  }
  const int ranks = vm["ranks"].as<int>();
  if (ranks < 1) throw ConfigError(fmt::format("--ranks: must be at least 1, got {}", ranks));
  const std::vector<int> stages = parse_stages(vm["stage"].as<std::string>());
  std::optional<uint64_t> n_params;
  if (have_params) n_params = parse_param_count(vm["params"].as<std::string>());
  std::optional<engine::OffloadDevice> offload;
  if (vm.count("offload")) offload = parse_offload(vm["offload"].as<std::string>());
  if (offload && *offload != engine::OffloadDevice::kNone &&
      std::all_of(stages.begin(), stages.end(), [](int s) { return s == 0; })) {
    throw ConfigError(fmt::format("--offload {}: offload needs ZeRO stage 1, 2 or 3 (the optimizer's stepped partition and "
                                  "the stage-3 parameter shard are what move); use --stage 1, 2, 3 or all",
                                  engine::offload_device_name(*offload)));
  }

  engine::EstimateInput in;
  const std::string pp_stage = vm["pp-stage"].as<std::string>();
  if (have_config) {
    // Note [estimate threads]: the measured run (estimate/measure.h) allocates what the layers do, and
    // some size scratch per compute thread (nn/fused_attention.cpp: two score blocks per chunk of work), so
    // it runs on the threads a rank of the estimated run gets, as `zeroshard train` sets them for R
    // ranks on this machine, not on every CPU of this lone process: a ZB-H1 stage, whose peak falls in
    // an attention backward, was otherwise estimated one thread's scratch too high at R = 2 on 2 CPUs.
    launch::set_blas_threads(ranks);
    // The config is validated as for a run on `ranks` ranks (its batch arithmetic included).
    run::RunConfig cfg = run::parse_run_config(parse_json_file(vm["config"].as<std::string>()), ranks);
    for (const std::string& note : cfg.notes) ZS_LOG_WARN("config: {}", note);  // one process: logged once
    if (vm.count("dtype")) cfg.precision = parse_dtype(vm["dtype"].as<std::string>());
    // activation_checkpointing.device_budget_mb: the blocks a run would recompute, at the config's stage.
    const engine::RecomputeChoice rc = engine::resolve_recompute_budget(cfg, ranks);
    if (rc.applies) {
      ZS_LOG_INFO("activation_checkpointing: device budget {} MiB -> recompute the first {} of {} blocks (predicted "
                  "device peak {} bytes at ZeRO stage {}); the estimate below uses that choice",
                  rc.budget_bytes >> 20, rc.blocks, rc.n_layer, rc.predicted_peak_bytes, cfg.zero.stage);
    }
    const int pp = cfg.model ? cfg.pipeline.pipeline_parallel_size : 1;
    if (pp > 1) {
      std::vector<int> zero_stages = stages;
      // ZeRO-3 is refused with pipelines (Note [pipeline stages in the engine]): "all" means 0-2 there.
      if (vm["stage"].as<std::string>() == "all") zero_stages = {0, 1, 2};
      std::vector<int> pipeline_stages;
      if (pp_stage == "all") {
        for (int s = 0; s < pp; ++s) pipeline_stages.push_back(s);
      } else {
        pipeline_stages.push_back(parse_pp_stage(pp_stage, pp));
      }
      std::vector<engine::MemoryEstimate> per_stage;
      for (int s : pipeline_stages) {
        engine::EstimateInput stage_in = engine::estimate_input_for_config(cfg, ranks, n_params, s);
        if (offload) stage_in.offload_optimizer = stage_in.offload_param = *offload;
        per_stage.push_back(engine::estimate_memory(stage_in, zero_stages));
      }
      print_pipeline(per_stage, vm.count("json") > 0);
      return 0;
    }
    in = engine::estimate_input_for_config(cfg, ranks, n_params);
  }
  if (pp_stage != "all") {  // reached without a pipeline
    throw ConfigError(fmt::format("--pp-stage {}: the config has no pipeline (model.pipeline_parallel_size 1); drop "
                                  "--pp-stage", pp_stage));
  }
  if (!have_config) {
    const std::string dtype = vm.count("dtype") ? vm["dtype"].as<std::string>() : "bf16";
    in = engine::estimate_input_for_params(*n_params, ranks, parse_dtype(dtype));
  }
  if (offload) {  // both kinds: ZeRO-Offload at stages 1-2, ZeRO-Infinity (parameters too) at stage 3
    in.offload_optimizer = *offload;
    in.offload_param = *offload;
  }
  engine::MemoryEstimate est = engine::estimate_memory(in, stages);
  if (vm.count("json")) {
    std::printf("%s\n", boost::json::serialize(engine::estimate_to_json(est)).c_str());
  } else {
    std::fputs(engine::format_estimate(est).c_str(), stdout);
  }
  return 0;
}

}  // namespace

int estimate_command(const std::vector<std::string>& args) {
  po::options_description opts("options");
  opts.add_options()("help,h", "show this help")("params", po::value<std::string>(),
                                                 "model parameters: 125000000, 1.5e9, 125M, 1.3B")(
      "config", po::value<std::string>(), "DeepSpeed-style JSON config (model, precision, optimizer, zero keys)")(
      "ranks", po::value<int>()->default_value(1), "data-parallel ranks R")(
      "stage", po::value<std::string>()->default_value("all"), "ZeRO stage 0, 1, 2, 3 or all")(
      "dtype", po::value<std::string>(), "compute dtype fp32, bf16 or fp16 (default: the config's, else bf16)")(
      "offload", po::value<std::string>(),
      "offload none, cpu or nvme: optimizer states (stages 1-3) and parameters (stage 3); default: the config's, else none")(
      "pp-stage", po::value<std::string>()->default_value("all"),
      "pipeline stage 0..P-1 to estimate, or all (model.pipeline_parallel_size P > 1)")(
      "json", "print the estimate as one JSON object on stdout");
  po::variables_map vm;
  if (const std::optional<int> code = parse_or_help("estimate", args, opts, kEstimateUsage, vm)) return *code;
  return run_reporting_errors(run, vm);
}

}  // namespace zs::tools
