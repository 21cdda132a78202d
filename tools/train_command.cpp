// `zeroshard train`: trains the config's GPT on the config's data (or the built-in corpus).
//
// Note [errors across ranks]: set-up errors (a bad config, a missing data file, a model that does not
// fit) are agreed across ranks: every rank learns that some rank failed, the lowest failing rank
// prints its one message, and every rank exits 1 - no MPI_Abort banner, no hang. Once training runs,
// an error on one rank cannot be agreed on (the others may be blocked in a collective), so that rank
// prints its message and ends the whole job with World::abort.
#include <boost/program_options.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "comm/agree.h"
#include "comm/topology.h"
#include "comm/world.h"
#include "core/errors.h"
#include "core/json.h"
#include "core/log.h"
#include "engine/config.h"
#include "run/hf_weights.h"
#include "run/run_config.h"
#include "engine/dataset_source.h"
#include "engine/engine.h"
#include "core/clock.h"
#include "launch/launch.h"
#include "launch/preemption.h"
#include "offload/swap_space.h"
#include "engine/summary.h"
#include "estimate/recompute_budget.h"
#include "estimate/config_fit.h"
#include "nn/data.h"
#include "nn/flops.h"
#include "moe/gpt_moe.h"
#include "nn/gpt.h"
#include "tp/gpt.h"
#include "run/gpt_pipeline.h"
#include "tools/commands.h"
#include "tools/moe_report.h"
#include "tools/options.h"

