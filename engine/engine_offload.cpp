// ZeRO-Offload / ZeRO-Infinity in the engine: model states on NVMe swap files, streamed through the
// optimizer sub-group by sub-group. Host (cpu) offload needs nothing here: its buffers are ordinary
// memory on the host tier (Engine::Impl::place), stepped in place.
#include <algorithm>
#include <cstring>

#include "core/errors.h"
#include "core/log.h"
#include "engine/detail/engine_impl.h"

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

void Engine::Impl::init_nvme(StateSet& s) {
  NvmeOffload& o = s.nvme.emplace();
  const memory::ShardRange stepped = s.step_range();
  const int rank = group_.rank();
  // Expert layouts get their own swap files beside the dense ones (Note [expert parameters]).
  const std::string suffix = s.expert() ? fmt::format("_ep{}", s.expert_parallel_size()) : "";
  // The plan's NVMe buffers (engine/placement.h): the master, then each state, then the parameters.
  std::vector<size_t> state_bytes;
  for (const PlannedBuffer& b : s.plan.buffers) {
    if (b.where == Where::kNvme && b.category == memory::Category::kOptimizer && b.name != "master") state_bytes.push_back(b.bytes);
  }
  const auto& oo = cfg_.zero.offload_optimizer;
  const auto& op = cfg_.zero.offload_param;
  const size_t buffers = static_cast<size_t>(optimizer_on_nvme() ? oo.buffer_count : op.buffer_count);
  o.sub_group = offload_sub_group_elements(stepped.size, static_cast<size_t>(cfg_.zero.sub_group_size), buffers);

  if (optimizer_on_nvme()) {
    std::vector<size_t> regions = {s.plan.find("master")->bytes};
    regions.insert(regions.end(), state_bytes.begin(), state_bytes.end());
    o.optimizer_swap = std::make_unique<offload::SwapSpace>(oo.nvme_path, rank, "optimizer" + suffix,
                                                            offload::SwapSpace::bytes_for(regions), cfg_.aio, &tracker_,
                                                            memory::Category::kOptimizer);
    o.master = o.optimizer_swap->allocate(regions[0]);
    for (size_t k = 0; k < state_bytes.size(); ++k) o.states.push_back(o.optimizer_swap->allocate(state_bytes[k]));
  }
  if (params_on_nvme()) {
    const size_t bytes = s.plan.find("params")->bytes;
    o.param_swap = std::make_unique<offload::SwapSpace>(op.nvme_path, rank, "params" + suffix, offload::SwapSpace::bytes_for({bytes}),
                                                        cfg_.aio, &tracker_, memory::Category::kParams);
    o.params = o.param_swap->allocate(bytes);
  }

  // The sub-groups: master and states read-write (write-only when initialising), parameters write-only.
  auto sub_groups = [&](bool init) {
    std::vector<std::vector<offload::SwapItem>> groups;
    const auto rw = init ? offload::SwapMode::kWriteOnly : offload::SwapMode::kReadWrite;
    for (size_t off = 0; off < stepped.size; off += o.sub_group) {
      const size_t n = std::min(o.sub_group, stepped.size - off);
      std::vector<offload::SwapItem> items;
      if (optimizer_on_nvme()) {
        items.push_back({o.master, off * sizeof(float), n * sizeof(float), rw});
        auto specs = optimizer_->state_specs();
        for (size_t k = 0; k < specs.size(); ++k) {
          items.push_back({o.states[k], off / specs[k].elements_per_value * specs[k].value_bytes, specs[k].bytes_for(n), rw});
        }
      }
      if (params_on_nvme()) items.push_back({o.params, off * elem_, n * elem_, offload::SwapMode::kWriteOnly});
      groups.push_back(std::move(items));
    }
    return groups;
  };
  const offload::SwapperOptions so{.buffer_count = buffers,
                                   .pin_memory = optimizer_on_nvme() ? oo.pin_memory : op.pin_memory,
                                   .tracker = &tracker_};
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
  memory::run_kernel(*backend_, [&] { initialise(s); });
  {
    offload::PipelinedSwapper init(sub_groups(true), so);
    init.run([&](size_t g, std::span<std::span<std::byte>> bufs) {
      const memory::ShardRange range{stepped.offset + g * o.sub_group, std::min(o.sub_group, stepped.size - g * o.sub_group)};
      size_t item = 0;
      float* master = nullptr;
      if (optimizer_on_nvme()) {
        master = reinterpret_cast<float*>(bufs[item++].data());
        init_f32(s, master, range);
        for (const auto& spec : optimizer_->state_specs()) {
          std::span<std::byte> b = bufs[item++];
          if (spec.value_bytes == sizeof(float) && spec.elements_per_value == 1) {
            std::fill_n(reinterpret_cast<float*>(b.data()), range.size, spec.initial_value);
          } else {
            std::memset(b.data(), 0, spec.bytes_for(range.size));
          }
        }
      }
      if (params_on_nvme()) {
        char* p = reinterpret_cast<char*>(bufs[item++].data());
        for (size_t off = 0; off < range.size; off += kChunkElements) {
          const memory::ShardRange chunk{range.offset + off, std::min(kChunkElements, range.size - off)};
          const float* values = master != nullptr ? master + off : nullptr;
          if (values == nullptr) {
            init_f32(s, scratch_.data(), chunk);
            values = scratch_.data();
          }
          memory::convert(values, memory::DType::kF32, p + off * elem_, dtype_, chunk.size);
        }
      }
    });
  }
  o.swapper = std::make_unique<offload::PipelinedSwapper>(std::move(groups), so);
}

