// ZeRO-Offload / ZeRO-Infinity in the state owner: model states on NVMe swap files, streamed through
// the optimizer sub-group by sub-group. Host (cpu) offload needs nothing here: its buffers are
// ordinary memory on the host tier (ModelStates::allocate), stepped in place.
#include <algorithm>
#include <cstring>

#include "core/errors.h"
#include "core/log.h"
#include "engine/detail/model_states.h"

namespace zs::engine {

// Note [offload]
// Placement (engine/placement.h): offload_optimizer moves the stepped range's fp32 master and optimizer
// states to the host (cpu) or to one swap file per rank under nvme_path (nvme), and the gradient
// shard of stages 2-3 to the host (stage 1 reduce-scatters in place in the whole gradient buffer,
// which stays on the device). offload_param (stage 3) moves the parameter shard likewise; gathers
// read the owned part of a module from the file into a staging buffer first (param_gatherer.cpp).
// The step streams sub-groups of sub_group_size elements (rounded to kSubGroupAlign) through a
// PipelinedSwapper: while sub-group i is stepped, i+1 is read and i-1 written back, so the disk stays
// busy while the CPU computes. The updated bf16 parameters go to the device buffer, or with NVMe
// parameters into a write-only item of the same sub-group. The arithmetic is the in-memory step's,
// element by element, so offload none, cpu and nvme give the same bits.
// Host memory: the swapper holds buffer_count sub-groups. So that NVMe offload never needs more host
// memory than CPU offload of the same model (a complaint about DeepSpeed), a sub-group is capped at
// stepped / buffer_count elements (rounded up to kSubGroupAlign); the budget is logged before
// anything is allocated and shows in the summary (host_peak_bytes).

void ModelStates::init_nvme() {
  NvmeOffload& o = nvme_.emplace();
  const memory::ShardRange stepped = step_range();
  const int rank = env_->rank;  // the swap files are named by the data-parallel rank
  const EngineConfig& cfg = this->cfg();
  const size_t elem = env_->elem;
  // Expert layouts get their own swap files beside the dense ones (Note [expert parameters]).
  const std::string suffix = expert() ? fmt::format("_ep{}", expert_parallel_size()) : "";
  const auto& oo = cfg.zero.offload_optimizer;
  const auto& op = cfg.zero.offload_param;
  const size_t buffers = static_cast<size_t>(optimizer_on_nvme() ? oo.buffer_count : op.buffer_count);
  o.sub_group = offload_sub_group_elements(stepped.size, static_cast<size_t>(cfg.zero.sub_group_size), buffers);
  o.items.optimizer = optimizer_on_nvme();
  if (o.items.optimizer) o.items.states.assign(env_->specs.begin(), env_->specs.end());
  o.items.param_bytes = params_on_nvme() ? elem : 0;

  // The plan's NVMe buffers (engine/placement.h): the master, then each state, then the parameters.
  if (optimizer_on_nvme()) {
    std::vector<size_t> regions = {plan.find(BufferRole::kMaster)->bytes};
    for (const PlannedBuffer& b : plan.buffers) {
      if (b.where == Where::kNvme && b.role == BufferRole::kOptimizerState) regions.push_back(b.bytes);
    }
    o.optimizer_swap = std::make_unique<offload::SwapSpace>(oo.nvme_path, rank, "optimizer" + suffix,
                                                            offload::SwapSpace::bytes_for(regions), cfg.aio, &env_->tracker,
                                                            memory::Category::kOptimizer);
    o.master = o.optimizer_swap->allocate(regions[0]);
    for (size_t k = 1; k < regions.size(); ++k) o.states.push_back(o.optimizer_swap->allocate(regions[k]));
  }
  if (params_on_nvme()) {
    const size_t bytes = plan.find(BufferRole::kParams)->bytes;
    o.param_swap = std::make_unique<offload::SwapSpace>(op.nvme_path, rank, "params" + suffix, offload::SwapSpace::bytes_for({bytes}),
                                                        cfg.aio, &env_->tracker, memory::Category::kParams);
    o.params = o.param_swap->allocate(bytes);
  }

  // The sub-groups (Note [NVMe sub-group items] in engine/offload_rules.h): master and states
  // read-write (write-only when initialising), parameters write-only.
  auto sub_groups = [&](bool init) {
    std::vector<std::vector<offload::SwapItem>> groups;
    const auto rw = init ? offload::SwapMode::kWriteOnly : offload::SwapMode::kReadWrite;
    for (size_t off = 0; off < stepped.size; off += o.sub_group) {
      const size_t n = std::min(o.sub_group, stepped.size - off);
      std::vector<offload::SwapItem> items;
      for (const NvmeSubGroupItems::Item& it : o.items.items(off, n)) {
        switch (it.kind) {
          case NvmeSubGroupItems::Kind::kMaster: items.push_back({o.master, it.offset, it.bytes, rw}); break;
          case NvmeSubGroupItems::Kind::kState: items.push_back({o.states[it.state], it.offset, it.bytes, rw}); break;
          case NvmeSubGroupItems::Kind::kParams:
            items.push_back({o.params, it.offset, it.bytes, offload::SwapMode::kWriteOnly});
            break;
        }
      }
      groups.push_back(std::move(items));
    }
    return groups;
  };
  const offload::SwapperOptions so{.buffer_count = buffers,
                                   .pin_memory = optimizer_on_nvme() ? oo.pin_memory : op.pin_memory,
                                   .tracker = &env_->tracker};
  auto groups = sub_groups(false);
  size_t largest = 0;
  for (const auto& g : groups) largest = std::max(largest, offload::PipelinedSwapper::sub_group_buffer_bytes(g));
  o.host_budget_bytes = offload::PipelinedSwapper::host_budget_bytes(largest, buffers);
  ZS_LOG_INFO("offload: {} sub-group(s) of {} elements, {} host buffers = {:.1f} MiB of host memory for NVMe transfers; "
              "swap files: {}{}{}",
              groups.size(), o.sub_group, buffers, static_cast<double>(o.host_budget_bytes) / (1 << 20),
              o.optimizer_swap ? o.optimizer_swap->path() : "", o.optimizer_swap && o.param_swap ? ", " : "",
              o.param_swap ? o.param_swap->path() : "");

  // Initialise: what lives in memory first, then one write-only pass over the files (one swapper at a
  // time, so the host budget above is the peak).
  memory::run_kernel(backend(), [&] { initialise(); });
  {
    offload::PipelinedSwapper init(sub_groups(true), so);
    std::vector<float>& scratch = env_->scratch;
    init.run([&](size_t g, std::span<std::span<std::byte>> bufs) {
      const memory::ShardRange range{stepped.offset + g * o.sub_group, std::min(o.sub_group, stepped.size - g * o.sub_group)};
      const NvmeSubGroupItems::Buffers b = o.items.buffers(bufs);
      if (b.master != nullptr) {
        init_f32(b.master, range);
        for (size_t k = 0; k < b.states.size(); ++k) {
          const optim::StateSpec& spec = o.items.states[k];
          if (spec.value_bytes == sizeof(float) && spec.elements_per_value == 1) {
            std::fill_n(reinterpret_cast<float*>(b.states[k]), range.size, spec.initial_value);
          } else {
            std::memset(b.states[k], 0, spec.bytes_for(range.size));
          }
        }
      }
      if (b.params != nullptr) {
        char* p = reinterpret_cast<char*>(b.params);
        for (size_t off = 0; off < range.size; off += kChunkElements) {
          const memory::ShardRange chunk{range.offset + off, std::min(kChunkElements, range.size - off)};
          const float* values = b.master != nullptr ? b.master + off : nullptr;
          if (values == nullptr) {
            init_f32(scratch.data(), chunk);
            values = scratch.data();
          }
          memory::convert(values, memory::DType::kF32, p + off * elem, env_->dtype, chunk.size);
        }
      }
    });
  }
  o.swapper = std::make_unique<offload::PipelinedSwapper>(std::move(groups), so);
}

void ModelStates::step_streamed(optim::Optimizer& optimizer, const optim::StepContext& ctx) {
  NvmeOffload& o = *nvme_;
  const memory::ShardRange stepped = step_range();
  const std::span<const optim::StateSpec> specs = env_->specs;
  const size_t elem = env_->elem;
  // The step runs on the host; it reads a device-resident master (parameters alone on NVMe) in place.
  memory::DeviceAccess access(backend());
  o.swapper->run([&](size_t g, std::span<std::span<std::byte>> bufs) {
    const memory::ShardRange range{stepped.offset + g * o.sub_group, std::min(o.sub_group, stepped.size - g * o.sub_group)};
    const NvmeSubGroupItems::Buffers b = o.items.buffers(bufs);
    // Padding between parameters is never stepped: keep it zero in the file.
    if (b.params != nullptr) std::memset(b.params, 0, range.size * elem);
    for_each_piece(range, [&](size_t at, size_t n, bool decay, int t) {
      const size_t rel = at - range.offset;
      float* master = b.master != nullptr ? b.master + rel : master_at(at);
      void* states[kMaxStates];
      for (size_t k = 0; k < specs.size(); ++k) {
        states[k] = !b.states.empty() ? static_cast<void*>(b.states[k] + rel / specs[k].elements_per_value * specs[k].value_bytes)
                                      : state_at(k, at);
      }
      if (b.params != nullptr) {
        step_piece(optimizer, ctx, at, n, decay, t, master, {states, specs.size()}, b.params + rel * elem);
        return;
      }
      // Parameters in memory: written beside the host step, then copied through the backend.
      void* low = env_->low_scratch[static_cast<size_t>(t)].data();
      step_piece(optimizer, ctx, at, n, decay, t, master, {states, specs.size()}, low);
      backend().copy(param_at(at), params_.tier(), low, memory::Tier::kHost, n * elem);
    });
  });
}

void ModelStates::prefetch_states() {
  if (nvme_ && optimizer_on_nvme()) nvme_->swapper->prefetch();
}

void ModelStates::nvme_io(offload::SwapSpace& swap, const offload::SwapRegion& region, uint64_t offset, void* host,
                          size_t bytes, bool write) const {
  // Swap-file transfers are 4096-aligned: a window around the range, read first (and written back
  // with the range replaced).
  const offload::IoWindow w = offload::io_window(offset, bytes);
  offload::AlignedBuffer buf(w.bytes, &env_->tracker);
  swap.read(region, w.offset, buf.prefix(w.bytes));
  if (!write) {
    std::memcpy(host, buf.data() + w.skip, bytes);
    return;
  }
  std::memcpy(buf.data() + w.skip, host, bytes);
  swap.write(region, w.offset, buf.prefix(w.bytes));
}

uint64_t ModelStates::nvme_bytes() const {
  if (!nvme_) return 0;
  return (nvme_->optimizer_swap ? nvme_->optimizer_swap->capacity() : 0) +
         (nvme_->param_swap ? nvme_->param_swap->capacity() : 0);
}

void ModelStates::add_offload(Engine::OffloadReport& r) const {
  if (!nvme_) return;
  const offload::SwapperStats& st = nvme_->swapper->stats();
  r.host_budget_bytes += nvme_->host_budget_bytes;
  r.bytes_read += st.bytes_read + (gatherer ? gatherer->nvme_bytes_read() : 0);
  r.bytes_written += st.bytes_written;
  r.compute_s += st.compute_seconds;
  r.io_wait_s += st.io_wait_seconds;
}

}  // namespace zs::engine
