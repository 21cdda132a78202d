#include "engine/placement.h"

#include <algorithm>

#include "comm/compressed_allreduce.h"
#include "core/errors.h"
#include "optim/onebit_adam.h"

namespace zs::engine {
namespace {

Where where_of(OffloadDevice d) {
  return d == OffloadDevice::kCpu ? Where::kHost : d == OffloadDevice::kNvme ? Where::kNvme : Where::kDevice;
}

uint64_t page_round(uint64_t bytes) { return (bytes + 4095) / 4096 * 4096; }

}  // namespace

memory::Tier tier_of(Where w) {
  return w == Where::kDevice ? memory::Tier::kDevice : w == Where::kHost ? memory::Tier::kHost : memory::Tier::kNvme;
}

PlacementRules placement_rules(const EngineConfig& cfg) {
  PlacementRules r;
  r.stage = cfg.zero.stage;
  r.precision = cfg.precision;
  r.memory = cfg.memory;
  if (r.stage >= 1) r.offload_optimizer = cfg.zero.offload_optimizer.device;
  if (r.stage == 3) r.offload_param = cfg.zero.offload_param.device;
  r.compressed = cfg.optimizer.compressed();
  r.local_steps = r.compressed && cfg.optimizer.compressed_traits()->local_steps;
  if (const auto* o = cfg.optimizer.params_if<optim::OneBitAdamConfig>()) {
    r.per_tensor_scales = o->compression_scale == optim::CompressionScale::kTensor;
  } else if (const auto* z = cfg.optimizer.params_if<optim::ZeroOneAdamConfig>()) {
    r.per_tensor_scales = z->compression_scale == optim::CompressionScale::kTensor;
  }
  if (!r.compressed) {
    auto specs = cfg.optimizer.state_specs();
    r.states.assign(specs.begin(), specs.end());
  }
  return r;
}

std::string_view buffer_role_name(BufferRole role) {
  switch (role) {
    case BufferRole::kParams: return "params";
    case BufferRole::kGrads: return "grads";
    case BufferRole::kFp32Grads: return "fp32_grads";
    case BufferRole::kMaster: return "master";
    case BufferRole::kResidual: return "residual";
    case BufferRole::kOptimizerState: return "optimizer_state";
    case BufferRole::kMomentum: return "momentum";
    case BufferRole::kVariance: return "variance";
    case BufferRole::kAccumulator: return "accumulator";
    case BufferRole::kErrorFeedback: return "error_feedback";
  }
  return "unknown";
}

const PlannedBuffer* PlacementPlan::find(BufferRole role) const {
  for (const PlannedBuffer& b : buffers) {
    if (b.role == role) return &b;
  }
  return nullptr;
}

const PlannedBuffer* PlacementPlan::find(std::string_view name) const {
  for (const PlannedBuffer& b : buffers) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

uint64_t PlacementPlan::bytes(memory::Category category, Where where, bool page_rounded) const {
  uint64_t n = 0;
  for (const PlannedBuffer& b : buffers) {
    if (b.category != category || b.where != where) continue;
    n += page_rounded && where != Where::kDevice ? page_round(b.bytes) : b.bytes;
  }
  return n;
}

PlacementPlan plan_placement(const PlacementRules& r, size_t total, const Partition& partition, const std::string& group,
                             std::span<const memory::ShardRange> tensors) {
  using memory::Category;
  ZS_ASSERT(r.stage >= 0 && r.stage <= 3, "placement for ZeRO stage {}", r.stage);
  PlacementPlan p;
  const bool mixed = r.precision != Precision::kFp32;
  const uint64_t elem = mixed ? 2 : 4;
  const memory::ShardRange whole{0, total};
  p.stage = r.stage;
  p.grad_stage = r.compressed ? std::min(r.stage, 1) : r.stage;
  p.reuse_fp32_param = r.memory.reuse_fp32_param && r.precision == Precision::kBf16;
  p.keep_fp32_grads = !r.memory.release_fp32_grad && mixed;
  p.separate_master = mixed || r.offload_optimizer != OffloadDevice::kNone || r.offload_param == OffloadDevice::kNvme;
  p.stepped = r.stage == 0 ? whole : partition.mine;
  p.params = r.stage == 3 ? partition.mine : whole;
  p.grads = p.grad_stage >= 2 ? partition.mine : whole;
  // The optimizer reads fp32 gradients of what it steps; a compressed optimizer of all it holds.
  if (p.keep_fp32_grads) p.fp32_grads = r.compressed ? p.grads : p.stepped;

  auto add_named = [&](BufferRole role, std::string name, Category c, Where w, memory::ShardRange range, uint64_t bytes) {
    p.buffers.push_back({std::move(name), c, w, range, bytes, group, false, role});
  };
  auto add = [&](BufferRole role, Category c, Where w, memory::ShardRange range, uint64_t bytes) {
    add_named(role, std::string(buffer_role_name(role)), c, w, range, bytes);
  };
  add(BufferRole::kParams, Category::kParams, where_of(r.offload_param), p.params, p.params.size * elem);
  // Stage 1 reduce-scatters in place in the whole gradient buffer, which stays on the device; the
  // gradient shard of stages 2-3 goes where the optimizer steps.
  const Where grads_at = r.offload_optimizer != OffloadDevice::kNone && p.grad_stage >= 2 ? Where::kHost : Where::kDevice;
  add(BufferRole::kGrads, Category::kGrads, grads_at, p.grads, p.grads.size * elem);
  if (p.keep_fp32_grads) add(BufferRole::kFp32Grads, Category::kGrads, grads_at, p.fp32_grads, p.fp32_grads.size * 4);
  const Where opt_at = where_of(r.offload_optimizer);
  if (p.reuse_fp32_param) {
    add(BufferRole::kResidual, Category::kOptimizer, Where::kDevice, p.stepped, p.stepped.size * 2);
  } else if (p.separate_master) {
    add(BufferRole::kMaster, Category::kOptimizer, opt_at, p.stepped, p.stepped.size * 4);
  }
  if (!r.compressed) {
    for (const optim::StateSpec& s : r.states) add_named(BufferRole::kOptimizerState, std::string(s.name), Category::kOptimizer, opt_at, p.stepped, s.bytes_for(p.stepped.size));
    return p;
  }
  add(BufferRole::kMomentum, Category::kOptimizer, Where::kDevice, whole, total * 4);
  add(BufferRole::kVariance, Category::kOptimizer, Where::kDevice, p.stepped, p.stepped.size * 4);
  if (r.local_steps && r.stage == 0) add(BufferRole::kAccumulator, Category::kOptimizer, Where::kDevice, whole, total * 4);
  // The compressed allreduce's own rule (the engine checks that the two agree when it builds it).
  ZS_ASSERT(!r.per_tensor_scales || total == 0 || !tensors.empty(),
            "plan_placement: per-tensor compression scales need the layout's parameter ranges");
  const auto scales = r.per_tensor_scales ? comm::OneBitAllreduce::Scales::kPerTensor : comm::OneBitAllreduce::Scales::kBlocks;
  add(BufferRole::kErrorFeedback, Category::kOptimizer, Where::kDevice, whole,
      comm::OneBitAllreduce::state_floats_for(total, partition.world, tensors, scales) * 4);
  p.buffers.back().owned_by_comm = true;
  return p;
}

}  // namespace zs::engine
