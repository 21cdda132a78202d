// The estimator's offload rules: which tier each model state lives on (ZeRO-Offload, ZeRO-Infinity),
// the NVMe step's host buffers and the stage-3 NVMe staging bound (estimate/estimate.h).
#include <algorithm>
#include <utility>
#include <vector>

#include "core/errors.h"
#include "estimate/detail/estimate_util.h"
#include "estimate/estimate.h"
#include "engine/offload_rules.h"
#include "memory/shard.h"

namespace zs::engine {

// Note [estimated offload]
// The engine's placement (Note [model-state placement] in engine/placement.h, ModelStates::place in
// engine/model_states.cpp, init_nvme in engine/model_states_nvme.cpp), per rank and stage, S = S_r and
// stepped = S at stages 1-3 (optimizer offload needs stage >= 1, parameter offload stage 3):
//   params      offload_param cpu: the b S shard on the host; nvme: a swap-file region of b S.
//   grads       offload_optimizer at stages 2-3: the b S gradient shard (and the 4 S persistent fp32
//               copy when release_fp32_grad is off) on the host; at stage 1 the whole gradient buffer
//               and its fp32 copy stay on the device (the reduce-scatter works in place there).
//   optimizer   offload_optimizer cpu/nvme: the fp32 master (a separate buffer whenever the optimizer
//               is offloaded or the parameters are on NVMe, in fp32 too) and each optimizer state
//               (spec.bytes_for(stepped): CAdam's int8 values and fp32 block scales too) on the host
//               or as swap-file regions.
// Host buffers are anonymous mappings of a whole number of 4096-byte pages, and swap-file regions
// reserve their size rounded up to 4096, so both tiers count each buffer or region rounded up to 4096
// (the MemoryTracker's host and nvme figures; nvme_bytes is the files' size exactly).
// NVMe step (engine/model_states_nvme.cpp): B = offload_optimizer.buffer_count when the optimizer is on NVMe,
// else offload_param.buffer_count; a sub-group has n = min(round_up(sub_group_size, 32768),
// round_up(ceil(stepped / B), 32768)) elements, G = ceil(stepped / n) sub-groups; the swapper holds
// min(B, G) buffers of the largest (the first) sub-group, whose items are each rounded up to 4096:
// master 4n and each state bytes_for(n) when the optimizer is on NVMe, params b n when they are. The
// initialising pass's swapper (same size) is gone before the step's is made, so this is the peak.
// Stage-3 NVMe staging (param_gatherer.cpp): a gather reads this rank's owned part of a module's range
// into a host buffer spanning whole 4096-byte pages around it; the buffer lives until the gather
// finishes. Alive at once: the prefetched modules (at most the prefetch window, min(
// stage3_prefetch_bucket_size, offload_param buffer_count x buffer_size, max_in_cpu) elements) and the module
// being fetched (at most the largest module). Each owned part is within this rank's shard, so
// elements <= min(S, window + largest module); a buffer spans at most b x its part + 2 x 4096 - 2
// bytes (a page-straddling start and end), so the bound adds 8 KiB per buffer, for 1 + the most
// modules whose ranges fit in the window together. With --params the modules are unknown: no bound.

namespace detail {
namespace {

uint64_t page(uint64_t bytes) { return round_up(bytes, kPageBytes); }

std::string where(OffloadDevice t) {
  return t == OffloadDevice::kCpu ? "host" : t == OffloadDevice::kNvme ? "NVMe swap file" : "device";
}

// One item of an NVMe sub-group buffer: what it is, its size in terms of n, its bytes.
struct SubGroupItem {
  std::string name;
  std::string per_n;
  uint64_t bytes = 0;
};

std::vector<SubGroupItem> sub_group_items(const EstimateInput& in, const StageOffload& off, uint64_t n) {
  // The engine's item list (Note [NVMe sub-group items] in engine/offload_rules.h), named for people.
  engine::NvmeSubGroupItems layout;
  layout.optimizer = off.optimizer == OffloadDevice::kNvme;
  if (layout.optimizer) layout.states.assign(in.optimizer_states.begin(), in.optimizer_states.end());
  layout.param_bytes = off.param == OffloadDevice::kNvme ? bytes_per_element(in.precision) : 0;
  std::vector<SubGroupItem> items;
  for (const engine::NvmeSubGroupItems::Item& it : layout.items(0, n)) {
    switch (it.kind) {
      case engine::NvmeSubGroupItems::Kind::kMaster: items.push_back({"fp32 master", "4n", page(it.bytes)}); break;
      case engine::NvmeSubGroupItems::Kind::kState: {
        const optim::StateSpec& spec = layout.states[it.state];
        std::string per_n = spec.elements_per_value == 1 ? fmt::format("{}n", spec.value_bytes)
                                                         : fmt::format("{} ceil(n/{})", spec.value_bytes, spec.elements_per_value);
        items.push_back({std::string(spec.name), std::move(per_n), page(it.bytes)});
        break;
      }
      case engine::NvmeSubGroupItems::Kind::kParams:
        items.push_back({fmt::format("{} params", precision_name(in.precision)), fmt::format("{}n", layout.param_bytes),
                         page(it.bytes)});
        break;
    }
  }
  return items;
}

}  // namespace

void check_offload(const EstimateInput& in, int stage) {
  const StageOffload off = stage_offload(in, stage);
  if (off.optimizer == OffloadDevice::kNone) return;
  const std::string target = offload_device_name(off.optimizer);
  if (in.compressed) {
    throw ConfigError(fmt::format("--offload {}: {} keeps whole-model momentum and error buffers beside the sharded states, "
                                  "and zeroshard does not offload those yet (zero_optimization.offload_optimizer refuses "
                                  "it too); use Adam, AdamW or CAdam with offload, or --offload none",
                                  target, in.optimizer));
  }
  if (in.memory.reuse_fp32_param) {
    throw ConfigError(fmt::format("--offload {}: with memory.reuse_fp32_param the master weight lives inside the bf16 "
                                  "parameters on the device, so it cannot be offloaded; set memory.reuse_fp32_param to "
                                  "false or use --offload none",
                                  target));
  }
}

std::string params_tier_note(const EstimateInput& in, int stage) {
  const OffloadDevice t = stage_offload(in, stage).param;
  if (t == OffloadDevice::kNone) return "";
  return fmt::format(" -> {} (offload_param {}; rounded up to 4096 B)", where(t), offload_device_name(t));
}

std::string grads_tier_note(const EstimateInput& in, int stage) {
  if (stage_offload(in, stage).optimizer == OffloadDevice::kNone) return "";
  if (stage >= 2) return " -> host (offload_optimizer moves the gradient shard; each buffer rounded up to 4096 B)";
  return " on the device (stage 1 reduce-scatters in place in the whole buffer: not offloaded)";
}

std::string optimizer_tier_note(const EstimateInput& in, int stage) {
  const OffloadDevice t = stage_offload(in, stage).optimizer;
  if (t == OffloadDevice::kNone) return "";
  return fmt::format(" -> {} (offload_optimizer {}; the master and each state rounded up to 4096 B)", where(t),
                     offload_device_name(t));
}

std::string offload_buffers_symbols(const EstimateInput& in, int stage) {
  const StageOffload off = stage_offload(in, stage);
  if (!off.nvme()) return "";
  std::string items;
  for (const SubGroupItem& it : sub_group_items(in, off, 1)) {
    items += fmt::format("{}{} {}", items.empty() ? "" : " + ", it.per_n, it.name);
  }
  return fmt::format("min(B, G) x ({}), each item rounded up to 4096 B; B = {}.buffer_count, n = min(round_up(sub_group_size, "
                     "32768), round_up(ceil(S_r / B), 32768)) elements per sub-group, G = ceil(S_r / n) sub-groups",
                     items, off.optimizer == OffloadDevice::kNvme ? "offload_optimizer" : "offload_param");
}

uint64_t nvme_prefetch_window(const EstimateInput& in) {
  return engine::nvme_prefetch_window(static_cast<size_t>(in.zero.stage3_prefetch_bucket_size),
                                      static_cast<size_t>(in.zero.offload_param_buffer_count),
                                      static_cast<size_t>(in.zero.offload_param_buffer_size),
                                      static_cast<size_t>(in.zero.offload_param_max_in_cpu));
}

TransientBound nvme_param_staging_bound(const EstimateInput& in, int stage) {
  TransientBound t;
  if (stage_offload(in, stage).param != OffloadDevice::kNvme) return t;
  const ModelFacts& f = in.model;
  const uint64_t b = bytes_per_element(in.precision);
  const uint64_t shard = memory::shard_of(f.flat_elements, in.ranks, 0, kAlign).size;  // the largest
  const uint64_t window = nvme_prefetch_window(in);
  if (!f.exact_layout || f.module_elements.empty()) {
    t.formula = fmt::format("{} x S_r ({}) + 8 KiB per module read at once: the modules are unknown with --params (give "
                            "--config with a model section)",
                            b, format_bytes(b * shard));
    return t;
  }
  const uint64_t all = f.persistent_elements + f.nonpersistent_elements;
  const uint64_t largest = f.module_elements.back();
  uint64_t fit = 0, sum = 0;
  for (uint64_t e : f.module_elements) {  // ascending: the most modules the window can hold at once
    if (sum + e > window) break;
    sum += e;
    ++fit;
  }
  const uint64_t elements = std::min(shard, std::min(window, all) + largest);
  t.applies = true;
  t.bytes = b * elements + 2 * kPageBytes * (fit + 1);
  t.formula = fmt::format("{} x min(S_r {}, min(prefetch window {}, all modules {}) + largest module {}) + 8 KiB x {} buffers "
                          "(page alignment; 1 fetching + up to {} prefetched); window = min(stage3_prefetch_bucket_size "
                          "{}, offload_param buffer_count {} x buffer_size {}, max_in_cpu {})",
                          b, group_digits(shard), group_digits(window), group_digits(all), group_digits(largest), fit + 1, fit,
                          group_digits(in.zero.stage3_prefetch_bucket_size), in.zero.offload_param_buffer_count,
                          group_digits(in.zero.offload_param_buffer_size), group_digits(in.zero.offload_param_max_in_cpu));
  return t;
}

}  // namespace detail

namespace {

PlacementRules placement_rules_of(const EstimateInput& in, int stage) {
  PlacementRules r;
  r.stage = stage;
  r.precision = in.precision;
  r.memory = in.memory;
  const StageOffload off = stage_offload(in, stage);
  r.offload_optimizer = off.optimizer;
  r.offload_param = off.param;
  r.states = in.optimizer_states;
  r.compressed = in.compressed;
  r.local_steps = in.zero_one;
  r.per_tensor_scales = in.per_tensor_scales;
  return r;
}

}  // namespace

PlacementPlan placement_plan(const EstimateInput& in, int stage, int rank) {
  const size_t psi = in.model.flat_elements;
  return plan_placement(placement_rules_of(in, stage), psi, Partition(psi, in.ranks, rank), "dp", in.model.tensors);
}

std::vector<PlacementPlan> placement_plans(const EstimateInput& in, int stage, int rank) {
  std::vector<PlacementPlan> plans{placement_plan(in, stage, rank)};
  for (const ModelFacts::ExpertLayout& x : in.model.experts) {
    const int e = x.expert_parallel_size;
    if (e < 1 || in.ranks % e != 0) {
      throw ConfigError(fmt::format("--ranks: the model has expert parameters of expert_parallel_size {}, which does not "
                                    "divide {} ranks; give a multiple of {}",
                                    e, in.ranks, e));
    }
    plans.push_back(plan_placement(placement_rules_of(in, stage), x.flat_elements,
                                   Partition(x.flat_elements, in.ranks / e, rank / e), "edp"));
  }
  return plans;
}

TieredStateBytes tiered_state_bytes(const EstimateInput& in, int stage, int rank) {
  // The engine's own placement plan (engine/placement.h), added up by tier; host buffers and swap
  // regions at their 4096-rounded size (Note [estimated offload]).
  TieredStateBytes t;
  for (const PlacementPlan& plan : placement_plans(in, stage, rank)) {
    auto tier = [&](Where w) {
      return StateBytes{plan.bytes(memory::Category::kParams, w, true), plan.bytes(memory::Category::kGrads, w, true),
                        plan.bytes(memory::Category::kOptimizer, w, true)};
    };
    t.device = t.device + tier(Where::kDevice);
    t.host = t.host + tier(Where::kHost);
    t.nvme = t.nvme + tier(Where::kNvme);
  }
  return t;
}

TransientBound offload_buffer_bytes(const EstimateInput& in, int stage, int rank) {
  const StageOffload off = stage_offload(in, stage);
  TransientBound t;
  if (!off.nvme()) return t;
  const uint64_t stepped = memory::shard_of(in.model.flat_elements, in.ranks, rank, detail::kAlign).size;  // stage >= 1
  const uint64_t buffers = static_cast<uint64_t>(off.optimizer == OffloadDevice::kNvme ? in.zero.offload_optimizer_buffer_count
                                                                                        : in.zero.offload_param_buffer_count);
  const uint64_t n = engine::offload_sub_group_elements(stepped, static_cast<size_t>(in.zero.sub_group_size), buffers);
  const uint64_t groups = detail::ceil_div(stepped, n);
  const uint64_t held = std::min(n, stepped);  // elements of the largest (first) sub-group
  uint64_t per_buffer = 0;
  std::string items;
  for (const auto& it : detail::sub_group_items(in, off, held)) {
    per_buffer += it.bytes;
    items += fmt::format("{}{} {}", items.empty() ? "" : " + ", it.per_n, it.name);
  }
  t.applies = true;
  t.bytes = std::min(buffers, groups) * per_buffer;
  t.formula = fmt::format("min(B {}, G {}) x {} B; sub-groups of {} elements = min(round_up(sub_group_size {}, 32768), "
                          "round_up(ceil(S_r {} / B), 32768)); a buffer holds the largest, n = {}: {}, each rounded up to 4096",
                          buffers, groups, detail::group_digits(per_buffer), detail::group_digits(n),
                          detail::group_digits(static_cast<uint64_t>(in.zero.sub_group_size)), detail::group_digits(stepped),
                          detail::group_digits(held), items);
  return t;
}

}  // namespace zs::engine