void Engine::Impl::step_offloaded(StateSet& s, const optim::StepContext& ctx) {
  NvmeOffload& o = *s.nvme;
  const memory::ShardRange stepped = s.step_range();
  auto specs = optimizer_->state_specs();
  // The step runs on the host; it reads a device-resident master (parameters alone on NVMe) in place.
  memory::DeviceAccess access(*backend_);
  o.swapper->run([&](size_t g, std::span<std::span<std::byte>> bufs) {
    const memory::ShardRange range{stepped.offset + g * o.sub_group, std::min(o.sub_group, stepped.size - g * o.sub_group)};
    size_t item = 0;
    std::byte* master_buf = optimizer_on_nvme() ? bufs[item++].data() : nullptr;
    std::vector<std::byte*> state_bufs;
    if (optimizer_on_nvme()) {
      for (size_t k = 0; k < specs.size(); ++k) state_bufs.push_back(bufs[item++].data());
    }
    std::byte* param_buf = params_on_nvme() ? bufs[item++].data() : nullptr;
    // Padding between parameters is never stepped: keep it zero in the file.
    if (param_buf != nullptr) std::memset(param_buf, 0, range.size * elem_);
    for_each_piece(s, range, [&](size_t at, size_t n, bool decay, int t) {
      const size_t rel = at - range.offset;
      float* master = master_buf != nullptr ? reinterpret_cast<float*>(master_buf) + rel : master_at(s, at);
      void* states[kMaxStates];
      for (size_t k = 0; k < specs.size(); ++k) {
        states[k] = !state_bufs.empty() ? static_cast<void*>(state_bufs[k] + rel / specs[k].elements_per_value * specs[k].value_bytes)
                                        : state_at(s, k, at);
      }
      if (param_buf != nullptr) {
        step_piece(s, ctx, at, n, decay, t, master, {states, specs.size()}, param_buf + rel * elem_);
        return;
      }
      // Parameters in memory: written beside the host step, then copied through the backend.
      void* low = low_scratch_[static_cast<size_t>(t)].data();
      step_piece(s, ctx, at, n, decay, t, master, {states, specs.size()}, low);
      backend_->copy(param_at(s, at), s.params.tier(), low, memory::Tier::kHost, n * elem_);
    });
  });
}

void Engine::Impl::read_nvme_master(const StateSet& s, memory::ShardRange range, float* dst) {
  const offload::IoWindow w = offload::io_window((range.offset - s.step_range().offset) * sizeof(float), range.size * sizeof(float));
  offload::AlignedBuffer buf(w.bytes, &tracker_);
  s.nvme->optimizer_swap->read(s.nvme->master, w.offset, buf.prefix(w.bytes));
  std::memcpy(dst, buf.data() + w.skip, range.size * sizeof(float));
}

uint64_t Engine::Impl::nvme_bytes() const {
  uint64_t n = 0;
  for (const auto& s : sets_) {
    if (!s->nvme) continue;
    n += (s->nvme->optimizer_swap ? s->nvme->optimizer_swap->capacity() : 0) +
         (s->nvme->param_swap ? s->nvme->param_swap->capacity() : 0);
  }
  return n;
}

}  // namespace zs::engine