namespace zs::tools {
namespace {

namespace po = boost::program_options;

constexpr const char* kTrainUsage =
    "usage: zeroshard train --config FILE [--steps N] [--summary FILE.json] [--save DIR]\n"
    "                       [--load DIR [--load-tag TAG] | --init-from WEIGHTS]\n"
    "  --load DIR: a checkpoint directory (resumes from the tag its `latest` file names) or one tag's\n"
    "              directory (DIR/global_step15); --load-tag TAG picks another tag of DIR\n"
    "  --init-from WEIGHTS: start from safetensors weights (a directory with model.safetensors or its\n"
    "              index, or a file): Hugging Face's names for model.type gpt2 and llama\n";

struct TrainArgs {
  std::string config;
  std::optional<int64_t> steps;
  std::string summary;
  std::string save;  // checkpoint directory to save to (else checkpoint.dir)
  std::string load;      // checkpoint directory to resume from (its `latest` tag), or one tag's directory
  std::string load_tag;  // --load-tag: the tag under `load` instead of `latest`
  std::string init_from;  // --init-from: safetensors weights to start from (run/hf_weights.h)
};

// Returns nullopt after printing usage (exit code in `code`).
std::optional<TrainArgs> parse_args(const std::vector<std::string>& args, int& code) {
  po::options_description opts("options");
  opts.add_options()("help,h", "show this help")("config", po::value<std::string>(), "DeepSpeed-style JSON config file")(
      "steps", po::value<int64_t>(), "optimizer steps to run (default: the config's train_steps)")(
      "summary", po::value<std::string>(), "write the run summary JSON here (rank 0)")(
      "save", po::value<std::string>(),
      "save checkpoints here every checkpoint.save_interval steps and at the end (default: checkpoint.dir)")(
      "load", po::value<std::string>(),
      "resume from the latest checkpoint here, or from the tag directory given (any world size, ZeRO stage or "
      "offload); --steps stays the total")(
      "load-tag", po::value<std::string>(), "with --load DIR: resume from this tag of DIR instead of its latest")(
      "init-from", po::value<std::string>(),
      "start from safetensors weights (model.safetensors, its index, or a directory holding either); each rank "
      "reads only the elements it holds");
  po::variables_map vm;
  if (const std::optional<int> ended = parse_or_help("train", args, opts, kTrainUsage, vm)) {
    code = *ended;
    return std::nullopt;
  }
  if (!vm.count("config")) {
    std::fprintf(stderr, "zeroshard train: --config FILE is required\n%s", kTrainUsage);
    code = 2;
    return std::nullopt;
  }
  TrainArgs a;
  a.config = vm["config"].as<std::string>();
  if (vm.count("steps")) {
    a.steps = vm["steps"].as<int64_t>();
    if (*a.steps < 1) {
      std::fprintf(stderr, "zeroshard train: --steps must be >= 1, got %lld\n", static_cast<long long>(*a.steps));
      code = 2;
      return std::nullopt;
    }
  }
  if (vm.count("summary")) a.summary = vm["summary"].as<std::string>();
  if (vm.count("save")) a.save = vm["save"].as<std::string>();
  if (vm.count("load")) a.load = vm["load"].as<std::string>();
  if (vm.count("load-tag")) a.load_tag = vm["load-tag"].as<std::string>();
  if (vm.count("init-from")) a.init_from = vm["init-from"].as<std::string>();
  if (!a.init_from.empty() && !a.load.empty()) {
    std::fprintf(stderr, "zeroshard train: --init-from and --load both set the starting weights; use --load to resume "
                         "a run, --init-from to start one from safetensors weights\n%s", kTrainUsage);
    code = 2;
    return std::nullopt;
  }
  if (!a.load_tag.empty() && a.load.empty()) {
    std::fprintf(stderr, "zeroshard train: --load-tag needs --load DIR (the checkpoint directory holding the tag)\n%s",
                 kTrainUsage);
    code = 2;
    return std::nullopt;
  }
  return a;
}

// Runs `fn` on every rank and agrees on the outcome (Note [errors across ranks] above;
// comm::agree_outcome in comm/agree.h).
// Returns true when every rank succeeded; otherwise the lowest failing rank has printed its message.
template <typename F>
bool agree(const comm::Group& group, F&& fn) {
  std::exception_ptr local;
  try {
    fn();
  } catch (const std::exception&) {
    local = std::current_exception();
  }
  std::optional<comm::RankFailure> failure;
  try {
    failure = comm::agree_outcome(group, local);
  } catch (const CommError& e) {
    // The agreement itself failed (another rank is in a different collective, or gone): no rank can
    // learn the outcome, so this one ends the job, with its own error first when it had one.
    std::string mine;
    try {
      if (local) std::rethrow_exception(local);
    } catch (const std::exception& x) {
      mine = x.what();
    }
    comm::World::abort(mine.empty() ? std::string(e.what()) : fmt::format("{} (agreeing on it across ranks failed: {})", mine, e.what()), 1);
  }
  if (!failure) return true;
  if (failure->rank == group.rank()) {
    if (group.size() > 1) std::fprintf(stderr, "zeroshard: rank %d: error: %s\n", group.rank(), failure->message.c_str());
    else std::fprintf(stderr, "zeroshard: error: %s\n", failure->message.c_str());
  }
  return false;
}

// Rank 0 reads the config file and every rank gets the same bytes, so every rank validates the same
// text (a file that differs between nodes cannot split the job).
std::string read_config_everywhere(const comm::Group& group, const std::string& path) {
  std::string text;
  int32_t header[2] = {0, 0};  // {ok, length}
  if (group.rank() == 0) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      text = fmt::format("--config: cannot read '{}': check the path (the file must exist and be readable)", path);
      header[0] = 0;
    } else {
      std::ostringstream s;
      s << in.rdbuf();
      text = s.str();
      header[0] = 1;
    }
    header[1] = static_cast<int32_t>(text.size());
  }
  if (group.size() > 1) {
    group.broadcast(memory::Tensor(header, memory::DType::kI32, {2}), 0);
    std::vector<int32_t> words((static_cast<size_t>(header[1]) + 3) / 4 + 1, 0);
    if (group.rank() == 0) std::memcpy(words.data(), text.data(), text.size());
    group.broadcast(memory::Tensor(words.data(), memory::DType::kI32, {static_cast<int64_t>(words.size())}), 0);
    text.assign(reinterpret_cast<const char*>(words.data()), static_cast<size_t>(header[1]));
  }
  if (!header[0]) throw ConfigError(text);
  return text;
}

