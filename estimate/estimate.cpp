#include "estimate/estimate.h"

#include <boost/json/array.hpp>

#include <algorithm>
#include <functional>
#include <unordered_map>
#include <utility>

#include "core/errors.h"
#include "engine/dataset_source.h"
#include "estimate/detail/estimate_util.h"
#include "estimate/detail/measured_models.h"
#include "estimate/measure.h"
#include "engine/flat_layout.h"
#include "memory/shard.h"
#include "moe/gpt_moe.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "pp/schedule.h"
#include "run/gpt_pipeline.h"
#include "tp/gpt.h"
#include "tp/llama.h"

namespace zs::engine {
namespace detail {

std::string group_digits(uint64_t v) {
  const std::string digits = std::to_string(v);
  std::string s;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) s += ',';
    s += digits[i];
  }
  return s;
}

double state_bytes_per_element(const EstimateInput& in) {
  if (in.compressed) return in.compressed_state_bytes;
  double k = 0;
  for (const optim::StateSpec& spec : in.optimizer_states) {
    k += static_cast<double>(spec.value_bytes) / static_cast<double>(spec.elements_per_value);
  }
  return k;
}

uint64_t master_bytes_at(const EstimateInput& in, int stage) {
  // The plan's fp32 master: a 2-byte residual with reuse_fp32_param, a separate 4-byte copy, or none.
  const PlacementPlan plan = placement_plan(in, stage, 0);
  return plan.find("residual") != nullptr ? 2 : plan.find("master") != nullptr ? 4 : 0;
}

}  // namespace detail
namespace {

using detail::bytes_per_element;
using detail::group_digits;
using detail::kAlign;
using detail::round_up;
using detail::state_bytes_per_element;

// "16Ψ", "4Ψ + 12Ψ/R", "16Ψ/R": the ZeRO paper's form of a stage's model states.
std::string paper_form(uint64_t replicated, uint64_t sharded) {
  std::string s;
  if (replicated) s = fmt::format("{}Ψ", replicated);
  if (sharded) s += fmt::format("{}{}Ψ/R", s.empty() ? "" : " + ", sharded);
  return s.empty() ? "0" : s;
}

void check_input(const EstimateInput& in) {
  if (in.ranks < 1) throw ConfigError(fmt::format("--ranks: must be at least 1, got {}", in.ranks));
  if (in.model.flat_elements == 0) throw ConfigError("--params: the model has no parameters; give a count >= 1");
}

}  // namespace

ZeroLimits zero_limits_of(const ZeroConfig& zero) {
  ZeroLimits l;
  l.reduce_bucket_size = zero.reduce_bucket_size;
  l.allgather_bucket_size = zero.allgather_bucket_size;
  l.stage3_prefetch_bucket_size = zero.stage3_prefetch_bucket_size;
  l.stage3_param_persistence_threshold = zero.stage3_param_persistence_threshold;
  l.stage3_max_live_parameters = zero.stage3_max_live_parameters;
  l.sub_group_size = zero.sub_group_size;
  l.offload_optimizer_buffer_count = zero.offload_optimizer.buffer_count;
  l.offload_param_buffer_count = zero.offload_param.buffer_count;
  l.offload_param_buffer_size = zero.offload_param.buffer_size;
  l.offload_param_max_in_cpu = zero.offload_param.max_in_cpu;
  l.overlap_comm = zero.overlap_comm;
  return l;
}

StageOffload stage_offload(const EstimateInput& in, int stage) {
  StageOffload o;
  if (stage >= 1) o.optimizer = in.offload_optimizer;
  if (stage == 3) o.param = in.offload_param;
  return o;
}

// Note [staging bound]
// At stage 2/3 (engine/detail/grad_reducer.h) a bucket's staging buffer is allocated when the first module
// whose parameters it holds starts its backward, and freed when the bucket, launched once complete, is
// retired; at most kMaxInFlight = 2 launched buckets stay unretired. So at any moment the buffers
// alive are at most: 2 launched, 1 being launched, the buckets touched by the chain of running modules
// (a module and its ancestors: the GPT's own wte and wpe are in use for the whole backward), and 1
// straddling bucket left partly filled by finished modules (their parameters form a suffix of the
// canonical order). The bound is the K largest buckets, K = 4 + the largest such chain's bucket count.
// With only --params the chain is taken as 2 buckets.
constexpr uint64_t kStagingFixedBuckets = 4;
constexpr uint64_t kUnknownChainBuckets = 2;

