#include "run/run_config.h"

#include <fmt/format.h>

#include <string>
#include <string_view>

#include "core/errors.h"
#include "core/json.h"
#include "pp/gpt.h"

namespace zs::run {
namespace {

// Note [bounded keys] in engine/config.cpp: a typo (`1e9` for `1e3`) in a key that sizes the module
// tree is an immediate ConfigError, not minutes of declaring modules.
constexpr int64_t kMaxLayers = 4096;                 // GPT-3 has 96 blocks; 4096 declare in about a second
constexpr int64_t kMaxDModel = int64_t{1} << 16;     // GPT-3's width is 12,288
constexpr int64_t kMaxSeqLen = int64_t{1} << 20;     // one million positions
constexpr int64_t kMaxEvalBatches = int64_t{1} << 16;
constexpr int64_t kMaxExperts = 4096;

// model.tensor_parallel_size (or pipeline_parallel_size) as written, before the engine's pass: the
// batch arithmetic divides by the data-parallel size, ranks / (tp x pp). A value that is not a
// positive divisor of `ranks` counts as 1 here; the model section's reader then reports it (before the
// batch is resolved).
int peek_model_size(const boost::json::value& doc, int ranks, std::string_view key) {
  const boost::json::value* model = doc.is_object() ? doc.as_object().if_contains("model") : nullptr;
  const boost::json::value* tp = model && model->is_object() ? model->as_object().if_contains(key) : nullptr;
  if (tp == nullptr || !tp->is_int64()) return 1;
  const int64_t v = tp->as_int64();
  return v >= 1 && v <= ranks && ranks % v == 0 ? static_cast<int>(v) : 1;
}

int peek_data_parallel_size(const boost::json::value& doc, int ranks) {
  const int tp = peek_model_size(doc, ranks, "tensor_parallel_size");
  const int pp = peek_model_size(doc, ranks / tp, "pipeline_parallel_size");
  return ranks / tp / pp;
}

// A key of the model section that the section's model.type does not have: named, with the types that do.
void refuse_keys(ObjectReader& r, const std::string& type, std::initializer_list<std::string_view> keys,
                 std::string_view owner, std::string_view hint) {
  for (std::string_view key : keys) {
    if (r.object().if_contains(key) != nullptr) {
      throw ConfigError(fmt::format("{}: applies to model.type {}, and this section's type is \"{}\"; {}", r.path_of(key),
                                    owner, type, hint));
    }
  }
}

// model.type "llama" (nn/llama.h): its own keys; tensor parallelism without sequence parallelism
// (tp/llama.h); pipelines, vocabulary padding and MoE layers are GPT-only today.
void read_llama(ObjectReader& r, RunConfig& cfg, int ranks) {
  nn::LlamaConfig m;
  refuse_keys(r, "llama", {"seq_len"}, "\"gpt\"", "LLaMA's longest sequence is model.max_seq_len");
  refuse_keys(r, "llama", {"tied_embeddings"}, "\"gpt\" and \"gpt2\"", "LLaMA's output head is untied; remove it");
  refuse_keys(r, "llama", {"pipeline_parallel_size", "virtual_pipeline_size", "make_vocab_size_divisible_by", "attention"},
              "\"gpt\" and \"gpt2\"",
              "LLaMA has no pipeline stages, padded vocabulary or plain attention kernel yet; remove the key");
  r.read("n_layer", m.n_layer, IntRange{1, kMaxLayers});  // Note [bounded keys]
  r.read("d_model", m.d_model, IntRange{1, kMaxDModel});
  r.read("n_head", m.n_head, IntRange{1, kMaxDModel});
  m.n_kv_head = m.n_head;  // absent: multi-head attention
  r.read("n_kv_head", m.n_kv_head, IntRange{1, kMaxDModel});
  r.read("d_ff", m.d_ff, IntRange{1, int64_t{1} << 20});
  r.read("max_seq_len", m.max_seq_len, IntRange{2, kMaxSeqLen});
  r.read("vocab_size", m.vocab_size, IntRange{256, 1 << 24});
  r.read("rope_theta", m.rope_theta, RealRange::positive());
  r.read("norm_eps", m.norm_eps, RealRange::positive());
  r.read("init_std", m.init_std, RealRange::positive());
  nn::validate(m);
  tp::TensorParallelConfig& par = cfg.tensor_parallel;
  r.read("tensor_parallel_size", par.tensor_parallel_size, IntRange{1, kMaxDModel});
  r.read("sequence_parallel", par.sequence_parallel);
  tp::validate_llama(m, par.tensor_parallel_size, par.sequence_parallel, ranks);
  cfg.model_llama = m;
}

// model.type "gpt" (the byte-level demo) and "gpt2" (Hugging Face's GPT-2: the same nn::GptModel with
// GPT-2 small's defaults, its length named max_seq_len as LLaMA's is).
void read_model(ObjectReader& r, nn::GptConfig& m, RunConfig& cfg, int ranks, std::vector<std::string>& notes) {
  std::string type = "gpt";
  r.read_choice("type", type, {"gpt", "gpt2", "llama"});
  cfg.model_type = type;
  if (type == "llama") {
    read_llama(r, cfg, ranks);
    return;
  }
  if (type == "gpt2") m = nn::gpt2_defaults();
  refuse_keys(r, type, {"n_kv_head", "rope_theta"}, "\"llama\"", "GPT-2 attends with every head and learned positions");
  if (type == "gpt") {
    refuse_keys(r, type, {"max_seq_len"}, "\"gpt2\" and \"llama\"", "the byte-level GPT's length is model.seq_len");
  } else {
    refuse_keys(r, type, {"seq_len"}, "\"gpt\"", "GPT-2's positions are model.max_seq_len");
  }
  r.read("n_layer", m.n_layer, IntRange{1, kMaxLayers});  // Note [bounded keys]
  r.read("d_model", m.d_model, IntRange{1, kMaxDModel});
  r.read("n_head", m.n_head, IntRange{1, kMaxDModel});
  r.read(type == "gpt" ? "seq_len" : "max_seq_len", m.seq_len, IntRange{2, kMaxSeqLen});
  r.read("vocab_size", m.vocab_size, IntRange{256, 1 << 24});
  r.read("tied_embeddings", m.tied_embeddings);
  r.read("init_std", m.init_std, RealRange::positive());
  r.read("d_ff", m.d_ff, IntRange{1, int64_t{1} << 20});
  r.read("norm_eps", m.norm_eps, RealRange::positive());
  std::string attention(nn::attention_kernel_name(m.attention));
  r.read_choice("attention", attention, {"fused", "plain"});
  m.attention = attention == "plain" ? nn::AttentionKernel::kPlain : nn::AttentionKernel::kFused;
  nn::validate(m);
  tp::TensorParallelConfig& par = cfg.tensor_parallel;
  r.read("tensor_parallel_size", par.tensor_parallel_size, IntRange{1, kMaxDModel});
  r.read("sequence_parallel", par.sequence_parallel);
  r.read("make_vocab_size_divisible_by", par.make_vocab_size_divisible_by, IntRange{1, 1 << 24});
  tp::validate(m, par, ranks);
  if (const int64_t padded = tp::padded_vocab_size(m.vocab_size, par); padded != m.vocab_size) {
    notes.push_back(fmt::format("model.vocab_size: {} padded to {} (a multiple of model.make_vocab_size_divisible_by "
                                "{} x model.tensor_parallel_size {}) for the vocab-parallel embedding and head; the "
                                "{} padded rows are zeros outside the softmax and the checkpoints",
                                m.vocab_size, padded, par.make_vocab_size_divisible_by, par.tensor_parallel_size,
                                padded - m.vocab_size));
  } else if (par.make_vocab_size_divisible_by != 1 && par.tensor_parallel_size == 1) {
    notes.push_back("model.make_vocab_size_divisible_by: accepted; no effect at model.tensor_parallel_size 1 (the "
                    "vocabulary is padded only to split it over the tensor-parallel group)");
  }
  PipelineRunConfig& pl = cfg.pipeline;
  r.read("pipeline_parallel_size", pl.pipeline_parallel_size, IntRange{1, kMaxLayers});
  r.read("virtual_pipeline_size", pl.virtual_pipeline_size, IntRange{1, kMaxLayers});
  if (ranks % (pl.pipeline_parallel_size * par.tensor_parallel_size) != 0) {
    throw ConfigError(fmt::format("model.pipeline_parallel_size: {} stages x model.tensor_parallel_size {} = {} ranks "
                                  "per model replica does not divide the number of ranks ({}); choose sizes whose "
                                  "product divides {} or run on a multiple of {} ranks",
                                  pl.pipeline_parallel_size, par.tensor_parallel_size,
                                  pl.pipeline_parallel_size * par.tensor_parallel_size, ranks, ranks,
                                  pl.pipeline_parallel_size * par.tensor_parallel_size));
  }
  if (pl.virtual_pipeline_size > 1 && pl.pipeline_parallel_size == 1) {
    throw ConfigError(fmt::format("model.virtual_pipeline_size: {} chunks per rank need pipeline parallelism; set "
                                  "model.pipeline_parallel_size above 1 (and pipeline.schedule \"interleaved\") or "
                                  "remove the key",
                                  pl.virtual_pipeline_size));
  }
}

// model.sequence_parallel at tp 1, for every model.type (a view: GCC 12 warns, wrongly, when a string
// of this length is moved into the vector).
constexpr std::string_view kSequenceParallelNote =
    "model.sequence_parallel: accepted; a no-op at model.tensor_parallel_size 1 (sequence parallelism splits the "
    "sequence across the tensor-parallel group), as in Megatron-LM";

// model.moe: DeepSpeed's MoE arguments plus the GPT-MoE builder's (moe/gpt_moe.h). `model` is the
// already-read model section; the GPT-MoE has an untied head, so tied_embeddings defaults to false here.
// dp: the data-parallel ranks (ranks / model.tensor_parallel_size), over which the experts spread.
moe::GptMoeConfig read_model_moe(ObjectReader& r, ObjectReader& model, nn::GptConfig& gpt, int dp, int tp) {
  moe::GptMoeConfig c;
  if (model.object().find("tied_embeddings") == model.object().end()) gpt.tied_embeddings = false;
  moe::MoEOptions& o = c.moe;
  r.require("num_experts", o.num_experts, IntRange{1, kMaxExperts});
  r.read("ep_size", o.ep_size, IntRange::positive());
  r.read("k", o.k, IntRange::positive());
  r.read("capacity_factor", o.capacity_factor, RealRange::positive());
  r.read("eval_capacity_factor", o.eval_capacity_factor, RealRange::positive());
  r.read("min_capacity", o.min_capacity, IntRange::non_negative());
  r.read("use_residual", o.use_residual);
  if (const boost::json::value* v = r.find("noisy_gate_policy"); v != nullptr && !v->is_null()) {
    std::string policy;
    from_json(*v, r.path_of("noisy_gate_policy"), policy);
    o.noisy_gate_policy = moe::parse_noisy_gate_policy(policy, r.path_of("noisy_gate_policy"));
  }
  r.read("drop_tokens", o.drop_tokens);
  r.read("use_rts", o.use_rts);
  r.read("top2_2nd_expert_sampling", o.top2_2nd_expert_sampling);
  r.read("every_n_layers", c.every_n_layers, IntRange::positive());
  r.read("aux_loss_coef", c.aux_loss_coef, RealRange::non_negative());
  r.read("expert_hidden", c.expert_hidden, IntRange::non_negative());
  if (dp % o.ep_size != 0) {
    if (tp > 1) {
      throw ConfigError(fmt::format("{}: {} does not divide the number of data-parallel ranks ({} = ranks / "
                                    "model.tensor_parallel_size {}): expert-parallel groups are {} data-parallel "
                                    "replicas; choose a divisor of {} or run on a multiple of {} ranks",
                                    r.path_of("ep_size"), o.ep_size, dp, tp, o.ep_size, dp, o.ep_size * tp));
    }
    throw ConfigError(fmt::format("{}: {} does not divide the number of ranks ({}): expert-parallel groups are {} "
                                  "consecutive ranks; choose a divisor of {} or run on a multiple of {} ranks",
                                  r.path_of("ep_size"), o.ep_size, dp, o.ep_size, dp, o.ep_size));
  }
  c.gpt = gpt;
  moe::validate(c);
  return c;
}

// The `pipeline` section (after the model's, whose stage counts it partitions).
void read_pipeline(ObjectReader& r, RunConfig& cfg) {
  PipelineRunConfig& pl = cfg.pipeline;
  std::string schedule = pp::schedule_name(pl.schedule);
  r.read_choice("schedule", schedule, {"afab", "1f1b", "interleaved", "zb-h1"});
  pl.schedule = pp::parse_schedule(schedule);
  std::string method = pp::partition_method_name(pl.partition.method);
  const bool has_method = r.read_choice("partition_method", method, {"parameters", "compute", "uniform", "explicit"});
  pl.partition.method = pp::parse_partition_method(method);
  if (r.read("partition_boundaries", pl.partition.boundaries)) {
    if (has_method && pl.partition.method != pp::PartitionMethod::kExplicit) {
      throw ConfigError(fmt::format("pipeline.partition_boundaries: given with pipeline.partition_method \"{}\"; "
                                    "boundaries are the \"explicit\" method: remove one of the two",
                                    method));
    }
    pl.partition.method = pp::PartitionMethod::kExplicit;
  } else if (pl.partition.method == pp::PartitionMethod::kExplicit) {
    throw ConfigError("pipeline.partition_method: \"explicit\" needs pipeline.partition_boundaries (stages x "
                      "model.virtual_pipeline_size + 1 block indices from 0 to model.n_layer)");
  }
  if (!cfg.model) {
    throw ConfigError("pipeline: pipeline parallelism is of the built-in GPT; add a `model` section or remove `pipeline`");
  }
}

// Pipeline parallelism against the rest of the config, once the batch is resolved: errors name the keys.
void check_pipeline(RunConfig& cfg) {
  const PipelineRunConfig& pl = cfg.pipeline;
  const int p = pl.pipeline_parallel_size;
  if (!cfg.model) return;
  // Stage boundaries: more stages x chunks than blocks, or bad explicit boundaries, name the keys.
  (void)pp::gpt_partition(*cfg.model, pl.partition, p * pl.virtual_pipeline_size);
  if (p == 1) return;
  const int64_t m = cfg.batch.gradient_accumulation_steps;
  pp::validate(pl.schedule, {.stages = p, .chunks = pl.virtual_pipeline_size, .micro_batches = m});
  if (pl.schedule != pp::Schedule::kAllForwardAllBackward && m < p) {
    throw ConfigError(fmt::format("gradient_accumulation_steps: {} micro-batches per step for model.pipeline_parallel_size "
                                  "{} stages: pipeline.schedule \"{}\" keeps every stage busy only with at least as "
                                  "many micro-batches as stages; raise gradient_accumulation_steps to {} or more (or "
                                  "train_batch_size accordingly)",
                                  m, p, pp::schedule_name(pl.schedule), p));
  }
  if (cfg.zero.stage == 3) {
    throw ConfigError(fmt::format("zero_optimization.stage: 3 with model.pipeline_parallel_size {} is not supported: "
                                  "ZeRO-3 gathers each module's parameters along one recorded order per pass, while a "
                                  "pipeline schedule interleaves several micro-batches' passes; use stage 1 or 2, or "
                                  "model.pipeline_parallel_size 1",
                                  p));
  }
  if (cfg.model_moe) {
    throw ConfigError(fmt::format("model.moe: MoE layers with model.pipeline_parallel_size {} are not supported yet; set "
                                  "model.pipeline_parallel_size to 1 for MoE models",
                                  p));
  }
  if (cfg.data.eval_interval > 0) {
    throw ConfigError(fmt::format("data.eval_interval: evaluation with model.pipeline_parallel_size {} is not supported "
                                  "yet (a stage runs whole schedules only); remove data.eval_interval or train at "
                                  "model.pipeline_parallel_size 1",
                                  p));
  }
  if (cfg.recompute.budget()) {
    throw ConfigError(fmt::format("activation_checkpointing.device_budget_mb: the budget is resolved for the whole "
                                  "model, not per pipeline stage yet (model.pipeline_parallel_size {}); name "
                                  "checkpoint_blocks instead (zeroshard estimate --config gives each stage's device peak)",
                                  p));
  }
  if (cfg.monitor.flops.enabled) {
    throw ConfigError(fmt::format("flops_profiler.enabled: the module profile with model.pipeline_parallel_size {} is "
                                  "not supported yet; set it to false",
                                  p));
  }
}

void read_data(ObjectReader& r, RunConfig& cfg) {
  r.read_enum("format", cfg.data.format,
              {{"text", nn::DataFormat::kText}, {"llmc", nn::DataFormat::kLlmc}, {"megatron", nn::DataFormat::kMegatron}});
  r.read("path", cfg.data.path);
  if (cfg.data.format != nn::DataFormat::kText && cfg.data.path.empty()) {
    throw ConfigError(fmt::format("data.path: data.format \"{}\" needs the path of its token files ({}); add data.path",
                                  nn::data_format_name(cfg.data.format),
                                  cfg.data.format == nn::DataFormat::kLlmc ? "a shard, or a glob such as \"train_*.bin\""
                                                                          : "the prefix of PREFIX.bin and PREFIX.idx"));
  }
  uint64_t seed = 0;
  if (r.read("seed", seed)) cfg.data.seed = seed;
  r.read("eval_interval", cfg.data.eval_interval, IntRange::non_negative());
  if (r.read("min_seq_len", cfg.data.min_seq_len, IntRange::positive()) && cfg.built_in_model() &&
      cfg.data.min_seq_len > cfg.model_seq_len()) {
    const char* key = cfg.model_type == "gpt" ? "seq_len" : "max_seq_len";
    throw ConfigError(fmt::format("data.min_seq_len: {} exceeds model.{} = {}; choose a value from 1 to {}",
                                  cfg.data.min_seq_len, key, cfg.model_seq_len(), cfg.model_seq_len()));
  }
  if (cfg.data.min_seq_len > 0 && cfg.tensor_parallel.sequence_parallel && cfg.tensor_parallel.tensor_parallel_size > 1) {
    throw ConfigError(fmt::format("data.min_seq_len: varying sequence lengths are not supported with "
                                  "model.sequence_parallel (each step's length would have to divide by "
                                  "model.tensor_parallel_size {}); remove data.min_seq_len or set sequence_parallel "
                                  "to false",
                                  cfg.tensor_parallel.tensor_parallel_size));
  }
  const bool fraction = r.read("eval_fraction", cfg.data.eval_fraction, RealRange{0.0, 1.0, true, true});
  const bool batches = r.read("eval_batches", cfg.data.eval_batches, IntRange{1, kMaxEvalBatches});
  if ((fraction || batches) && cfg.data.eval_interval == 0) {
    throw ConfigError(fmt::format("data.{}: has an effect only with evaluation on; set data.eval_interval to the "
                                  "number of optimizer steps between evaluations, or remove it",
                                  fraction ? "eval_fraction" : "eval_batches"));
  }
}

// DeepSpeed's sparse_attention (read by the engine's pass) on the built-in model's attention: the run's
// seed draws BigBird's random blocks, and the layout is made once here so a layout that does not fit
// the model (more blocks than its longest sequence has) is reported while parsing.
void apply_sparse_attention(RunConfig& cfg) {
  if (!cfg.sparse_attention) return;
  cfg.sparse_attention->seed = cfg.seed;
  if (!cfg.built_in_model()) return;  // a program's own model (or zeroshard train's default GPT) reads cfg's
  const nn::SparseAttentionConfig& c = *cfg.sparse_attention;
  if (cfg.model && cfg.model->attention == nn::AttentionKernel::kPlain) {
    throw ConfigError("sparse_attention: the block-sparse layouts run on the fused attention kernel, and model.attention "
                      "is \"plain\"; remove model.attention (or set it to \"fused\") or remove sparse_attention");
  }
  const int64_t n_head = cfg.model_llama ? cfg.model_llama->n_head : cfg.model->n_head;
  static_cast<void>(nn::make_sparse_layout(c, n_head, cfg.model_seq_len()));
  if (cfg.model) cfg.model->sparse_attention = c;
  if (cfg.model_moe) cfg.model_moe->gpt.sparse_attention = c;
  if (cfg.model_llama) cfg.model_llama->sparse_attention = c;
}

// DeepSpeed's progressive_layer_drop on the built-in model's blocks, its draws keyed by the run's seed.
void apply_layer_drop(RunConfig& cfg) {
  cfg.progressive_layer_drop.seed = cfg.seed;
  if (!cfg.progressive_layer_drop.enabled || !cfg.built_in_model()) return;  // a program's own model reads cfg's
  if (cfg.pipeline.pipeline_parallel_size > 1 || cfg.model_moe) {
    throw ConfigError(fmt::format("progressive_layer_drop.enabled: layer drop is built for the GPT and LLaMA models "
                                  "without {} so far; set it to false or remove {}",
                                  cfg.model_moe ? "MoE layers" : "pipeline stages",
                                  cfg.model_moe ? "model.moe" : "model.pipeline_parallel_size"));
  }
  if (cfg.model) cfg.model->layer_drop = cfg.progressive_layer_drop;
  if (cfg.model_llama) cfg.model_llama->layer_drop = cfg.progressive_layer_drop;
}

}  // namespace

bool RunConfig::built_in_model() const { return model.has_value() || model_llama.has_value(); }

int64_t RunConfig::model_seq_len() const {
  ZS_ASSERT(built_in_model(), "RunConfig::model_seq_len without a built-in model");
  return model_llama ? model_llama->max_seq_len : model->seq_len;
}

RunConfig parse_run_config(const boost::json::value& doc, int ranks) {
  RunConfig cfg;
  const int dp = peek_data_parallel_size(doc, ranks);
  std::vector<std::string> notes;  // the program sections' (the engine's pass assigns cfg's own)
  // Read in the engine's pass, each at its place in the validation order (Note [program sections] in
  // engine/config.cpp); the engine's part is assigned after, which leaves these members alone.
  const engine::ProgramSection sections[] = {
      {"model", "device",
       [&](ObjectReader& r, const engine::EngineConfig& parsed) {
         nn::GptConfig m;
         read_model(r, m, cfg, ranks, notes);
         if (cfg.tensor_parallel.sequence_parallel && cfg.tensor_parallel.tensor_parallel_size == 1) {
           notes.emplace_back(kSequenceParallelNote);
         }
         if (cfg.model_llama) {
           refuse_keys(r, "llama", {"moe"}, "\"gpt\"", "LLaMA has no MoE layers yet");
           return;
         }
         r.read_object("moe", [&](ObjectReader& sub) {
           cfg.model_moe = read_model_moe(sub, r, m, dp, cfg.tensor_parallel.tensor_parallel_size);
           cfg.model_moe->make_vocab_size_divisible_by = cfg.tensor_parallel.make_vocab_size_divisible_by;
           cfg.model_moe->moe.rng_seed = parsed.seed;  // the gates' random draws follow the run's seed
         });
         cfg.model = m;
       }},
      {"data", "device", [&](ObjectReader& r, const engine::EngineConfig&) { read_data(r, cfg); }},
      {"pipeline", "device", [&](ObjectReader& r, const engine::EngineConfig&) { read_pipeline(r, cfg); }},
      {"log", "comm",
       [&](ObjectReader& r, const engine::EngineConfig&) {
         r.read_choice("level", cfg.log.level, {"trace", "debug", "info", "warn", "error", "off"});
         r.read("all_ranks", cfg.log.all_ranks);
       }},
  };
  static_cast<engine::EngineConfig&>(cfg) = engine::parse_config(doc, dp, sections);
  cfg.notes.insert(cfg.notes.end(), notes.begin(), notes.end());
  engine::check_partition_activations(cfg.recompute, cfg.tensor_parallel.tensor_parallel_size,
                                     cfg.tensor_parallel.sequence_parallel, cfg.notes);
  check_pipeline(cfg);
  apply_sparse_attention(cfg);
  apply_layer_drop(cfg);
  cfg.data_seed = cfg.data.seed;
  return cfg;
}

}  // namespace zs::run
