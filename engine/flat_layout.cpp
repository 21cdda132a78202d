#include "engine/flat_layout.h"

#include "core/errors.h"

namespace zs::engine {

FlatLayout::FlatLayout(std::vector<nn::Parameter*> params) {
  slots_.reserve(params.size());
  size_t offset = 0;
  for (nn::Parameter* p : params) {
    if (p->expert_parallel_size() != 1) {
      // Until the engine plans expert states over their own group, training them as dense would be
      // silently wrong (each rank would average a different expert's gradients).
      throw ModelError(fmt::format("parameter '{}' has expert_parallel_size {}: expert parallelism is not supported by "
                                   "zeroshard's engine yet; use expert_parallel_size 1",
                                   p->full_name(), p->expert_parallel_size()));
    }
    size_t n = static_cast<size_t>(p->numel());
    slots_.push_back({p, offset, n});
    param_elements_ += n;
    offset += (n + kAlignElements - 1) / kAlignElements * kAlignElements;
  }
  total_ = offset;
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
