#include "engine/flat_layout.h"

#include <algorithm>

#include "core/errors.h"

namespace zs::engine {

FlatLayout::FlatLayout(std::vector<nn::Parameter*> params) {
  slots_.reserve(params.size());
  size_t offset = 0;
  if (!params.empty()) expert_parallel_size_ = params.front()->expert_parallel_size();
  for (nn::Parameter* p : params) {
    if (p->expert_parallel_size() != expert_parallel_size_) {
      // One layout is sharded over one group: mixing them would shard an expert over the wrong ranks.
      throw ModelError(fmt::format("parameter '{}' has expert_parallel_size {} but '{}' has {}: a flat layout holds the "
                                   "parameters of one partition group; split them with group_by_expert_parallel_size",
                                   p->full_name(), p->expert_parallel_size(), params.front()->full_name(),
                                   expert_parallel_size_));
    }
    size_t n = static_cast<size_t>(p->numel());
    slots_.push_back({p, offset, n});
    param_elements_ += n;
    offset += (n + kAlignElements - 1) / kAlignElements * kAlignElements;
  }
  total_ = offset;
}

std::vector<memory::ShardRange> FlatLayout::param_ranges() const {
  std::vector<memory::ShardRange> ranges;
  for (const ParamSlot& slot : slots_) {
    if (slot.numel > 0) ranges.push_back(slot.range());
  }
  return ranges;
}

std::vector<ParamGroup> group_by_expert_parallel_size(const std::vector<nn::Parameter*>& params) {
  std::vector<ParamGroup> groups(1);
  for (nn::Parameter* p : params) {
    const int e = p->expert_parallel_size();
    auto it = std::find_if(groups.begin(), groups.end(), [e](const ParamGroup& g) { return g.expert_parallel_size == e; });
    if (it == groups.end()) it = groups.insert(groups.end(), ParamGroup{e, {}});
    it->params.push_back(p);
  }
  std::sort(groups.begin() + 1, groups.end(),
            [](const ParamGroup& a, const ParamGroup& b) { return a.expert_parallel_size < b.expert_parallel_size; });
  return groups;
}

std::vector<BucketPlan> plan_buckets(const FlatLayout& layout, size_t bucket_elements) {
  ZS_ASSERT(bucket_elements > 0, "bucket size 0");
  auto slots = layout.slots();
  std::vector<BucketPlan> buckets;
  size_t end = slots.size();
  while (end > 0) {
    size_t first = end - 1;
    size_t elements = slots[first].numel;
    while (first > 0 && elements + slots[first - 1].numel <= bucket_elements) {
      --first;
      elements += slots[first].numel;
    }
    size_t lo = slots[first].offset;
    // A bucket owns the padding after its last slot, so buckets tile the whole buffer.
    size_t hi = end < slots.size() ? slots[end].offset : layout.total();
    buckets.push_back({first, end, {lo, hi - lo}});
    end = first;
  }
  return buckets;
}

}  // namespace zs::engine
