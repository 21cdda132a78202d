#include "engine/detail/grad_reducer.h"

#include <algorithm>
#include <cstring>

#include "comm/quantized_collectives.h"
#include "core/errors.h"

namespace zs::engine {

GradReducer::GradReducer(const Options& options, const FlatLayout& layout, const Partition& partition,
                         const comm::Group& group, memory::DeviceAllocator& device, memory::DType dtype, void* grads,
                         const std::vector<nn::Module*>& modules)
    : options_(options), layout_(layout), partition_(partition), group_(group), device_(device), dtype_(dtype),
      comm_dtype_(options.comm_dtype.value_or(dtype)), grads_(grads) {
  for (const auto& plan : plan_buckets(layout_, options_.bucket_elements)) buckets_.push_back({plan, 0, false, {}, {}, false, {}});
  auto slots = layout_.slots();
  bucket_of_slot_.resize(slots.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (size_t s = buckets_[b].plan.first_slot; s < buckets_[b].plan.end_slot; ++s) bucket_of_slot_[s] = b;
  }
  std::unordered_map<const nn::Parameter*, size_t> slot_of;
  for (size_t i = 0; i < slots.size(); ++i) slot_of[slots[i].param] = i;
  // Parameters of other layouts (dense vs expert ones) belong to another set's reducer.
  for (nn::Module* m : modules) {
    for (nn::Parameter* p : m->params()) {
      auto it = slot_of.find(p);
      if (it != slot_of.end()) slots_of_module_[m].push_back(it->second);
    }
  }
}

GradReducer::~GradReducer() {
  // Reductions may still write into buffers that are about to go; errors were reported to whoever
  // waited, and a destructor must not throw.
  for (auto& b : buckets_) {
    try {
      b.work.wait();
    } catch (...) {
    }
  }
}

memory::Tensor GradReducer::bucket_tensor(Bucket& b) const {
  if (partitioned()) return b.staging.tensor(dtype_, {static_cast<int64_t>(b.plan.range.size)});
  return memory::Tensor(grads_, dtype_, {static_cast<int64_t>(layout_.total())}).range(b.plan.range);
}

memory::Tensor GradReducer::shard_part(memory::ShardRange owned) const {
  auto* at = static_cast<char*>(grads_) + (owned.offset - partition_.mine.offset) * memory::dtype_size(dtype_);
  return memory::Tensor(at, dtype_, {static_cast<int64_t>(owned.size)});
}

// Note [reduce-scatter into the shard]
// Stage 2+ used to reduce-scatter each bucket in place in its staging buffer and then add this rank's
// part into the gradient shard (retire): a read of the part, a read and a write of the shard, on every
// micro-batch. On the accumulation window's first backward the shard holds zeros (the step, a failed
// window and a checkpoint load zero it, and nothing else writes it), so adding is copying: the
// reduce-scatter's output is then the shard itself and retire adds nothing. The same reduction (the
// transports sum in rank order whatever the output; Note [16-bit reductions]) and 0 + x = x, so the
// gradients and losses are the same bits. The staging buffer lives exactly as long as before (the
// collective still reads it), so device peaks, and `zeroshard estimate`, do not move. Not with a
// comm_dtype wire buffer (the part comes back through a conversion) nor with the shard on the host
// (offload_optimizer: that transfer is counted through the backend).
void GradReducer::begin_backward(bool boundary, bool reduce, bool shard_zero) {
  ZS_ASSERT(reduce || !partitioned(), "stage {} gradients are always reduced", options_.stage);
  reducing_ = boundary && reduce && group_.size() > 1;
  shard_zero_ = shard_zero;
  if (!active()) return;
  for (auto& b : buckets_) {
    b.pending = b.plan.end_slot - b.plan.first_slot;
    b.launched = false;
  }
}

void GradReducer::ensure_staging(Bucket& b) {
  if (!b.staging.empty()) return;
  const size_t bytes = b.plan.range.size * memory::dtype_size(dtype_);
  // Alive across several modules' backward: the transient pool's deepest hole (Note [Spanning blocks]).
  b.staging = device_.allocate(bytes, memory::Category::kGrads, memory::Lifetime::kSpanning);
  device_.backend().fill_zero(b.staging.data(), memory::Tier::kDevice, bytes);
  staging_bytes_ += bytes;
  staging_peak_bytes_ = std::max(staging_peak_bytes_, staging_bytes_);
}

void GradReducer::module_starting(nn::Module& m) {
  if (!partitioned()) return;
  auto it = slots_of_module_.find(&m);
  if (it == slots_of_module_.end()) return;
  auto slots = layout_.slots();
  for (size_t s : it->second) {
    Bucket& b = buckets_[bucket_of_slot_[s]];
    ZS_ASSERT(!b.launched, "gradient bucket of {} already reduced in this backward: module {} ran its backward twice?",
              slots[s].param->full_name(), m.display_name());
    ensure_staging(b);
    const size_t at = slots[s].offset - b.plan.range.offset;
    auto* base = static_cast<char*>(b.staging.data()) + at * memory::dtype_size(dtype_);
    slots[s].param->set_grad(memory::Tensor(base, dtype_, slots[s].param->shape()));
  }
}

void GradReducer::module_done(nn::Module& m) {
  if (!active()) return;
  auto it = slots_of_module_.find(&m);
  if (it != slots_of_module_.end()) {
    for (size_t s : it->second) {
      Bucket& b = buckets_[bucket_of_slot_[s]];
      ZS_ASSERT(b.pending > 0, "gradient of {} completed twice in one backward", layout_.slots()[s].param->full_name());
      // Stage 2+ launches a full bucket even without overlap_comm (then reduces it at once): its
      // staging buffer must go before more fill, or the whole gradient would be staged at once.
      if (--b.pending == 0 && (options_.overlap_comm || partitioned())) launch(b);
    }
  }
  if (partitioned()) retire_finished();
}

void GradReducer::launch(Bucket& b) {
  if (b.launched) return;
  b.launched = true;
  const memory::ShardRange owned = partition_.owned(b.plan.range);
  if (partitioned()) ensure_staging(b);
  if (quantized()) reduce_quantized(b);  // qgZ: on this thread, in place; b.work stays empty (done)
  memory::Tensor data = bucket_tensor(b);
  if (!quantized() && group_.size() > 1 && comm_dtype_ != dtype_) {
    const size_t n = b.plan.range.size;
    b.wire = device_.allocate(n * memory::dtype_size(comm_dtype_), memory::Category::kGrads, memory::Lifetime::kTransient);
    device_.backend().convert(b.wire.data(), memory::Tier::kDevice, comm_dtype_, data.raw(), memory::Tier::kDevice,
                              dtype_, n);
    data = b.wire.tensor(comm_dtype_, {static_cast<int64_t>(n)});
  }
  // Average, not sum: comm reduces bf16/fp16 in fp32 and rounds once, so results stay in the range of
  // one rank's gradients (a sum of N loss-scaled fp16 gradients overflows N times sooner).
  if (group_.size() > 1 && !quantized()) {
    if (options_.stage == 0 || !options_.reduce_scatter) {
      b.work = group_.allreduce_async(data, comm::ReduceOp::kAverage);
    } else {
      // In place: this rank's part of the result lands in its own block of the bucket; or, where the
      // shard is still zero, in the shard itself (Note [reduce-scatter into the shard]).
      b.into_shard = partitioned() && shard_zero_ && owned.size > 0 && b.wire.empty() &&
                     options_.grads_tier == memory::Tier::kDevice;
      memory::Tensor out = b.into_shard ? shard_part(owned) : data.range({owned.offset - b.plan.range.offset, owned.size});
      b.work = group_.reduce_scatter_async(data, out, partition_.counts(b.plan.range), comm::ReduceOp::kAverage);
    }
    bytes_sent_ += b.work.bytes_sent();
  }
  if (partitioned()) {
    in_flight_.push_back(static_cast<size_t>(&b - buckets_.data()));
    const size_t in_flight = options_.overlap_comm ? kMaxInFlight : 0;  // overlap off: synchronous
    while (in_flight_.size() > in_flight) retire(buckets_[in_flight_.front()]);
  }
}

void GradReducer::reduce_quantized(Bucket& b) {
  // In place, as the reduce-scatter above: this rank's part lands in its own block of the bucket.
  const memory::ShardRange owned = partition_.owned(b.plan.range);
  memory::Tensor data = bucket_tensor(b);
  memory::Tensor out = data.range({owned.offset - b.plan.range.offset, owned.size});
  const comm::QuantizedReduceScatter q(*options_.quantized_host, options_.quantized_across, partition_.counts(b.plan.range));
  memory::DeviceBlock scratch = device_.allocate(q.scratch_bytes(), memory::Category::kGrads, memory::Lifetime::kTransient);
  bytes_sent_ += q.run(data, out, comm::ReduceOp::kAverage, scratch.data(), options_.kernels);
}

void GradReducer::finish(Bucket& b) {
  b.work.wait();
  if (b.wire.empty()) return;
  // Stages 1+ keep only their part (reduce-scatter leaves nothing valid elsewhere); stage 0 all of it.
  const memory::ShardRange keep = options_.stage == 0 ? b.plan.range : partition_.owned(b.plan.range);
  const size_t at = keep.offset - b.plan.range.offset;
  if (keep.size > 0) {
    auto* dst = static_cast<char*>(bucket_tensor(b).raw()) + at * memory::dtype_size(dtype_);
    const auto* src = static_cast<const char*>(b.wire.data()) + at * memory::dtype_size(comm_dtype_);
    device_.backend().convert(dst, memory::Tier::kDevice, dtype_, src, memory::Tier::kDevice, comm_dtype_, keep.size);
  }
  b.wire.release();
}

void GradReducer::retire(Bucket& b) {
  finish(b);
  const memory::ShardRange owned = partition_.owned(b.plan.range);
  if (owned.size > 0 && !b.into_shard) {
    const size_t elem = memory::dtype_size(dtype_);
    auto* dst = static_cast<char*>(grads_) + (owned.offset - partition_.mine.offset) * elem;
    const auto* src = static_cast<const char*>(b.staging.data()) + (owned.offset - b.plan.range.offset) * elem;
    // Into the gradient shard, on the host when the optimizer is offloaded (a counted transfer).
    device_.backend().accumulate(dst, options_.grads_tier, src, memory::Tier::kDevice, dtype_, owned.size);
  }
  b.into_shard = false;
  auto slots = layout_.slots();
  for (size_t s = b.plan.first_slot; s < b.plan.end_slot; ++s) slots[s].param->set_grad(memory::Tensor());
  staging_bytes_ -= b.staging.size();
  b.staging.release();
  auto it = std::find(in_flight_.begin(), in_flight_.end(), static_cast<size_t>(&b - buckets_.data()));
  if (it != in_flight_.end()) in_flight_.erase(it);
}

void GradReducer::retire_finished() {
  while (!in_flight_.empty() && buckets_[in_flight_.front()].work.test()) retire(buckets_[in_flight_.front()]);
}

void GradReducer::end_backward() {
  if (!active()) return;
  for (auto& b : buckets_) launch(b);
  if (partitioned()) {
    while (!in_flight_.empty()) retire(buckets_[in_flight_.front()]);
  }
  reducing_ = false;
}

void GradReducer::wait_all() {
  for (auto& b : buckets_) finish(b);
}

void GradReducer::abort() {
  wait_all();
  auto slots = layout_.slots();
  for (auto& b : buckets_) {
    b.wire.release();
    b.into_shard = false;
    if (b.staging.empty()) continue;
    for (size_t s = b.plan.first_slot; s < b.plan.end_slot; ++s) slots[s].param->set_grad(memory::Tensor());
    staging_bytes_ -= b.staging.size();
    b.staging.release();
  }
  in_flight_.clear();
  reducing_ = false;
}

}  // namespace zs::engine