// --load DIR [--load-tag TAG] -> (checkpoint root, tag; "" for the root's `latest`). A tag directory
// (one holding the metadata file, as `zeroshard checkpoint inspect` accepts) stands for its parent
// and its own name.
std::pair<std::string, std::string> load_target(const TrainArgs& a) {
  if (!a.load_tag.empty()) return {a.load, a.load_tag};
  std::filesystem::path dir = std::filesystem::path(a.load).lexically_normal();
  if (!dir.has_filename() && dir.has_parent_path()) dir = dir.parent_path();  // "ckpt/global_step15/"
  std::error_code ec;
  if (std::filesystem::is_regular_file(dir / checkpoint::kMetadataFile, ec) && dir.has_filename()) {
    const std::filesystem::path parent = dir.has_parent_path() ? dir.parent_path() : std::filesystem::path(".");
    return {parent.string(), dir.filename().string()};
  }
  return {a.load, ""};
}

std::string mib(uint64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

// data.eval_interval > 0: the last data.eval_fraction of the corpus becomes the held-out split (returned)
// and `data` keeps the rest, so training never samples a held-out window.
nn::Dataset split_held_out(nn::Dataset& data, double fraction) {
  const uint64_t size = data.num_tokens();
  const auto held = static_cast<uint64_t>(std::llround(static_cast<double>(size) * fraction));
  try {
    nn::Dataset eval = data.slice(size - held, size, data.origin() + " (held-out tail)");
    data = data.slice(0, size - held, data.origin() + " (training part)");
    return eval;
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("data.eval_fraction: {} of {} {} leaves a part too small: {}", fraction, size,
                                  data.format() == nn::DataFormat::kText ? "bytes" : "tokens", e.what()));
  }
}

// "N bytes" for a text; tokens, segments and those sampled for token files.
std::string data_size_text(const nn::Dataset& d) {
  if (d.format() == nn::DataFormat::kText) return fmt::format("{} bytes", d.num_tokens());
  return fmt::format("{} format, {} tokens in {} {}, {} long enough for a window", nn::data_format_name(d.format()),
                     d.num_tokens(), d.num_segments(), d.format() == nn::DataFormat::kLlmc ? "shard(s)" : "document(s)",
                     d.num_sampled_segments());
}

}  // namespace

