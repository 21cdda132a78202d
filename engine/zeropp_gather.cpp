// ZeRO++'s groups and parameter gathers (engine/detail/zeropp_gather.h, Note [ZeRO++]).
#include "engine/detail/zeropp_gather.h"

#include <algorithm>

#include "comm/quantized_collectives.h"
#include "comm/topology.h"
#include "core/errors.h"
#include "engine/detail/engine_impl.h"

namespace zs::engine {

std::unique_ptr<ZeroppGroups> make_zeropp_groups(const comm::Group& dp, const ZeroConfig& z, int expert_parallel_size) {
  if (z.zeropp() && expert_parallel_size > 0) {
    throw ConfigError(fmt::format("zero_optimization: ZeRO++ (zero_hpz_partition_size, zero_quantized_weights, "
                                  "zero_quantized_gradients) with expert parameters (expert_parallel_size {}) is not "
                                  "supported by zeroshard yet: experts are partitioned over their expert-data-parallel "
                                  "group, which has no host groups; remove the ZeRO++ keys for MoE models",
                                  expert_parallel_size));
  }
  // Stage 3 only (the config refuses the keys below it; the estimator may run a config at other stages).
  if (!z.zeropp() || z.stage != 3 || dp.size() == 1) return nullptr;
  const int64_t h = z.zero_hpz_partition_size;
  if (dp.size() % h != 0) {
    throw ConfigError(fmt::format("zero_optimization.zero_hpz_partition_size: {} does not divide the data-parallel size "
                                  "{}: hpZ keeps a secondary partition inside each group of that many consecutive "
                                  "ranks (one host); choose a divisor of {} (the ranks per host)",
                                  h, dp.size(), dp.size()));
  }
  auto g = std::make_unique<ZeroppGroups>();
  g->host_size = static_cast<int>(h);
  if (h == 1 || h == dp.size()) {
    // One host group: dp itself (qgZ in one level; hpZ over every rank saves nothing but is what was asked).
    g->host_size = dp.size();
    g->host = &dp;
    return g;
  }
  comm::Topology::HostGroups groups = comm::Topology::make_host_groups(dp, static_cast<int>(h));
  g->host_split.emplace(std::move(groups.host));
  g->across_split.emplace(std::move(groups.across));
  g->host = &*g->host_split;
  g->across = &*g->across_split;
  return g;
}

ZeroppGather::ZeroppGather(const Options& options, size_t total, const comm::Group& group,
                           memory::DeviceAllocator& device, memory::DType dtype, size_t entries)
    : options_(options), group_(group), device_(device), dtype_(dtype), secondary_valid_(entries, false) {
  if (host() == nullptr) return;
  secondary_partition_.emplace(total, host()->size(), host()->rank());
  // The largest part of the host group (the same on every rank, so a rank's memory depends on its
  // own shard alone: the estimator measures ranks of equal shards once). Allocated once, beside the
  // model states (as the persistent gathered parameters are: Note [persistent gathered parameters]
  // in engine/param_gatherer.cpp).
  size_t largest = 0;
  for (const memory::ShardRange& s : secondary_partition_->shards) largest = std::max(largest, s.size);
  const size_t bytes = largest * memory::dtype_size(dtype_);
  if (bytes > 0) secondary_ = device_.allocate(bytes, memory::Category::kParams, memory::Lifetime::kPersistent);
}

void ZeroppGather::gather(size_t entry, memory::ShardRange range, std::span<const size_t> counts, const memory::Tensor& in,
                          const memory::Tensor& out, bool persistent) {
  if (options_.quantized) {
    const comm::QuantizedAllgather q(group_, counts);
    memory::DeviceBlock wire = device_.allocate(q.scratch_bytes(), memory::Category::kParams, memory::Lifetime::kTransient);
    q.run(in, out, wire.data(), options_.kernels);
  } else {
    group_.allgatherv(in, out, counts);
  }
  if (host() == nullptr || persistent || secondary_valid_[entry]) return;
  const memory::ShardRange part = secondary_partition_->owned(range);
  const size_t es = memory::dtype_size(dtype_);
  if (part.size > 0) {
    device_.backend().copy(static_cast<char*>(secondary_.data()) + (part.offset - secondary_partition_->mine.offset) * es,
                           memory::Tier::kDevice, static_cast<const char*>(out.raw()) + (part.offset - range.offset) * es,
                           memory::Tier::kDevice, part.size * es);
  }
  secondary_valid_[entry] = true;
}

void ZeroppGather::gather_secondary(size_t entry, memory::ShardRange range, const memory::Tensor& out) {
  ZS_ASSERT(has_secondary(entry), "hpZ: no secondary copy of entry {}", entry);
  const memory::ShardRange part = secondary_partition_->owned(range);
  const size_t es = memory::dtype_size(dtype_);
  char* src = part.size > 0 ? static_cast<char*>(secondary_.data()) + (part.offset - secondary_partition_->mine.offset) * es
                            : nullptr;
  memory::Tensor in(src, dtype_, {static_cast<int64_t>(part.size)});
  host()->allgatherv(in, out, secondary_partition_->counts(range));
  ++secondary_gathers_;
}

const comm::Group* Engine::zeropp_host() const {
  const auto& g = impl_->zeropp_groups_;
  return g && g->host_split ? &*g->host_split : nullptr;
}

const comm::Group* Engine::zeropp_across() const {
  const auto& g = impl_->zeropp_groups_;
  return g && g->across_split ? &*g->across_split : nullptr;
}

void ZeroppGather::invalidate() { secondary_valid_.assign(secondary_valid_.size(), false); }

}  // namespace zs::engine