ModelFacts model_facts(nn::Model& model, const ZeroLimits& limits) {
  nn::assign_names(model);
  std::vector<ParamGroup> groups = group_by_expert_parallel_size(model.all_params());
  FlatLayout layout(groups.front().params);
  auto slots = layout.slots();
  ModelFacts f;
  f.exact_layout = true;
  f.param_elements = layout.param_elements();
  f.flat_elements = layout.total();
  f.tensors = layout.param_ranges();
  for (size_t g = 1; g < groups.size(); ++g) {
    FlatLayout experts(groups[g].params);
    f.param_elements += experts.param_elements();
    f.experts.push_back({groups[g].expert_parallel_size, experts.total()});
  }
  std::unordered_map<const nn::Parameter*, size_t> slot_of;
  for (size_t i = 0; i < slots.size(); ++i) {
    slot_of[slots[i].param] = i;
    f.largest_param_elements = std::max<uint64_t>(f.largest_param_elements, slots[i].numel);
  }
  auto buckets = plan_buckets(layout, static_cast<size_t>(limits.reduce_bucket_size));
  std::vector<size_t> bucket_of_slot(slots.size());
  for (size_t k = 0; k < buckets.size(); ++k) {
    for (size_t s = buckets[k].first_slot; s < buckets[k].end_slot; ++s) bucket_of_slot[s] = k;
  }

  // Walk every chain root -> module, as engine/param_gatherer.cpp does: a module's own parameters are
  // one range from its first slot to the end of its last parameter (padding after it excluded).
  std::vector<size_t> chain_buckets;  // buckets of the current chain (with repeats)
  uint64_t max_chain_buckets = 0;
  std::function<void(nn::Module&, uint64_t)> walk = [&](nn::Module& m, uint64_t chain) {
    std::vector<nn::Parameter*> own;  // the dense layout's (expert parameters: see ModelFacts::experts)
    for (nn::Parameter* p : m.params()) {
      if (slot_of.count(p)) own.push_back(p);
    }
    const size_t mark = chain_buckets.size();
    if (!own.empty()) {
      const size_t first = slot_of.at(own.front()), last = slot_of.at(own.back());
      const uint64_t range = slots[last].offset + slots[last].numel - slots[first].offset;
      f.module_elements.push_back(range);
      if (static_cast<int64_t>(range) < limits.stage3_param_persistence_threshold) {
        f.persistent_elements += range;
        ++f.persistent_modules;
      } else {
        f.nonpersistent_elements += range;
        chain += range;
      }
      for (nn::Parameter* p : own) chain_buckets.push_back(bucket_of_slot[slot_of.at(p)]);
    }
    if (chain > f.gather_chain_elements) {
      f.gather_chain_elements = chain;
      f.gather_chain_module = m.display_name();
    }
    std::vector<size_t> distinct = chain_buckets;
    std::sort(distinct.begin(), distinct.end());
    max_chain_buckets = std::max<uint64_t>(max_chain_buckets, std::unique(distinct.begin(), distinct.end()) - distinct.begin());
    for (nn::Module* c : m.children()) walk(*c, chain);
    chain_buckets.resize(mark);
  };
  walk(model, 0);

  std::sort(f.module_elements.begin(), f.module_elements.end());
  std::vector<uint64_t> sizes;
  for (const BucketPlan& bp : buckets) sizes.push_back(bp.range.size);
  std::sort(sizes.rbegin(), sizes.rend());
  f.bucket_count = sizes.size();
  f.staging_buckets = std::min<uint64_t>(sizes.size(), kStagingFixedBuckets + max_chain_buckets);
  for (uint64_t k = 0; k < f.staging_buckets; ++k) f.staging_elements += sizes[k];
  return f;
}

EstimateInput estimate_input_for_params(uint64_t n_params, int ranks, Precision precision) {
  if (n_params == 0) throw ConfigError("--params: must be at least 1 (the number of model parameters, e.g. 125M or 1.5e9)");
  EstimateInput in;
  in.ranks = ranks;
  in.precision = precision;
  in.model.description = fmt::format("{} parameters (--params)", group_digits(n_params));
  in.model.param_elements = n_params;
  in.model.flat_elements = round_up(n_params, kAlign);
  in.model.tensors = {{0, n_params}};  // the layout is not known: one tensor
  in.optimizer = "AdamW";
  return in;
}

