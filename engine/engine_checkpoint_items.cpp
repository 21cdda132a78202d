// What each rank saves or loads, and the data movement of each piece (Engine::save_checkpoint /
// load_checkpoint; the save and load themselves are in engine_checkpoint.cpp).
#include <cstring>

#include "core/errors.h"
#include "core/log.h"
#include "engine/detail/engine_checkpoint.h"

namespace zs::engine {

namespace fs = std::filesystem;
using memory::DType;
using memory::ShardRange;
using memory::Tier;

// Note [checkpoint buffers]
// What a save writes (each a buffer of the storage layout, every value under its parameter's full
// name, so a load re-slices it for any world size, ZeRO stage, offload target or ep_size):
//   - "fp32": the fp32 master weights (in fp32 training the parameters themselves);
//   - "params": the parameters in the training dtype (bf16/fp16 only; in fp32 they are "fp32");
//   - each optimizer state under its own name (Adam, Lamb: exp_avg, exp_avg_sq; Lion: exp_avg). A
//     state of one fp32 value per element is stored like the parameter; any other (CAdam's int8
//     exp_avg_q, its per-block exp_avg_scale) is a tensor of its own, "<param>.<state>", of the
//     packed bytes as 32-bit words (fp32 when its values are fp32): blocks never straddle a
//     parameter (parameters start on multiples of FlatLayout::kAlignElements) nor a shard boundary;
//   - one-bit Adam / 0/1 Adam: exp_avg and exp_avg_sq as Adam's (so such a checkpoint loads into
//     Adam), and their rank-local states, which only a load at the same world size can use: the
//     error-feedback buffers ("error_feedback" buffer, tensors "error_feedback.worker.rank<R>" and
//     "error_feedback.server.rank<R>") and, for 0/1 Adam at stage 0 whose ranks step their own copies
//     between synchronisations, each rank's master, momentum and accumulator ("rank_local" buffer).
// Each element is written once: by its owner at stages 1-3 (the rank's shard of its group), by the
// group's rank 0 at stage 0. Expert parameters carry their global expert index in their names, so
// the ranks of one expert-parallel group write different tensors.
// Scalars: step counters, loss scaler, scheduler position, the MoE layers' pass counters (the keys of
// their random draws), the optimizer schedule, the config (Engine::save_checkpoint in engine.h).
void EngineCheckpoint::nvme_io(offload::SwapSpace& swap, const offload::SwapRegion& region, uint64_t offset, void* host,
                               size_t bytes, bool write) const {
  // Swap-file transfers are 4096-aligned: a window around the range, read first (and written back
  // with the range replaced). Bounded by kCheckpointPieceElements per call.
  const offload::IoWindow w = offload::io_window(offset, bytes);
  offload::AlignedBuffer buf(w.bytes, &s_.tracker_);
  swap.read(region, w.offset, buf.prefix(w.bytes));
  if (!write) {
    std::memcpy(host, buf.data() + w.skip, bytes);
    return;
  }
  std::memcpy(buf.data() + w.skip, host, bytes);
  swap.write(region, w.offset, buf.prefix(w.bytes));
}

void EngineCheckpoint::write_master(StateSet& set, ShardRange range, const float* src) {
  Impl& s = s_;
  const ShardRange stepped = set.step_range();
  const size_t elem = s.elem_;
  if (s.optimizer_on_nvme()) {
    nvme_io(*set.nvme->optimizer_swap, set.nvme->master, (range.offset - stepped.offset) * sizeof(float),
            const_cast<float*>(src), range.size * sizeof(float), true);
  } else if (s.reuse_) {
    // The master is the bf16 parameter (its upper half, rounded) plus a 16-bit residual.
    std::vector<uint16_t> hi(range.size), lo(range.size);
    encode_master(src, hi.data(), lo.data(), range.size);
    copy_in(set.params, s.param_at(set, range.offset), hi.data(), range.size * sizeof(uint16_t));
    copy_in(set.residual, static_cast<uint16_t*>(set.residual.data()) + (range.offset - stepped.offset), lo.data(),
            range.size * sizeof(uint16_t));
    return;
  } else {
    const StateBuffer& b = s.separate_master_ ? set.master : set.params;
    copy_in(b, s.master_at(set, range.offset), src, range.size * sizeof(float));
    if (!s.separate_master_) return;  // fp32 in memory: the master is the parameters
  }
  // The parameters in the training dtype: the master rounded, as every step writes them.
  std::vector<std::byte> low(range.size * elem);
  memory::convert(src, DType::kF32, low.data(), s.dtype_, range.size);
  if (s.params_on_nvme()) {
    nvme_io(*set.nvme->param_swap, set.nvme->params, (range.offset - stepped.offset) * elem, low.data(), low.size(), true);
  } else {
    copy_in(set.params, s.param_at(set, range.offset), low.data(), low.size());
  }
}

void EngineCheckpoint::add_param_items(std::vector<Item>& out, StateSet& set, Purpose p) {
  Impl& s = s_;
  const ShardRange range = range_for(set, p, false);
  for_slots(set, range, [&](const ParamSlot& slot, ShardRange part) {
    const std::string name = slot.param->full_name();
    Item master{.buffer = "fp32",
                .buffer_dtype = DType::kF32,
                .tensor = name,
                .shape = shape_of(slot.param->shape()),
                .tensor_dtype = s.dtype_,
                .begin = part.offset - slot.offset,
                .count = part.size};
    StateSet* sp = &set;
    master.io = [this, sp, base = part.offset, p](uint64_t at, uint64_t n, void* host) {
      if (p == Purpose::kSave) s_.read_master(*sp, {base + at, n}, static_cast<float*>(host));
      else write_master(*sp, {base + at, n}, static_cast<const float*>(host));
    };
    out.push_back(master);
    // The training-dtype parameters: written for consolidation and 16-bit tools; a load derives them
    // from the master (bit-identical: each step writes the master rounded).
    if (p == Purpose::kSave && s.mixed()) {
      Item low = master;
      low.buffer = "params";
      low.buffer_dtype = s.dtype_;
      low.io = [this, sp, base = part.offset](uint64_t at, uint64_t n, void* host) {
        if (s_.params_on_nvme()) {
          nvme_io(*sp->nvme->param_swap, sp->nvme->params, (base + at - sp->step_range().offset) * s_.elem_, host,
                  n * s_.elem_, false);
        } else {
          copy_out(host, sp->params, s_.param_at(*sp, base + at), n * s_.elem_);
        }
      };
      out.push_back(low);
    }
  });
}

void EngineCheckpoint::add_state_items(std::vector<Item>& out, StateSet& set, Purpose p) {
  Impl& s = s_;
  const auto specs = s.optimizer_->state_specs();
  const ShardRange range = range_for(set, p, false);
  const ShardRange stepped = set.step_range();
  StateSet* sp = &set;
  for (size_t k = 0; k < specs.size(); ++k) {
    const optim::StateSpec spec = specs[k];
    const bool elementwise = spec.value_bytes == sizeof(float) && spec.elements_per_value == 1;
    for_slots(set, range, [&](const ParamSlot& slot, ShardRange part) {
      // Byte range of the state for `part`, from the state buffer's start (the stepped range's).
      const size_t first_byte = (part.offset - stepped.offset) / spec.elements_per_value * spec.value_bytes;
      Item it{.buffer = std::string(spec.name), .buffer_dtype = DType::kF32};
      if (elementwise) {
        it.tensor = slot.param->full_name();
        it.shape = shape_of(slot.param->shape());
        it.tensor_dtype = s.dtype_;
        it.begin = part.offset - slot.offset;
        it.count = part.size;
      } else {
        // Packed: the bytes of the slot's values as 32-bit words (whole blocks: slots and shards start
        // on multiples of the block).
        const uint64_t slot_bytes = spec.bytes_for(slot.numel);
        const uint64_t rel = part.offset - slot.offset;
        const uint64_t lo = rel / spec.elements_per_value * spec.value_bytes;
        const uint64_t hi = part.offset + part.size == slot.offset + slot.numel
                                ? slot_bytes
                                : (rel + part.size) / spec.elements_per_value * spec.value_bytes;
        ZS_ASSERT(lo % 4 == 0 && rel % spec.elements_per_value == 0, "state '{}' of '{}' split inside a word", spec.name,
                  slot.param->full_name());
        it.tensor = fmt::format("{}.{}", slot.param->full_name(), spec.name);
        it.shape = {(slot_bytes + 3) / 4};
        it.buffer_dtype = it.tensor_dtype = spec.value_bytes == sizeof(float) ? DType::kF32 : DType::kI32;
        it.begin = lo / 4;
        it.count = (hi + 3) / 4 - lo / 4;
      }
      it.io = [this, sp, k, first_byte, p](uint64_t at, uint64_t n, void* host) {
        const size_t offset = first_byte + at * 4, bytes = n * 4;
        if (sp->nvme && s_.optimizer_on_nvme()) {
          nvme_io(*sp->nvme->optimizer_swap, sp->nvme->states[k], offset, host, bytes, p == Purpose::kLoad);
          return;
        }
        char* at_ptr = static_cast<char*>(sp->states[k].data()) + offset;
        if (p == Purpose::kSave) copy_out(host, sp->states[k], at_ptr, bytes);
        else copy_in(sp->states[k], at_ptr, host, bytes);
      };
      out.push_back(std::move(it));
    });
  }
}

void EngineCheckpoint::add_compressed_items(std::vector<Item>& out, Purpose p, bool rank_local) {
  Impl& s = s_;
  CompressedState& c = *s.compressed_;
  StateSet& set = s.dense();
  const ShardRange stepped = set.step_range();
  auto f32_item = [&](std::string buffer, const ParamSlot& slot, ShardRange part, StateBuffer& b, size_t base_elem) {
    Item it{.buffer = std::move(buffer),
            .buffer_dtype = DType::kF32,
            .tensor = slot.param->full_name(),
            .shape = shape_of(slot.param->shape()),
            .tensor_dtype = s.dtype_,
            .begin = part.offset - slot.offset,
            .count = part.size};
    StateBuffer* bp = &b;
    const size_t first = part.offset - base_elem;
    it.io = [this, bp, first, p](uint64_t at, uint64_t n, void* host) {
      float* ptr = static_cast<float*>(bp->data()) + first + at;
      if (p == Purpose::kSave) copy_out(host, *bp, ptr, n * sizeof(float));
      else copy_in(*bp, ptr, host, n * sizeof(float));
    };
    out.push_back(std::move(it));
  };
  // The momentum is whole on every rank: its owner's part on save; on load every rank reads it all
  // (the checkpoint's owners tile it).
  for_slots(set, range_for(set, p, true), [&](const ParamSlot& slot, ShardRange part) {
    f32_item("exp_avg", slot, part, c.exp_avg, 0);
  });
  for_slots(set, range_for(set, p, false), [&](const ParamSlot& slot, ShardRange part) {
    f32_item("exp_avg_sq", slot, part, c.exp_avg_sq, stepped.offset);
  });
  if (!rank_local) return;
  // Rank-local states: this rank's own, whole (Note [checkpoint buffers]).
  const int rank = s.group_.rank();
  auto local = [&](std::string buffer, std::string name, uint64_t numel, std::function<void(uint64_t, uint64_t, void*)> io) {
    if (numel == 0) return;
    out.push_back(Item{.buffer = std::move(buffer),
                       .buffer_dtype = DType::kF32,
                       .tensor = fmt::format("{}.rank{}", name, rank),
                       .shape = {numel},
                       .tensor_dtype = DType::kF32,
                       .begin = 0,
                       .count = numel,
                       .io = std::move(io)});
  };
  auto span_io = [p](std::span<float> v) {
    return [v, p](uint64_t at, uint64_t n, void* host) {
      if (p == Purpose::kSave) std::memcpy(host, v.data() + at, n * sizeof(float));
      else std::memcpy(v.data() + at, host, n * sizeof(float));
    };
  };
  local("error_feedback", "error_feedback.worker", c.reduce->worker_error().size(), span_io(c.reduce->worker_error()));
  local("error_feedback", "error_feedback.server", c.reduce->server_error().size(), span_io(c.reduce->server_error()));
  // The whole flat momentum, padding included: the compressed allreduce gives the padding between
  // parameters values too, and they take part in the next compressions' scales.
  const uint64_t total = set.layout.total();
  std::vector<std::pair<const char*, StateBuffer*>> flat = {{"rank_local.exp_avg", &c.exp_avg}};
  if (!c.accumulator.empty()) {
    // 0/1 Adam at stage 0: every rank steps its own copy between synchronisations.
    StateSet* sp = &set;
    local("rank_local", "rank_local.fp32", total, [this, sp, p](uint64_t at, uint64_t n, void* host) {
      if (p == Purpose::kSave) s_.read_master(*sp, {at, n}, static_cast<float*>(host));
      else write_master(*sp, {at, n}, static_cast<const float*>(host));
    });
    flat.emplace_back("rank_local.accumulator", &c.accumulator);
  }
  for (auto [name, buf] : flat) {
    local("rank_local", name, total, [this, buf, p](uint64_t at, uint64_t n, void* host) {
      float* ptr = static_cast<float*>(buf->data()) + at;
      if (p == Purpose::kSave) copy_out(host, *buf, ptr, n * sizeof(float));
      else copy_in(*buf, ptr, host, n * sizeof(float));
    });
  }
}

std::vector<Item> EngineCheckpoint::items(Purpose p) {
  std::vector<Item> out;
  for (auto& set : s_.sets_) add_param_items(out, *set, p);
  if (s_.compressed_) {
    add_compressed_items(out, p, p == Purpose::kSave || rank_local_ok_);
  } else {
    for (auto& set : s_.sets_) add_state_items(out, *set, p);
  }
  return out;
}

std::map<std::string, checkpoint::Scalar> EngineCheckpoint::scalars() const {
  const EngineConfig& cfg = e_.config_;
  std::map<std::string, checkpoint::Scalar> m;
  m["global_step"] = e_.global_step_;
  m["micro_step"] = s_.micro_step_;
  m["samples"] = e_.global_step_ * cfg.batch.train_batch_size;
  m["steps_taken"] = s_.steps_taken_;  // updates applied (fp16 skips excluded): the optimizer's and schedule's step
  m["data.position"] = e_.global_step_;  // the optimizer step whose batch comes next (BatchSource is keyed by it)
  m["data.seed"] = static_cast<int64_t>(cfg.data_seed.value_or(cfg.seed));
  m["rng.seed"] = static_cast<int64_t>(cfg.seed);
  m["lr_scheduler.last_batch_iteration"] = s_.steps_taken_ - 1;  // DeepSpeed's name for the schedule position
  m["lr_scheduler.lr"] = s_.schedule_.lr_at(s_.steps_taken_);
  const optim::LossScaler::State ls = s_.scaler_.state();
  m["loss_scaler.scale"] = ls.scale;
  m["loss_scaler.hysteresis_left"] = ls.hysteresis_left;
  m["loss_scaler.good_steps"] = ls.good_steps;
  m["loss_scaler.overflows"] = ls.overflows;
  m["optimizer.type"] = std::string(cfg.optimizer.name());
  m["zero.stage"] = static_cast<int64_t>(s_.stage_);
  m["precision"] = precision_name(cfg.precision);
  m["world_size"] = static_cast<int64_t>(s_.group_.size());
  m["offload_optimizer"] = offload_device_name(s_.offload_optimizer_);
  m["offload_param"] = offload_device_name(s_.offload_param_);
  if (s_.compressed_) {
    const CompressedState& c = *s_.compressed_;
    m["compressed.momentum_whole"] = static_cast<int64_t>(c.momentum_whole);
    m["compressed.flat_elements"] = static_cast<int64_t>(s_.dense().layout.total());
    m["compressed.rank_local_states"] = static_cast<int64_t>(!c.accumulator.empty());
    if (c.schedule) {
      const optim::ZeroOneSchedule::State& z = c.schedule->state();
      m["zero_one.step"] = z.step;
      m["zero_one.var_interval"] = z.var_interval;
      m["zero_one.var_counter"] = z.var_counter;
      m["zero_one.local_step_interval"] = z.local_step_interval;
      m["zero_one.local_step_counter"] = z.local_step_counter;
      m["zero_one.lrs"] = z.lrs;
    }
  }
  return m;
}

}  // namespace zs::engine
