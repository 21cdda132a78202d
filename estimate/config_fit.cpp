#include "estimate/config_fit.h"

#include <unistd.h>

#include "core/errors.h"
#include "estimate/detail/estimate_util.h"
#include "estimate/estimate.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "pp/gpt.h"

namespace zs::engine {
namespace {

using detail::bytes_per_element;
using detail::group_digits;
using detail::kAlign;
using detail::round_up;

// Elements of one nn::Mlp of width d (fc d -> 4d and proj 4d -> d, with biases).
uint64_t mlp_elements(uint64_t d) { return 8 * d * d + 5 * d; }

std::string where(const EngineConfig& cfg, int ranks) {
  return fmt::format("zero_optimization.stage {}, {} rank(s), {}, {}", cfg.zero.stage, ranks, precision_name(cfg.precision),
                     cfg.optimizer.name());
}

}  // namespace

FitCapacity FitCapacity::of_this_host() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return FitCapacity{.host_bytes = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0};
}

ConfigParamCounts config_param_counts(const run::RunConfig& cfg) {
  ZS_ASSERT(cfg.built_in_model(), "config_param_counts needs a model section");
  // parse_config bounds every dimension (model.n_layer <= 4096, d_model <= 65536, ...), so these
  // products stay far below 2^63.
  ConfigParamCounts c;
  if (cfg.model_llama) {
    c.dense = static_cast<uint64_t>(nn::llama_param_count(*cfg.model_llama));
    return c;
  }
  if (!cfg.model_moe) {
    c.dense = static_cast<uint64_t>(nn::gpt_param_count(*cfg.model));
    return c;
  }
  const moe::GptMoeConfig& m = *cfg.model_moe;
  const auto d = static_cast<uint64_t>(m.gpt.d_model);
  const auto moe_layers = static_cast<uint64_t>(m.gpt.n_layer / m.every_n_layers);
  const auto experts = static_cast<uint64_t>(m.moe.num_experts), ep = static_cast<uint64_t>(m.moe.ep_size);
  // The GPT-MoE's dense part: the GPT without the MLPs the MoE layers replace, with a gate (d x experts,
  // no bias) in each. use_residual's extra MLP is left out: the count stays a lower bound.
  c.dense = static_cast<uint64_t>(nn::gpt_param_count(m.gpt)) - moe_layers * mlp_elements(d) + moe_layers * d * experts;
  c.expert = moe_layers * (experts / ep) * mlp_elements(d);
  c.expert_parallel_size = m.moe.ep_size;
  return c;
}