EstimateInput estimate_input_for_config(const run::RunConfig& cfg, int world, std::optional<uint64_t> n_params,
                                        int pipeline_stage, int ranks_per_host) {
  EstimateInput in;
  in.zero = zero_limits_of(cfg.zero);
  // Tensor parallelism: the states are rank 0's slices, sharded over the data-parallel ranks (Note
  // [tensor-parallel parameters] in engine/engine.h); every tp rank's are of the same sizes.
  const int tp = cfg.built_in_model() ? cfg.tensor_parallel.tensor_parallel_size : 1;
  // Pipeline parallelism: one stage's states over its data-parallel group (world / (tp x pp) ranks).
  const int pp = cfg.model ? cfg.pipeline.pipeline_parallel_size : 1;
  if (world % (tp * pp) != 0) {
    throw ConfigError(fmt::format("model.tensor_parallel_size {} x model.pipeline_parallel_size {} does not divide the "
                                  "{} ranks estimated; estimate a multiple of {} ranks",
                                  tp, pp, world, tp * pp));
  }
  if (pipeline_stage < 0 || pipeline_stage >= pp) {
    throw ConfigError(fmt::format("--pp-stage: {} is not a stage of model.pipeline_parallel_size {}; use 0..{}",
                                  pipeline_stage, pp, pp - 1));
  }
  const int ranks = world / (tp * pp);
  const HostLayout hosts{.ranks_per_host = ranks_per_host, .tp = tp, .dp = ranks, .pp = pp};
  MeasureGroups groups;
  groups.dp_hosts = hosts.dp_hosts(0, pipeline_stage);
  if (cfg.model_llama) {
    if (n_params) {
      throw ConfigError("--params: the config's model section already gives the model; drop --params or the model section");
    }
    const nn::LlamaConfig& l = *cfg.model_llama;
    std::shared_ptr<nn::Model> model;  // declares the parameters; allocates nothing
    model = detail::builtin_llama(l, tp, groups);
    in.model = model_facts(*model, in.zero);
    in.model.description =
        fmt::format("LLaMA n_layer {} d_model {} n_head {} n_kv_head {} d_ff {} max_seq_len {} vocab {}{}: {} parameters",
                    l.n_layer, l.d_model, l.n_head, l.n_kv_head, nn::llama_d_ff(l), l.max_seq_len, l.vocab_size,
                    tp > 1 ? fmt::format(", tensor-parallel {} (one tp rank's slices, over {} data-parallel ranks)", tp,
                                         ranks)
                           : std::string(),
                    group_digits(in.model.param_elements));
    auto source = std::make_shared<DatasetSource>(nn::Dataset::builtin(l.max_seq_len), cfg.seed);
    EngineConfig measured = cfg;
    if (cfg.recompute.blocks != RecomputeConfig::Blocks::kNone) {
      // As zeroshard train does: LLaMA's blocks are marked by the program, not by the engine.
      const nn::GptRecompute r = gpt_recompute(cfg.recompute, l.n_layer);
      if (tp > 1) {
        static_cast<tp::LlamaModel&>(*model).set_recompute(r);
      } else {
        static_cast<nn::LlamaModel&>(*model).set_recompute(r);
      }
      measured.recompute.applied_by_program = true;
    }
    in.measure = std::make_shared<EstimateInput::MeasureTarget>(EstimateInput::MeasureTarget{model, source, measured, groups});
  } else if (cfg.model) {
    if (n_params) {
      throw ConfigError("--params: the config's model section already gives the model; drop --params or the model section");
    }
    std::shared_ptr<nn::Model> model = detail::builtin_model(cfg, ranks, pipeline_stage, hosts, groups);  // declares; allocates nothing
    in.model = model_facts(*model, in.zero);
    const auto& m = *cfg.model;
    const std::string moe_part =
        cfg.model_moe ? fmt::format(", {} experts top-{} every {} block(s), ep_size {}", cfg.model_moe->moe.num_experts,
                                    cfg.model_moe->moe.k, cfg.model_moe->every_n_layers, cfg.model_moe->moe.ep_size)
                      : std::string();
    const std::string tp_part =
        tp > 1 ? fmt::format(", tensor-parallel {}{} (one tp rank's slices, over {} data-parallel ranks)", tp,
                             cfg.tensor_parallel.sequence_parallel ? " with sequence parallelism" : "", ranks)
               : std::string();
    const std::string pp_part =
        pp > 1 ? fmt::format(", pipeline stage {} of {} ({}{}, {} micro-batches per step; over {} data-parallel ranks)",
                             pipeline_stage, pp, pp::schedule_name(cfg.pipeline.schedule),
                             cfg.pipeline.virtual_pipeline_size > 1
                                 ? fmt::format(" with {} virtual chunks", cfg.pipeline.virtual_pipeline_size)
                                 : std::string(),
                             cfg.batch.gradient_accumulation_steps, ranks)
               : std::string();
    in.model.description = fmt::format("GPT{} n_layer {} d_model {} n_head {} seq_len {} vocab {}{}{}{}{}: {} parameters{}",
                                       cfg.model_moe ? "-MoE" : "", m.n_layer, m.d_model, m.n_head, m.seq_len,
                                       m.vocab_size, m.tied_embeddings ? "" : " (untied head)", moe_part, tp_part,
                                       pp_part, group_digits(in.model.param_elements), pp > 1 ? " on this stage" : "");
    if (pp > 1) {
      in.pipeline = {.stage = pipeline_stage,
                     .stages = pp,
                     .schedule = pp::schedule_name(cfg.pipeline.schedule),
                     .micro_batches = cfg.batch.gradient_accumulation_steps,
                     .chunks = cfg.pipeline.virtual_pipeline_size,
                     .in_flight = pp::max_in_flight(cfg.pipeline.schedule,
                                                    {.stages = pp,
                                                     .chunks = cfg.pipeline.virtual_pipeline_size,
                                                     .micro_batches = cfg.batch.gradient_accumulation_steps},
                                                    pipeline_stage)};
    }
    // Batches of the built-in corpus: their shapes are what counts (the arithmetic is skipped).
    auto source = std::make_shared<DatasetSource>(nn::Dataset::builtin(m.seq_len), cfg.seed);
    EngineConfig measured = cfg;
    if (pp > 1 && cfg.recompute.blocks != RecomputeConfig::Blocks::kNone) {
      measured.recompute.applied_by_program = true;  // the stage's chunks recompute (gpt_pipeline_config)
    } else if (tp > 1 && !cfg.model_moe && cfg.recompute.blocks != RecomputeConfig::Blocks::kNone) {
      // As zeroshard train does: the tensor-parallel GPT's blocks are marked here, not by the engine.
      static_cast<tp::GptModel&>(*model).set_recompute(gpt_recompute(cfg.recompute, m.n_layer));
      measured.recompute.applied_by_program = true;
    }
    in.measure = std::make_shared<EstimateInput::MeasureTarget>(EstimateInput::MeasureTarget{model, source, measured, groups});
  } else {
    if (!n_params) {
      throw ConfigError("model: the config has no model section, so the estimator does not know the model size; add a "
                        "model section or give --params N");
    }
    in = estimate_input_for_params(*n_params, ranks, cfg.precision);
    in.zero = zero_limits_of(cfg.zero);
  }
  in.ranks = ranks;
  in.precision = cfg.precision;
  in.optimizer = cfg.optimizer.name();
  in.compressed = cfg.optimizer.compressed();
  in.zero_one = in.compressed && cfg.optimizer.compressed_traits()->local_steps;
  in.compressed_state_bytes = cfg.optimizer.state_bytes_per_param();
  in.per_tensor_scales = placement_rules(cfg).per_tensor_scales;
  in.optimizer_states = cfg.optimizer.state_specs();
  in.memory = cfg.memory;
  in.config_stage = cfg.zero.stage;
  in.offload_optimizer = cfg.zero.offload_optimizer.device;
  in.offload_param = cfg.zero.offload_param.device;
  return in;
}