int train_command(const std::vector<std::string>& args) {
  int code = 0;
  std::optional<TrainArgs> a = parse_args(args, code);
  if (!a) return code;

  std::optional<comm::World> started;
  try {
    started.emplace(comm::World::create());
  } catch (const std::exception& e) {
    // MPI could not start: there is no job to end, only this process.
    std::fprintf(stderr, "zeroshard: error: %s\n", e.what());
    return 1;
  }
  comm::World& world = *started;
  const comm::Group& everyone = world.group();
  init_logging({world.rank(), world.size()});
  launch::set_blas_threads(launch::local_rank_count());

  run::RunConfig cfg;
  engine::RecomputeChoice recompute;  // activation_checkpointing.device_budget_mb
  if (!agree(everyone, [&] {
        std::string text = read_config_everywhere(everyone, a->config);
        cfg = run::parse_run_config(parse_json_text(text, a->config), world.size());
        // Before the model is built: a model that cannot fit is refused from the arithmetic alone.
        engine::check_config_fits(cfg, world.size(), engine::FitCapacity::of_this_host());
        recompute = engine::resolve_recompute_budget(cfg, world.size());  // before training: a too-small budget fails here
      })) {
    return 1;
  }
  init_logging({world.rank(), world.size()}, cfg.log);
  // Every rank parsed the same bytes into the same notes; warnings print on every rank, so rank 0 alone
  // logs them (EngineConfig::notes).
  if (world.rank() == 0) {
    for (const std::string& note : cfg.notes) ZS_LOG_WARN("config: {}", note);
  }
  if (recompute.applies && world.rank() == 0) {
    ZS_LOG_INFO("activation_checkpointing: device budget {} -> recompute the first {} of {} blocks (predicted device peak "
                "{}; {} without recompute; {} estimator runs)",
                mib(recompute.budget_bytes), recompute.blocks, recompute.n_layer, mib(recompute.predicted_peak_bytes),
                mib(recompute.none_peak_bytes), recompute.measurements);
  }
  if (a->steps) cfg.train_steps = *a->steps;
  nn::GptConfig model_cfg = cfg.model.value_or(nn::GptConfig{});
  if (!cfg.model) {
    // No model section: the default GPT takes DeepSpeed's model-side sections as a written one does
    // (parse_run_config seeds them and hands them to the model sections it reads).
    model_cfg.sparse_attention = cfg.sparse_attention;
    model_cfg.layer_drop = cfg.progressive_layer_drop;
  }

  std::unique_ptr<comm::Group> dp;
  std::optional<comm::ExpertGroups> expert_groups;  // model.moe: a comm::Topology's dp/ep/edp over dp
  // model.tensor_parallel_size > 1: a comm::Topology over every rank (its "dp" and "tp" groups); the
  // data come by dp rank, every tp rank of a replica computing on the same micro-batch.
  // model.pipeline_parallel_size > 1 the same way: its "pp" group links the stages (run/gpt_pipeline.h).
  const int tp_size = cfg.tensor_parallel.tensor_parallel_size;
  const int pp_size = cfg.pipeline.pipeline_parallel_size;
  std::unique_ptr<comm::Group> job;  // every rank, with the config's comm settings (tp or pp > 1)
  std::optional<comm::Topology> topology;
  const comm::Group* data_parallel = nullptr;
  const comm::Group* tensor_parallel = nullptr;
  const comm::Group* pipeline_parallel = nullptr;
  moe::GptMoeModel* moe_model = nullptr;
  std::unique_ptr<nn::Model> model;
  std::unique_ptr<engine::DatasetSource> source;
  std::unique_ptr<engine::DatasetSource> eval_source;  // data.eval_interval > 0
  std::unique_ptr<engine::Engine> engine;
  if (!agree(everyone, [&] {
        const comm::CommConfig comm_config{.timeout_s = cfg.comm.timeout_s, .shared_memory = cfg.comm.shared_memory};
        if (tp_size > 1 || pp_size > 1) {
          job = std::make_unique<comm::Group>(everyone.dup("world", comm_config));
          // With model.moe the Topology's "ep" groups join the same tp rank of ep_size replicas (Note
          // [experts under tensor parallelism] in moe/gpt_moe.cpp); the engine forms the matching edp.
          topology.emplace(*job, comm::TopologyConfig{.tensor_parallel_size = tp_size,
                                                      .pipeline_parallel_size = pp_size,
                                                      .expert_parallel_size = cfg.model_moe ? cfg.model_moe->moe.ep_size : 1});
          data_parallel = &topology->data_parallel();
          tensor_parallel = &topology->tensor_parallel();
          if (pp_size > 1) pipeline_parallel = &topology->pipeline_parallel();
          if (cfg.model_moe) {
            expert_groups.emplace(comm::ExpertGroups{data_parallel->dup("dp", comm_config), topology->take_expert_parallel(),
                                                     topology->take_expert_data_parallel()});
          }
        } else {
          dp = std::make_unique<comm::Group>(everyone.dup("dp", comm_config));
          data_parallel = dp.get();
        }
        if (pp_size > 1) {
          // The blocks' recompute goes with the stage's chunks (gpt_pipeline_config).
          if (cfg.recompute.blocks != engine::RecomputeConfig::Blocks::kNone) cfg.recompute.applied_by_program = true;
          model = std::make_unique<run::GptPipelineModel>(model_cfg, *pipeline_parallel,
                                                          run::gpt_pipeline_config(cfg, tensor_parallel));
        } else if (tp_size > 1 && cfg.model_moe) {
          auto m = std::make_unique<moe::GptMoeModel>(
              *cfg.model_moe, &*expert_groups,
              tp::TensorParallel{.group = tensor_parallel, .sequence_parallel = cfg.tensor_parallel.sequence_parallel});
          moe_model = m.get();
          model = std::move(m);
        } else if (tp_size > 1 && cfg.model_llama) {
          auto m = std::make_unique<tp::LlamaModel>(*cfg.model_llama, tensor_parallel);
          if (cfg.recompute.blocks != engine::RecomputeConfig::Blocks::kNone) {
            m->set_recompute(engine::gpt_recompute(cfg.recompute, cfg.model_llama->n_layer));
            cfg.recompute.applied_by_program = true;
          }
          model = std::move(m);
        } else if (tp_size > 1) {
          auto m = std::make_unique<tp::GptModel>(model_cfg, cfg.tensor_parallel, tensor_parallel);
          // Its blocks are marked here: the engine applies checkpoint_blocks to nn::GptModel only.
          if (cfg.recompute.blocks != engine::RecomputeConfig::Blocks::kNone) {
            m->set_recompute(engine::gpt_recompute(cfg.recompute, model_cfg.n_layer));
            cfg.recompute.applied_by_program = true;
          }
          model = std::move(m);
        } else if (cfg.model_llama) {
          auto m = std::make_unique<nn::LlamaModel>(*cfg.model_llama);
          // Marked here, as the tensor-parallel GPT's: the engine applies checkpoint_blocks to nn::GptModel only.
          if (cfg.recompute.blocks != engine::RecomputeConfig::Blocks::kNone) {
            m->set_recompute(engine::gpt_recompute(cfg.recompute, cfg.model_llama->n_layer));
            cfg.recompute.applied_by_program = true;
          }
          model = std::move(m);
        } else if (cfg.model_moe) {
          comm::Topology topology(*dp, {.expert_parallel_size = cfg.model_moe->moe.ep_size});  // tp = pp = 1 today
          expert_groups.emplace(comm::ExpertGroups{topology.take_data_parallel(), topology.take_expert_parallel(),
                                                   topology.take_expert_data_parallel()});
          auto m = std::make_unique<moe::GptMoeModel>(*cfg.model_moe, &*expert_groups);
          moe_model = m.get();
          model = std::move(m);
        } else {
          model = std::make_unique<nn::GptModel>(model_cfg);
        }
        const int64_t seq_len = cfg.built_in_model() ? cfg.model_seq_len() : model_cfg.seq_len;
        const int64_t vocab = cfg.model_llama ? cfg.model_llama->vocab_size : model_cfg.vocab_size;
        nn::Dataset data = cfg.data.format != nn::DataFormat::kText
                               ? nn::Dataset::open_tokens(cfg.data.format, cfg.data.path, seq_len, vocab)
                           : cfg.data.path.empty() ? nn::Dataset::builtin(seq_len)
                                                   : nn::Dataset::open(cfg.data.path, seq_len);
        if (cfg.data.eval_interval > 0) {
          eval_source = std::make_unique<engine::DatasetSource>(split_held_out(data, cfg.data.eval_fraction),
                                                                cfg.data.seed.value_or(cfg.seed));
        }
        source = std::make_unique<engine::DatasetSource>(std::move(data), cfg.data.seed.value_or(cfg.seed),
                                                         cfg.data.min_seq_len);
        if (!a->init_from.empty()) {
          const std::string what = run::init_from_safetensors(*model, run::weight_naming(cfg), a->init_from);
          if (everyone.rank() == 0) ZS_LOG_INFO("init-from: {}", what);
        }
        engine = tensor_parallel != nullptr ? std::make_unique<engine::Engine>(*model, cfg, *data_parallel, *tensor_parallel)
                                            : std::make_unique<engine::Engine>(*model, cfg, *data_parallel);
        if (!a->init_from.empty()) run::clear_value_sources(*model);  // initialised: release the mappings
      })) {
    return 1;
  }
  // Resume: the engine agrees on a load error itself (every rank throws the same one).
  if (!a->load.empty()) {
    const auto [root, tag] = load_target(*a);
    if (!agree(everyone, [&] { engine->load_checkpoint(root, tag); })) return 1;
  }
  const std::string save_dir = !a->save.empty() ? a->save : cfg.checkpoint.dir;

  try {
    std::string shape;  // the byte-level GPT's words as they always were
    if (cfg.model_llama) {
      const nn::LlamaConfig& l = *cfg.model_llama;
      shape = fmt::format("LLaMA n_layer {} d_model {} n_head {} n_kv_head {} d_ff {} max_seq_len {} vocab {}", l.n_layer,
                          l.d_model, l.n_head, l.n_kv_head, nn::llama_d_ff(l), l.max_seq_len, l.vocab_size);
    } else if (cfg.model_type == "gpt2") {
      shape = fmt::format("GPT-2 n_layer {} d_model {} n_head {} d_ff {} max_seq_len {} vocab {}", model_cfg.n_layer,
                          model_cfg.d_model, model_cfg.n_head, nn::gpt_d_ff(model_cfg), model_cfg.seq_len,
                          model_cfg.vocab_size);
    } else {
      shape = fmt::format("GPT{} n_layer {} d_model {} n_head {} seq_len {} vocab {}", moe_model != nullptr ? "-MoE" : "",
                          model_cfg.n_layer, model_cfg.d_model, model_cfg.n_head, model_cfg.seq_len, model_cfg.vocab_size);
    }
    // DeepSpeed's model-side sections, named only when present (the usual line stays as it was).
    if (cfg.sparse_attention) {
      const int64_t heads = cfg.model_llama ? cfg.model_llama->n_head : model_cfg.n_head;
      const int64_t seq_len = cfg.built_in_model() ? cfg.model_seq_len() : model_cfg.seq_len;
      shape += ", sparse attention " + nn::make_sparse_layout(cfg.sparse_attention, heads, seq_len)->describe(seq_len);
    }
    if (cfg.progressive_layer_drop.enabled) {
      shape += fmt::format(", progressive layer drop (theta {}, gamma {})", cfg.progressive_layer_drop.theta,
                           cfg.progressive_layer_drop.gamma);
    }
    ZS_LOG_INFO("model: {} ({} parameters){}; data: {} ({})", shape, engine->param_count(),
                pp_size > 1 ? fmt::format(", {} pipeline stages ({}, {} micro-batches per step) x tensor-parallel {} x "
                                          "data-parallel {} ({})",
                                          pp_size, pp::schedule_name(cfg.pipeline.schedule),
                                          cfg.batch.gradient_accumulation_steps, tp_size, data_parallel->size(),
                                          topology->describe())
                : tp_size > 1 ? fmt::format(", tensor-parallel over {} ranks{} (dp {} x tp {})", tp_size,
                                          cfg.tensor_parallel.sequence_parallel ? " with sequence parallelism" : "",
                                          data_parallel->size(), tp_size)
                            : std::string(),
                source->data().origin(), data_size_text(source->data()));
    if (moe_model != nullptr) {
      const moe::GptMoeConfig& mc = *cfg.model_moe;
      ZS_LOG_INFO("moe: {} MoE layer(s) (every {} block(s)) of {} experts, top-{}, capacity factor {}, ep_size {} ({} "
                  "expert(s) per rank), aux_loss_coef {}",
                  moe_model->moe_layers().size(), mc.every_n_layers, mc.moe.num_experts, mc.moe.k, mc.moe.capacity_factor,
                  mc.moe.ep_size, mc.moe.num_experts / mc.moe.ep_size, mc.aux_loss_coef);
    }
    MoeSummary moe_summary;
    ZS_LOG_INFO("batch: {} samples per step = {} per rank x {} accumulation x {} {}; {} steps{}",
                cfg.batch.train_batch_size, cfg.batch.micro_batch_per_rank, cfg.batch.gradient_accumulation_steps,
                data_parallel->size(), tp_size > 1 ? "data-parallel rank(s)" : "rank(s)", cfg.train_steps,
                cfg.data.min_seq_len > 0 ? fmt::format("; sequences of {} to {} tokens, one length per step (data.min_seq_len)",
                                                       cfg.data.min_seq_len, cfg.built_in_model() ? cfg.model_seq_len() : model_cfg.seq_len)
                                         : std::string());
    engine::SummaryRecorder recorder(*engine);
    // Model FLOPs utilisation's denominator, measured now (every rank at once, each on its own cores)
    // rather than inside the first step's time (Note [peak probe] in memory/peak_flops.h).
    const memory::PeakFlops& peak = nn::product_peak(engine->config().compute_dtype());
    ZS_LOG_INFO("peak: {} ({}, {}) on {} thread(s): {:.1f} GFLOP/s per rank, measured in {:.0f} ms; the progress "
                "line's mfu is this rank's model FLOPs per second over it",
                memory::peak_kind_name(peak.kind), peak.instruction, memory::isa_name(peak.isa), peak.threads,
                peak.flops_per_s / 1e9, peak.probe_s * 1e3);
    // After the engine (Note [Preemption signals] in launch/preemption.h): a first SIGTERM or SIGINT
    // stops the run at the next step boundary (and unlinks the swap files' names at once), a second
    // one ends it at once.
    launch::PreemptionWatch preemption(&offload::unlink_swap_files_now);
    // --summary: written at the end, and by a preempted run for the steps it trained.
    auto write_summary = [&] {
      if (a->summary.empty()) return;
      world.flush();
      boost::json::object extra;
      if (moe_model != nullptr) extra["moe"] = moe_summary.json();
      if (recompute.applies) {
        extra["recompute_budget"] = boost::json::object{{"budget_bytes", recompute.budget_bytes},
                                                        {"blocks", recompute.blocks},
                                                        {"n_layer", recompute.n_layer},
                                                        {"predicted_peak_bytes", recompute.predicted_peak_bytes},
                                                        {"none_peak_bytes", recompute.none_peak_bytes},
                                                        {"all_peak_bytes", recompute.all_peak_bytes},
                                                        {"measurements", recompute.measurements}};
      }
      recorder.write(a->summary, world.counters(), extra);
      ZS_LOG_INFO("summary written to {}", a->summary);
    };
    // --steps / train_steps count the run's total optimizer steps: a resumed run goes on to the same end.
    if (engine->global_step() >= cfg.train_steps) {
      ZS_LOG_INFO("nothing to train: the checkpoint is at step {} of {}", engine->global_step(), cfg.train_steps);
    }
    while (engine->global_step() < cfg.train_steps) {
      double t0 = now_seconds();
      const engine::StepReport& r = engine->train_batch(*source);
      double dt = now_seconds() - t0;
      // r.step counts this step; its batch was filled as step index r.step - 1 (data.min_seq_len).
      const int64_t tokens_per_step = cfg.batch.train_batch_size * source->seq_len_at(r.step - 1);
      recorder.record(r, dt, tokens_per_step);
      if (r.step == 1 || r.step % cfg.steps_per_print == 0 || r.step == cfg.train_steps) {
        auto mem = engine->memory_report();
        const std::string offloaded =
            mem.host_peak_bytes + mem.nvme_bytes == 0
                ? std::string()
                : fmt::format(" | host peak {} | nvme {} | to device {} | to host {}", mib(mem.host_peak_bytes),
                              mib(mem.nvme_bytes), mib(r.transfers.host_to_device_bytes), mib(r.transfers.device_to_host_bytes));
        // dp x tp: the tensor-parallel layers' bytes this step (this rank's sends over the tp group).
        std::string topo = tp_size > 1 ? fmt::format(" | dp {} x tp {} | tp sent {}", data_parallel->size(), tp_size,
                                                     mib(r.tp_comm_bytes_sent))
                                       : std::string();
        // pp: this rank's stage - its schedule's time, measured bubble (its ideal beside it) and bytes sent on.
        if (pp_size > 1) {
          topo += fmt::format(" | pp stage {}/{} {:.3f} s bubble {:.0f}% (ideal {:.0f}%) sent {}", pipeline_parallel->rank(),
                              pp_size, r.pipeline.seconds, 100.0 * r.pipeline_bubble(), 100.0 * r.pipeline.ideal_bubble,
                              mib(static_cast<uint64_t>(r.pipeline.bytes_sent)));
        }
        // mfu last but for the skip notice: the quoted progress lines of the docs stay prefixes of it.
        ZS_LOG_INFO("step {}/{} | loss {:.4f} | lr {:.3e} | {:.0f} tok/s | {:.3f} s/step | model states {} | device peak {}{}{} | "
                    "mfu {:.0f}%{}",
                    r.step, cfg.train_steps, r.loss, r.lr, static_cast<double>(tokens_per_step) / dt, dt,
                    mib(mem.model_states.params + mem.model_states.grads + mem.model_states.optimizer),
                    mib(mem.device_peak_bytes), topo, offloaded,
                    100.0 * static_cast<double>(r.model_flops) / (dt * peak.flops_per_s),
                    r.skipped ? " | overflow: step skipped" : "");
        if (moe_model != nullptr) {
          const MoeRouting routing = gather_routing(*moe_model, *data_parallel);
          moe_summary.record(routing);
          ZS_LOG_INFO("  moe: {}", routing_line(routing));
        }
        if (cfg.recompute.profile) {
          const engine::Engine::RecomputeReport rc = engine->recompute_report();
          ZS_LOG_INFO("  recompute: {} checkpointed module(s), {} re-runs, {:.3f} s in all ({:.3f} s per step)", rc.checkpointed_modules,
                      rc.recomputes, rc.recompute_s, rc.recompute_s / static_cast<double>(r.step));
        }
        if (cfg.wall_clock_breakdown) {
          ZS_LOG_INFO("  time: forward {:.3f} s | backward {:.3f} s | optimizer {:.3f} s | grad norm {:.4f}{}", r.forward_s,
                      r.backward_s, r.optimizer_s, r.grad_norm,
                      cfg.precision == engine::Precision::kFp16 ? fmt::format(" | loss scale {}", r.loss_scale) : "");
        }
      }
      if (eval_source && (r.step % cfg.data.eval_interval == 0 || r.step == cfg.train_steps)) {
        // The same held-out batches every time (indices 0..eval_batches-1), so the losses compare.
        double eval_loss = 0.0;
        for (int64_t b = 0; b < cfg.data.eval_batches; ++b) eval_loss += engine->eval_batch(*eval_source, b);
        eval_loss /= static_cast<double>(cfg.data.eval_batches);
        recorder.record_eval(r.step, eval_loss);
        ZS_LOG_INFO("eval step {}/{} | eval loss {:.4f} | {} held-out batch(es) of {}", r.step, cfg.train_steps, eval_loss,
                    cfg.data.eval_batches, eval_source->data().origin());
      }
      const int64_t every = cfg.checkpoint.save_interval;
      const bool saved_here = !save_dir.empty() && ((every > 0 && r.step % every == 0) || r.step == cfg.train_steps);
      // Every rank reaches this step boundary; one small allreduce makes them agree whether any rank
      // was signalled, so all stop at this step, a rank signalled late included.
      int sig = 0;
      // Over every rank: at tp > 1 over dp, then tp (the tp ranks of one replica stop together).
      const comm::Group* agree_over[] = {data_parallel, tensor_parallel != nullptr ? tensor_parallel : pipeline_parallel,
                                         pipeline_parallel};
      const size_t agree_groups = 1 + (tensor_parallel != nullptr ? 1 : 0) + (pipeline_parallel != nullptr ? 1 : 0);
      const bool preempted =
          launch::agree_preempted(preemption, std::span(agree_over, agree_groups), &sig) &&
          r.step < cfg.train_steps;
      if (saved_here || (preempted && !save_dir.empty())) {
        // An agreed error (every rank throws the same one): the job ends cleanly, rank 0 says why.
        try {
          const std::string tag = engine->save_checkpoint(save_dir);
          if (preempted) {
            engine->wait_checkpoint();  // checkpoint.async: committed before the exit
            ZS_LOG_INFO("preempted: {} at step {}/{}: saved checkpoint {} in {}; exiting 0 (resume with the same "
                        "command plus --load {})",
                        launch::signal_name(sig), r.step, cfg.train_steps, tag, save_dir, save_dir);
          }
        } catch (const CommError&) {
          throw;  // not agreed (a rank stopped answering mid-save): the handler below ends the job, naming it
        } catch (const std::exception& e) {
          if (world.rank() == 0) std::fprintf(stderr, "zeroshard: error: %s\n", e.what());
          return 1;
        }
      }
      if (preempted && save_dir.empty()) {
        ZS_LOG_WARN("preempted: {} at step {}/{}: no checkpoint saved, as no checkpoint dir was configured (--save DIR "
                    "or checkpoint.dir); exiting {}",
                    launch::signal_name(sig), r.step, cfg.train_steps, 128 + sig);
        write_summary();
        return 128 + sig;
      }
      if (preempted) {
        write_summary();
        return 0;
      }
    }
    // checkpoint.async: the last save is committed before the job ends.
    try {
      engine->wait_checkpoint();
    } catch (const CommError&) {
      throw;
    } catch (const std::exception& e) {
      if (world.rank() == 0) std::fprintf(stderr, "zeroshard: error: %s\n", e.what());
      return 1;
    }
    if (!recorder.loss_history().empty()) {
      ZS_LOG_INFO("done: final loss {:.4f}, {:.0f} tokens/s, mfu {:.1f}%", recorder.loss_history().back(),
                  recorder.tokens_per_second(), 100.0 * recorder.mfu());
    }
    write_summary();
  } catch (const std::exception& e) {
    comm::World::abort(e.what(), 1);
  }
  return 0;
}

}  // namespace zs::tools