void check_config_fits(const run::RunConfig& cfg, int ranks, const FitCapacity& capacity) {
  if (!cfg.built_in_model()) return;  // the program brings its own model: it is built before anything is known
  const ConfigParamCounts counts = config_param_counts(cfg);
  const char* kind = cfg.model_llama ? "LLaMA" : "GPT";
  const int64_t n_layer = cfg.model_llama ? cfg.model_llama->n_layer : cfg.model->n_layer;
  const int64_t d_model = cfg.model_llama ? cfg.model_llama->d_model : cfg.model->d_model;
  // The estimator's input from the config's rules and the counts alone (Note [estimated offload] and
  // the stage rules in estimate.h): no model is built. Flat elements are rounded up once, as for a
  // single parameter; the engine pads every parameter, so its layout is at least this large.
  run::RunConfig rules = cfg;
  rules.model.reset();
  rules.model_moe.reset();
  rules.model_llama.reset();
  // Tensor parallelism: each rank holds about 1/tp of the parameters (a lower bound: replicated norms,
  // biases and wpe are whole on every rank), sharded over ranks / tp; the check refuses only what
  // cannot fit, so a lower bound is the safe side.
  // Pipeline stages (the GPT's, model.pipeline_parallel_size P > 1): each stage holds its own chunks'
  // parameters (pp::gpt_stage_param_count: the partition's blocks, the embeddings on the first stage,
  // the final norm and head, a tied embedding's copy, on the last), sharded over ranks / (tp x P);
  // every stage is checked with its own count, and the stage with the most device bytes is the one
  // named. Its ranks need them whatever the other stages hold, so 1/P of the model would understate
  // the largest stage (a vocabulary-heavy first or last stage, explicit boundaries).
  const int tp = cfg.tensor_parallel.tensor_parallel_size;
  const int pp = cfg.model && !cfg.model_moe ? cfg.pipeline.pipeline_parallel_size : 1;
  int worst_stage = 0;
  uint64_t worst_params = counts.dense;
  TieredStateBytes states;
  for (int stage = 0; stage < pp; ++stage) {
    const uint64_t dense =
        pp == 1 ? counts.dense
                : static_cast<uint64_t>(pp::gpt_stage_param_count(*cfg.model, cfg.pipeline.partition, pp,
                                                                  cfg.pipeline.virtual_pipeline_size, stage));
    EstimateInput in = estimate_input_for_config(rules, ranks / tp / pp, dense / static_cast<uint64_t>(tp));
    if (counts.expert > 0) {
      in.model.experts.push_back({counts.expert_parallel_size, round_up(counts.expert, kAlign)});
    }
    const TieredStateBytes mine = tiered_state_bytes(in, cfg.zero.stage, /*rank=*/0);
    if (stage == 0 || mine.device.total() > states.device.total()) {
      states = mine;
      worst_stage = stage;
      worst_params = dense;
    }
  }
  const uint64_t device_capacity = static_cast<uint64_t>(cfg.device.memory_mb) << 20;
  const uint64_t params = counts.dense + counts.expert;
  // "of which pipeline stage 1 of 2 holds 1,234 (its blocks 2-3, ...)" at pp > 1.
  const std::string stage_part =
      pp > 1 ? fmt::format(", of which pipeline stage {} of {} (model.pipeline_parallel_size, pipeline.partition_method "
                           "\"{}\") holds {}{},",
                           worst_stage, pp, pp::partition_method_name(cfg.pipeline.partition.method),
                           group_digits(worst_params), worst_stage == 0 ? " with the embeddings"
                                                       : worst_stage == pp - 1 ? " with the final norm and head" : "")
             : std::string();
  if (states.device.total() > device_capacity) {
    throw ConfigError(fmt::format(
        "model: a {} of {} parameters (model.n_layer {}, model.d_model {}){} needs {} ({} bytes) of model states per "
        "rank on the device ({}), more than device.memory_mb gives ({} bytes); raise device.memory_mb, use a higher "
        "zero_optimization.stage, more ranks or offload (zero_optimization.offload_optimizer / offload_param), or make "
        "the model smaller",
        kind, group_digits(params), n_layer, d_model, stage_part, format_bytes(states.device.total()),
        states.device.total(), where(cfg, ranks), device_capacity));
  }
  if (capacity.host_bytes != 0 && states.host.total() > capacity.host_bytes) {
    const bool param = cfg.zero.offload_param.device == OffloadDevice::kCpu;
    throw ConfigError(fmt::format(
        "zero_optimization.{}: a {} of {} parameters{} offloads {} ({} bytes) of model states per rank to the host "
        "({}), more than this machine's memory ({} bytes); use more ranks, offload to nvme, or make the model smaller",
        param ? "offload_param" : "offload_optimizer", kind, group_digits(params), stage_part,
        format_bytes(states.host.total()), states.host.total(), where(cfg, ranks), capacity.host_bytes));
  }
  // The smallest activation a step allocates on the device: one micro-batch's embedding output (B, T, C)
  // in the compute dtype. Everything else the forward keeps only adds to it.
  const int64_t seq_len = cfg.model_seq_len();
  const auto micro = static_cast<uint64_t>(cfg.batch.micro_batch_per_rank);
  const uint64_t activation = micro * static_cast<uint64_t>(seq_len) * static_cast<uint64_t>(d_model) *
                              bytes_per_element(cfg.precision);
  if (states.device.total() + activation > device_capacity) {
    throw ConfigError(fmt::format(
        "train_micro_batch_size_per_gpu: one micro-batch of {} x {} tokens needs at least {} ({} bytes) for its embedding "
        "output alone (x model.d_model {}), which with the model states ({}) is more than device.memory_mb gives ({} "
        "bytes); use a smaller micro-batch (and more gradient_accumulation_steps), a smaller model.{}, or raise "
        "device.memory_mb",
        micro, seq_len, format_bytes(activation), activation, d_model, format_bytes(states.device.total()), device_capacity,
        cfg.model_type == "gpt" ? "seq_len" : "max_seq_len"));
  }
}

}  // namespace zs::engine