EstimateInput estimate_input_for_model(nn::Model& model, BatchSource& source, const EngineConfig& cfg, int ranks,
                                       std::string description) {
  // The config's rules with a placeholder size, then the model's own facts.
  EstimateInput in = estimate_input_for_config(run::RunConfig(cfg), ranks, uint64_t{1});
  in.model = model_facts(model, in.zero);
  in.model.description = fmt::format("{}: {} parameters", description, group_digits(in.model.param_elements));
  // Not owned: the caller keeps the model and the source alive.
  in.measure = std::make_shared<EstimateInput::MeasureTarget>(EstimateInput::MeasureTarget{
      std::shared_ptr<nn::Model>(&model, [](nn::Model*) {}), std::shared_ptr<BatchSource>(&source, [](BatchSource*) {}), cfg, {}});
  return in;
}

StateBytes model_state_bytes(const EstimateInput& in, int stage, int rank) {
  return tiered_state_bytes(in, stage, rank).total();
}

const ShardGroup& StageEstimate::group_of(int rank) const {
  for (const ShardGroup& g : shards) {
    if (rank >= g.first_rank && rank <= g.last_rank) return g;
  }
  ZS_ASSERT(false, "rank {} not in the stage {} estimate", rank, stage);
  return shards.front();
}

uint64_t StageEstimate::max_model_state_bytes() const {
  uint64_t m = 0;
  for (const ShardGroup& g : shards) m = std::max(m, g.total());
  return m;
}

