// Engine's memory and offload reports (engine/engine.h): each state set's owner adds its buffers
// (Note [State owner] in engine/detail/model_states.h), the engine its compressed optimizer state and
// the arena's figures; and the count of collectives before step 1 in the log.
#include <fmt/ranges.h>

#include "core/log.h"
#include "engine/detail/engine_impl.h"

namespace zs::engine {

void Engine::Impl::log_startup_collectives() {
  startup_logged_ = true;
  uint64_t total = 0;  // the rest of the run is in the monitor's comms table
  std::vector<std::string> kinds;
  for (const comm::OpStats& op : group_.op_stats()) {
    total += op.count;
    kinds.push_back(fmt::format("{} {}", op.name, op.count));
  }
  ZS_LOG_INFO("comm: {} collectives before step 1 ({})", total, fmt::join(kinds, ", "));
}

ModelStateBytes Engine::model_state_bytes() const {
  const Impl& s = *impl_;
  ModelStateBytes b;
  b.optimizer = s.compressed_state_bytes();
  for (const auto& set : s.sets_) set->add_state_bytes(b);
  return b;
}

Engine::OffloadReport Engine::offload_report() const {
  OffloadReport r;
  // Summed over the partition groups' swappers (one per set with NVMe offload).
  for (const auto& set : impl_->sets_) set->add_offload(r);
  return r;
}

double Engine::optimizer_state_bytes_per_param() const {
  const Impl& s = *impl_;
  uint64_t bytes = s.compressed_state_bytes();
  size_t stepped = 0;
  for (const auto& set : s.sets_) {
    bytes += set->optimizer_state_bytes();
    stepped += set->step_range().size;
  }
  return stepped ? static_cast<double>(bytes) / static_cast<double>(stepped) : 0.0;
}

Engine::MemoryReport Engine::memory_report() const {
  MemoryReport r;
  r.model_states = model_state_bytes();
  const Impl& s = *impl_;
  r.device_states.optimizer += s.compressed_state_bytes();
  for (const auto& set : s.sets_) set->add_tier_bytes(r);
  memory::ArenaStats st = impl_->device_->stats();
  r.device_peak_bytes = st.peak_allocated_bytes;
  r.device_reserved_peak_bytes = st.peak_reserved_bytes;
  for (memory::Category c : memory::kAllCategories) {
    r.device_peak_by_category[static_cast<size_t>(c)] = impl_->tracker_.at_tier_peak(c, memory::Tier::kDevice);
  }
  r.device_capacity_bytes = st.capacity_bytes;
  r.activation_peak_bytes = impl_->tracker_.peak(memory::Category::kActivations, memory::Tier::kDevice);
  r.host_peak_bytes = impl_->tracker_.tier_peak(memory::Tier::kHost);
  r.nvme_bytes = impl_->tracker_.tier_current(memory::Tier::kNvme);
  // Per set, added: the sets' transient buffers may be alive at the same time.
  for (const auto& set : s.sets_) {
    r.grad_staging_peak_bytes += set->reducer->staging_peak_bytes();
    if (set->gatherer) {
      r.gathered_param_peak_bytes += set->gatherer->live_peak_bytes();
      r.gathered_param_bound_bytes += set->gatherer->live_bound_bytes();
    }
  }
  return r;
}

}  // namespace zs::engine
