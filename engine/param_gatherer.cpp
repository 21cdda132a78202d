#include "engine/detail/param_gatherer.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "core/errors.h"
#include "core/log.h"

namespace zs::engine {

ParamGatherer::ParamGatherer(const Options& options, const FlatLayout& layout, const Partition& partition,
                             const comm::Group& group, memory::DeviceAllocator& device, memory::DType dtype,
                             const void* param_shard, const std::vector<nn::Module*>& modules)
    : options_(options), layout_(layout), partition_(partition), group_(group), device_(device), dtype_(dtype), shard_(param_shard) {
  auto slots = layout_.slots();
  std::unordered_map<const nn::Parameter*, size_t> slot_of;
  for (size_t i = 0; i < slots.size(); ++i) slot_of[slots[i].param] = i;
  for (nn::Module* m : modules) {
    // Only the module's parameters of this layout (dense, or one expert_parallel_size's): a module's
    // own parameters are gathered as one range over one group, so they may not be of two layouts.
    std::vector<nn::Parameter*> params;
    for (nn::Parameter* p : m->params()) {
      if (slot_of.count(p)) params.push_back(p);
    }
    if (params.empty()) continue;
    if (params.size() != m->params().size()) {
      throw ModelError(fmt::format("module '{}' owns both expert parameters (expert_parallel_size > 1) and parameters of "
                                   "another expert_parallel_size: ZeRO-3 gathers a module's own parameters as one range "
                                   "over one group; declare the expert parameters in a child module of their own",
                                   m->display_name()));
    }
    Entry e;
    e.module = m;
    e.first_slot = slot_of.at(params.front());
    e.end_slot = slot_of.at(params.back()) + 1;
    ZS_ASSERT(e.end_slot - e.first_slot == params.size(), "own parameters of {} are not consecutive in the layout",
              m->display_name());
    const ParamSlot& last = slots[e.end_slot - 1];
    e.range = {slots[e.first_slot].offset, last.offset + last.numel - slots[e.first_slot].offset};
    e.persistent = e.range.size < options_.persistence_threshold;
    entry_of_[m] = entries_.size();
    entries_.push_back(std::move(e));
  }
  // The largest sum of own parameters along a chain of nested modules: what running modules hold.
  std::function<size_t(nn::Module*)> chain = [&](nn::Module* m) -> size_t {
    size_t own = 0;
    auto it = entry_of_.find(m);
    if (it != entry_of_.end() && !entries_[it->second].persistent) own = entries_[it->second].range.size;
    size_t below = 0;
    for (nn::Module* c : m->children()) below = std::max(below, chain(c));
    return own + below;
  };
  for (nn::Module* m : modules) max_chain_elements_ = std::max(max_chain_elements_, chain(m));
  // Note [persistent gathered parameters]: a persistent module's gathered copy lives for the whole
  // run (as DeepSpeed's persisted parameters, never partitioned), so its buffer is a persistent block
  // allocated once, here, beside the model states. Allocated at its first fetch as a transient block,
  // it was born in the forward and lived through the backward and across steps, inside the transient
  // pool whose other blocks live a layer or less, and pinned holes there (docs/memory.md,
  // "Fragmentation on real traces": on the ZeRO-3 recompute trace with cpu_checkpointing, reserved /
  // allocated 1.052 with them there, 1.042 with them here, before Note [Spanning blocks]).
  if (options_.zeropp.host != nullptr || options_.zeropp.quantized) {
    zeropp_.emplace(options_.zeropp, layout_.total(), group_, device_, dtype_, entries_.size());
  }
  // Note [one-sided parameter gathers]: the same conditions on every rank (config and group size), as
  // the constructor of SharedShards is collective; it finds host-memory shards (offload_param cpu) out
  // of the arena itself, alike on every rank (a rank's empty shard may be anywhere).
  if (!zeropp_ && options_.nvme == nullptr && group_.size() > 1) {
    shards_ = comm::SharedShards(group_, shard_, partition_.mine.size * memory::dtype_size(dtype_));
    if (shards_.active() && group_.rank() == 0) {
      ZS_LOG_INFO("ZeRO-3: parameter gathers over group '{}' read the peers' shards in place (one-sided, no meeting "
                  "of the ranks per module)", group_.name());
    }
  }
  for (Entry& e : entries_) {
    if (e.persistent) {
      e.buffer = device_.allocate(e.range.size * memory::dtype_size(dtype_), memory::Category::kParams,
                                  memory::Lifetime::kPersistent);
    }
  }
}

ParamGatherer::~ParamGatherer() {
  for (auto& e : entries_) {
    try {
      if (!e.staging.empty()) options_.nvme->wait(e.read);  // a read must not land in freed memory
    } catch (...) {
    }
  }
}

size_t ParamGatherer::persistent_bytes() const {
  size_t n = 0;
  for (const auto& e : entries_) n += e.persistent ? e.range.size : 0;
  return n * memory::dtype_size(dtype_);
}

size_t ParamGatherer::live_bound_bytes() const {
  return (max_chain_elements_ + options_.prefetch_elements) * memory::dtype_size(dtype_) + persistent_bytes();
}

void ParamGatherer::begin_pass(Pass pass) {
  pass_ = pass;
  position_ = 0;
  // A first pass cut short by an exception (say an out-of-memory the caller caught) left a partial
  // order: record it afresh.
  if (!recorded_[static_cast<int>(pass)]) trace_[static_cast<int>(pass)].clear();
}

void ParamGatherer::start_gather(Entry& e) {
  const size_t elem = memory::dtype_size(dtype_);
  if (e.buffer.empty()) e.buffer = device_.allocate(e.range.size * elem, memory::Category::kParams, memory::Lifetime::kTransient);
  ++gathers_;
  live_elements_ += e.range.size;
  live_peak_elements_ = std::max(live_peak_elements_, live_elements_);
  const memory::ShardRange owned = partition_.owned(e.range);
  e.state = State::kInFlight;
  e.from_secondary = false;
  if (zeropp_ && pass_ == Pass::kBackward && zeropp_->has_secondary(static_cast<size_t>(&e - entries_.data()))) {
    e.from_secondary = true;  // hpZ: over the host group, from copies in device memory (no NVMe read)
    zeropp_->gather_secondary(static_cast<size_t>(&e - entries_.data()), e.range,
                              e.buffer.tensor(dtype_, {static_cast<int64_t>(e.range.size)}));
    return;
  }
  if (pass_ == Pass::kBackward) ++backward_gathers_;
  if (options_.nvme != nullptr) {
    // The read is started now (prefetch); the collective waits for it in finish_gather.
    const offload::IoWindow w = offload::io_window((owned.offset - partition_.mine.offset) * elem, owned.size * elem);
    e.staging_skip = w.skip;
    if (owned.size > 0) {
      e.staging = offload::AlignedBuffer(w.bytes, options_.tracker);
      staging_bytes_ += w.bytes;
      staging_peak_bytes_ = std::max(staging_peak_bytes_, staging_bytes_);
      e.read = options_.nvme->read_async(options_.nvme_region, w.offset, e.staging.prefix(w.bytes));
      nvme_bytes_read_ += w.bytes;
    }
    return;
  }
  const auto* src = static_cast<const char*>(shard_) + (owned.offset - partition_.mine.offset) * elem;
  memory::Tensor out = e.buffer.tensor(dtype_, {static_cast<int64_t>(e.range.size)});
  if (group_.size() == 1) {
    device_.backend().copy(out.raw(), memory::Tier::kDevice, src, options_.shard_tier, e.range.size * elem);
  } else if (shards_.active()) {
    // Note [one-sided parameter gathers]: each rank's part of the range, from its shard.
    std::vector<size_t> offsets(partition_.shards.size());
    for (size_t p = 0; p < offsets.size(); ++p) {
      const memory::ShardRange part = partition_.shards[p].intersect(e.range);
      offsets[p] = part.size > 0 ? part.offset - partition_.shards[p].offset : 0;
    }
    shards_.allgatherv(offsets, out, partition_.counts(e.range));
  } else {
    // On the calling thread (Note [synchronous gathers] in the header).
    memory::Tensor in(const_cast<char*>(src), dtype_, {static_cast<int64_t>(owned.size)});
    gather_range(e, in, out);
  }
}

void ParamGatherer::gather_range(Entry& e, const memory::Tensor& in, const memory::Tensor& out) {
  if (zeropp_) {
    zeropp_->gather(static_cast<size_t>(&e - entries_.data()), e.range, partition_.counts(e.range), in, out, e.persistent);
  } else {
    group_.allgatherv(in, out, partition_.counts(e.range));
  }
}

void ParamGatherer::finish_gather(Entry& e) {
  const size_t elem = memory::dtype_size(dtype_);
  if (options_.nvme != nullptr && !e.from_secondary) {
    const memory::ShardRange owned = partition_.owned(e.range);
    char* src = e.staging.empty() ? nullptr : reinterpret_cast<char*>(e.staging.data()) + e.staging_skip;
    if (!e.staging.empty()) options_.nvme->wait(e.read);
    memory::Tensor out = e.buffer.tensor(dtype_, {static_cast<int64_t>(e.range.size)});
    if (group_.size() == 1) {
      device_.backend().copy(out.raw(), memory::Tier::kDevice, src, memory::Tier::kHost, e.range.size * elem);
    } else {
      memory::Tensor in(src, dtype_, {static_cast<int64_t>(owned.size)});
      gather_range(e, in, out);
    }
    staging_bytes_ -= e.staging.size();
    e.staging.reset();
    e.read = {};
  }
  e.from_secondary = false;
  e.state = State::kAvailable;
  auto slots = layout_.slots();
  for (size_t s = e.first_slot; s < e.end_slot; ++s) {
    auto* p = static_cast<char*>(e.buffer.data()) + (slots[s].offset - e.range.offset) * elem;
    slots[s].param->set_data(memory::Tensor(p, dtype_, slots[s].param->shape()));
  }
}

void ParamGatherer::drop(Entry& e) {
  if (!e.staging.empty()) {
    // A prefetch read still in flight (the step invalidated it): the buffer must outlive the read.
    options_.nvme->wait(e.read);
    staging_bytes_ -= e.staging.size();
    e.staging.reset();
    e.read = {};
  }
  auto slots = layout_.slots();
  for (size_t s = e.first_slot; s < e.end_slot; ++s) slots[s].param->set_data(memory::Tensor());
  if (e.state != State::kReleased) live_elements_ -= e.range.size;
  if (!e.persistent) e.buffer.release();  // a persistent module's buffer stays for its next gather
  e.state = State::kReleased;
}

void ParamGatherer::fetch(nn::Module& m) {
  auto it = entry_of_.find(&m);
  if (it == entry_of_.end()) return;
  const size_t index = it->second;
  Entry& e = entries_[index];
  auto& trace = trace_[static_cast<int>(pass_)];
  const char* pass_name = pass_ == Pass::kForward ? "forward" : "backward";
  if (!recorded_[static_cast<int>(pass_)]) {
    trace.push_back(index);
  } else if (position_ >= trace.size() || trace[position_] != index) {
    throw ModelError(fmt::format(
        "ZeRO-3 parameter fetch out of order in the {} pass: expected module '{}' at position {}, met '{}'. "
        "zeroshard records the module order of the first step and prefetches along it; the model must run its "
        "modules in the same order every step",
        pass_name, position_ < trace.size() ? entries_[trace[position_]].module->display_name() : "<end of pass>",
        position_, m.display_name()));
  }
  ++position_;
  if (e.state == State::kReleased) start_gather(e);
  if (e.state == State::kInFlight) finish_gather(e);
  if (e.prefetched) {
    prefetched_elements_ -= e.range.size;
    e.prefetched = false;
  }
  if (recorded_[static_cast<int>(pass_)]) prefetch_after(position_);
}

void ParamGatherer::prefetch_after(size_t position) {
  const auto& trace = trace_[static_cast<int>(pass_)];
  for (size_t i = position; i < trace.size(); ++i) {
    Entry& next = entries_[trace[i]];
    if (next.state != State::kReleased) continue;
    if (prefetched_elements_ + next.range.size > options_.prefetch_elements) break;
    if (live_elements_ + next.range.size > options_.max_live_elements) break;
    start_gather(next);
    next.prefetched = true;
    prefetched_elements_ += next.range.size;
  }
}

void ParamGatherer::release(nn::Module& m) {
  auto it = entry_of_.find(&m);
  if (it == entry_of_.end()) return;
  Entry& e = entries_[it->second];
  if (e.persistent) return;
  if (pass_ == Pass::kForward && keep_for_backward(it->second)) {
    // Note [reuse distance]: held as a prefetch of its backward fetch.
    e.prefetched = true;
    prefetched_elements_ += e.range.size;
    ++reuse_keeps_;
    return;
  }
  drop(e);
}

bool ParamGatherer::keep_for_backward(size_t index) const {
  if (backward_before_.empty() || options_.max_reuse_distance == 0) return false;
  const Entry& e = entries_[index];
  // Used again later in this forward (a shared module): the forward's own prefetch serves that use.
  if (last_forward_[index] == kNever || last_forward_[index] >= position_) return false;
  if (backward_before_[index] == kNever || position_ >= forward_after_.size()) return false;
  const size_t distance = forward_after_[position_] + backward_before_[index];
  return distance <= options_.max_reuse_distance && prefetched_elements_ + e.range.size <= options_.prefetch_elements;
}

void ParamGatherer::plan_reuse() {
  const auto& forward = trace_[static_cast<int>(Pass::kForward)];
  const auto& backward = trace_[static_cast<int>(Pass::kBackward)];
  auto gathered = [&](size_t index) { return entries_[index].persistent ? size_t{0} : entries_[index].range.size; };
  forward_after_.assign(forward.size() + 1, 0);
  last_forward_.assign(entries_.size(), kNever);
  for (size_t i = forward.size(); i-- > 0;) {
    forward_after_[i] = forward_after_[i + 1] + gathered(forward[i]);
    if (last_forward_[forward[i]] == kNever) last_forward_[forward[i]] = i;
  }
  backward_before_.assign(entries_.size(), kNever);
  size_t before = 0;
  for (size_t index : backward) {
    if (backward_before_[index] == kNever) backward_before_[index] = before;
    before += gathered(index);
  }
}

void ParamGatherer::end_pass() {
  auto& trace = trace_[static_cast<int>(pass_)];
  if (recorded_[static_cast<int>(pass_)] && position_ != trace.size()) {
    throw ModelError(fmt::format("ZeRO-3: the {} pass fetched {} modules' parameters, but the recorded order has {} (next "
                            "expected: '{}'); the model must run the same modules every step",
                            pass_ == Pass::kForward ? "forward" : "backward", position_, trace.size(),
                            entries_[trace[position_]].module->display_name()));
  }
  const bool first = !recorded_[static_cast<int>(pass_)];
  recorded_[static_cast<int>(pass_)] = true;
  if (first && recorded_[0] && recorded_[1]) plan_reuse();
}

void ParamGatherer::begin_shard_write() {
  if (shards_.active()) shards_.begin_write();
}

void ParamGatherer::shards_written() {
  invalidate();
  if (shards_.active()) shards_.end_write();
}

void ParamGatherer::invalidate() {
  if (zeropp_) zeropp_->invalidate();
  for (auto& e : entries_) {
    if (e.state != State::kReleased) drop(e);
    e.prefetched = false;
  }
  prefetched_elements_ = 0;
}

}  // namespace zs::engine