namespace {

// Each rank class's device peak at st.stage, by running the engine over the measuring backend
// (estimate/measure.h) with the stage's settings.
void measure_device_peaks(const EstimateInput& in, StageEstimate& st) {
  if (!in.measure) {
    for (ShardGroup& g : st.shards) {
      g.device_peak.formula = "needs the model: give --config with a model section (or, for your own model, "
                              "engine::estimate_input_for_model in C++)";
    }
    return;
  }
  EngineConfig cfg = in.measure->config;
  cfg.zero.stage = st.stage;
  cfg.precision = in.precision;
  cfg.memory = in.memory;
  cfg.zero.offload_optimizer.device = st.offload.optimizer;
  cfg.zero.offload_param.device = st.offload.param;
  const Measurement m = estimate(*in.measure->model, cfg, in.ranks, *in.measure->source, 2, in.measure->groups);
  for (ShardGroup& g : st.shards) {
    const RankMeasurement& r = m.of_rank(g.first_rank);
    DevicePeak& p = g.device_peak;
    p.applies = true;
    p.bytes = r.memory.device_peak_bytes;
    p.reserved_bytes = r.memory.device_reserved_peak_bytes;
    p.by_category = r.memory.device_peak_by_category;
    p.activations = p.by_category[static_cast<size_t>(memory::Category::kActivations)];
    p.activation_peak = r.memory.activation_peak_bytes;
    p.capacity = r.memory.device_capacity_bytes;
    p.transfers = r.transfers;
    p.comm_bytes_sent = r.comm_bytes_sent;
    p.micro_batches_in_flight = r.max_in_flight;
    // The schedule's bound is what the stage's pipeline held (it builds one chunk instance per
    // micro-batch in flight).
    ZS_ASSERT(in.pipeline.stages == 1 || r.max_in_flight == in.pipeline.in_flight,
              "pipeline stage {}: the measured run held {} micro-batches, the {} schedule says {}", in.pipeline.stage,
              r.max_in_flight, in.pipeline.schedule, in.pipeline.in_flight);
    const EstimateInput::PipelineStage& ps = in.pipeline;
    p.formula = fmt::format("measured: the engine's own code over a measuring backend, {} training steps as rank {} of {}{} "
                            "(no arithmetic, no memory committed)",
                            m.steps, g.first_rank, in.ranks,
                            ps.stages == 1 ? std::string()
                            : ps.chunks == 1
                                ? fmt::format(" of pipeline stage {} ({} schedule: {} of {} micro-batches in flight)",
                                              ps.stage, ps.schedule, ps.in_flight, ps.micro_batches)
                                : fmt::format(" of pipeline stage {} ({} schedule: {} of {} micro-batches x {} chunks "
                                              "in flight)",
                                              ps.stage, ps.schedule, ps.in_flight, ps.micro_batches, ps.chunks));
  }
}

}  // namespace

StageEstimate estimate_stage(const EstimateInput& in, int stage) {
  if (stage < 0 || stage > 3) throw ConfigError(fmt::format("--stage: ZeRO stage {} does not exist; use 0, 1, 2, 3 or all", stage));
  check_input(in);
  detail::check_offload(in, stage);
  const uint64_t b = bytes_per_element(in.precision);
  const bool reuse = in.memory.reuse_fp32_param && in.precision == Precision::kBf16;
  const uint64_t m = detail::master_bytes_at(in, stage);
  const double k = state_bytes_per_element(in);
  const uint64_t psi = in.model.flat_elements;
  const std::string dtype = precision_name(in.precision);
  StageEstimate st;
  st.stage = stage;
  st.offload = stage_offload(in, stage);
  st.master_bytes_per_element = m;

  for (int r = 0; r < in.ranks; ++r) {
    const uint64_t shard = memory::shard_of(psi, in.ranks, r, kAlign).size;
    const TieredStateBytes t = tiered_state_bytes(in, stage, r);
    // With expert parameters ranks of one dense shard size may differ in their expert shards.
    if (!st.shards.empty() && st.shards.back().shard_elements == shard && st.shards.back().device == t.device &&
        st.shards.back().host == t.host && st.shards.back().nvme == t.nvme) {
      st.shards.back().last_rank = r;
      continue;
    }
    ShardGroup g;
    g.first_rank = g.last_rank = r;
    g.shard_elements = shard;
    g.device = t.device;
    g.host = t.host;
    g.nvme = t.nvme;
    g.offload_buffers = offload_buffer_bytes(in, stage, r);
    st.shards.push_back(g);
  }
  measure_device_peaks(in, st);

  auto full_or_shard = [&](bool sharded, const std::string& what) {
    return fmt::format("{} x {} ({} {}, {})", b, sharded ? "S_r" : "Ψ", dtype, what,
                       sharded ? "this rank's shard" : "full replica");
  };
  st.params_formula = full_or_shard(stage == 3, "parameters");
  const int grad_stage = in.compressed ? std::min(stage, 1) : stage;
  st.grads_formula = full_or_shard(grad_stage >= 2, "gradients");
  if (in.precision != Precision::kFp32 && !in.memory.release_fp32_grad) {
    st.grads_formula += fmt::format(" + 4 x {} (persistent fp32 gradients: release_fp32_grad off)",
                                    in.compressed ? (grad_stage >= 2 ? "S_r" : "Ψ") : (stage >= 1 ? "S_r" : "Ψ"));
  }
  const std::string states = fmt::format("{:g} {} states", k, in.optimizer);
  const std::string master = reuse                              ? "2 fp32-master residual (reuse_fp32_param)"
                             : in.precision == Precision::kFp32 ? fmt::format("{} fp32 master (a separate copy: offloaded)", m)
                                                                : fmt::format("{} fp32 master", m);
  const std::string mult = m ? fmt::format("({} + {}) = {:g}", master, states, static_cast<double>(m) + k)
                             : fmt::format("({}; the fp32 parameters are the master weights)", states);
  st.optimizer_formula = fmt::format("{} x {}", mult, stage >= 1 ? "S_r" : "Ψ");
  if (in.compressed) {
    // The error feedback (comm::OneBitAllreduce::state_floats_for): the flat buffer and one server chunk
    // with scale blocks; per tensor, each tensor padded to a multiple of R x DeepSpeed's divider (P) and
    // this rank's chunk of each.
    const char* stepped = stage >= 1 ? "S_r" : "Ψ";
    st.optimizer_formula = fmt::format("{}4 x {} variance + 4 x Ψ momentum + 4 x {} error feedback{}: {}",
                                       m ? fmt::format("{} x {} fp32 master + ", m, stepped) : std::string(), stepped,
                                       in.per_tensor_scales ? "(P + P/R) (per-tensor scales; P: each tensor padded to a "
                                                              "multiple of R x DeepSpeed's divider)"
                                                            : "(Ψ + Ψ/R)",
                                       in.zero_one && stage == 0 ? " + 4 x Ψ accumulator" : "",
                                       "one-bit optimizers keep whole momentum (docs/memory.md)");
  }
  st.params_formula += detail::params_tier_note(in, stage);
  st.grads_formula += detail::grads_tier_note(in, stage);
  st.optimizer_formula += detail::optimizer_tier_note(in, stage);
  st.offload_buffers_formula = detail::offload_buffers_symbols(in, stage);
  const auto kk = static_cast<uint64_t>(k);
  const uint64_t replicated = (stage < 3 ? b : 0) + (grad_stage < 2 ? b : 0) + (stage < 1 ? m + kk : 0);
  st.paper_formula = paper_form(replicated, 2 * b + m + kk - replicated);

  const ModelFacts& f = in.model;
  if (stage >= 2) {
    st.grad_buckets.applies = true;
    if (f.exact_layout) {
      st.grad_buckets.bytes = b * f.staging_elements;
      st.grad_buckets.formula = fmt::format(
          "{} x {} elements: the {} largest of {} buckets of reduce_bucket_size {} (2 in flight + 1 launching + 1 "
          "partly filled + those of the running modules)",
          b, group_digits(f.staging_elements), f.staging_buckets, f.bucket_count, group_digits(in.zero.reduce_bucket_size));
    } else {
      const uint64_t bucket = std::min<uint64_t>(static_cast<uint64_t>(in.zero.reduce_bucket_size), psi);
      const uint64_t count = kStagingFixedBuckets + kUnknownChainBuckets;
      st.grad_buckets.bytes = b * std::min(psi, count * bucket);
      st.grad_buckets.formula = fmt::format(
          "{} x min(Ψ, {} x reduce_bucket_size {}) (2 in flight + 1 launching + 1 partly filled + 2 for the running "
          "modules, assumed)",
          b, count, group_digits(in.zero.reduce_bucket_size));
    }
  }
  if (stage == 3) {
    st.gathered_params.applies = true;
    const uint64_t prefetch = static_cast<uint64_t>(in.zero.stage3_prefetch_bucket_size);
    if (f.exact_layout) {
      st.gathered_params.bytes = b * std::min(f.nonpersistent_elements, f.gather_chain_elements + prefetch);
      // No chain when every module is below stage3_param_persistence_threshold (a small model: all
      // kept gathered), so there is no module to name.
      const std::string chain = f.gather_chain_module.empty()
                                    ? std::string("running chain 0 (every module persistent)")
                                    : fmt::format("running chain {} (down to {})", group_digits(f.gather_chain_elements),
                                                  f.gather_chain_module);
      st.gathered_params.formula = fmt::format("{} x min(non-persistent {}, {} + stage3_prefetch_bucket_size {})", b,
                                               group_digits(f.nonpersistent_elements), chain, group_digits(prefetch));
      st.persistent_params.applies = true;
      st.persistent_params.bytes = b * f.persistent_elements;
      st.persistent_params.formula =
          fmt::format("{} x {} elements: {} modules below stage3_param_persistence_threshold {}, kept gathered", b,
                      group_digits(f.persistent_elements), f.persistent_modules,
                      group_digits(in.zero.stage3_param_persistence_threshold));
    } else {
      const uint64_t live = static_cast<uint64_t>(in.zero.stage3_max_live_parameters);
      st.gathered_params.bytes = b * std::min(psi, live);
      st.gathered_params.formula =
          fmt::format("{} x min(Ψ, stage3_max_live_parameters {}) (the model's modules are unknown with --params)", b,
                      group_digits(live));
      st.persistent_params.formula = "unknown with --params (needs the module shapes; give --config)";
    }
    st.nvme_param_staging = detail::nvme_param_staging_bound(in, stage);
  }
  if (st.shards.front().device_peak.applies) {
    const DevicePeak& p = st.shards.front().device_peak;
    st.activations_peak = {true, p.activation_peak,
                           "measured: the arena's activation bytes at their peak over one training step (rank 0)"};
  }
  return st;
}

MemoryEstimate estimate_memory(const EstimateInput& in, const std::vector<int>& stages) {
  check_input(in);
  MemoryEstimate est;
  est.input = in;
  est.bytes_per_element = bytes_per_element(in.precision);
  est.master_bytes_per_element = detail::master_bytes_at(in, 0);  // without offload; per stage in StageEstimate
  for (int s : stages) est.stages.push_back(estimate_stage(in, s));
  return est;
}

}  // namespace zs::engine
