// What each rank saves or loads, and the data movement of each piece (Engine::save_checkpoint /
// load_checkpoint; the save and load themselves are in engine_checkpoint.cpp).
#include <cstring>
#include <numeric>

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
// Note [tensor-parallel checkpoints]
// A tensor-parallel parameter (Note [tensor slices] in nn/parameter.h) is saved into its full tensor:
// the tensor of a checkpoint is the tp = 1 model's, under the same name and full shape, and each
// rank writes the runs of its slice (of its ZeRO partition) that are contiguous in the full tensor's
// row-major order, each a segment [full, full + n). A load at any tp degree reads the runs of its
// own slice the same way, so a checkpoint written at one tp degree, data-parallel size, ZeRO stage
// and offload target resumes at any other, and the tools (consolidate, inspect, compare) see
// whole tensors. A parameter held whole by every tensor-parallel rank (a norm, a row layer's bias)
// is written by tensor-parallel rank 0 only and read by every rank. At tp = 1 every parameter is
// one run, and the files are what they always were. The checkpoint's rank files are numbered in
// Megatron's order (CheckpointRanks); the metadata records the writer's tensor_parallel_size, for
// information only. Packed optimizer states (CAdam's int8 momentum and its per-32-element scales)
// are stored as the full tensor's packed values too, which needs every run to start and end on the
// state's blocks (block_elements below): else the save or load is refused naming the parameter and
// its slice. A run of row-parallel weight is one row of the slice, so such a parameter is as many
// segments as its rows (32 bytes each in the rank file's index).
void EngineCheckpoint::add_param_items(std::vector<Item>& out, ModelStates& set, Purpose p) {
  const ShardRange range = range_for(set, p, false);
  for_slots(set, range, p, [&](const ParamSlot& slot, ShardRange part) {
    for_full_runs(slot, part, [&](uint64_t flat, uint64_t full, uint64_t n) {
      Item master{.buffer = kCkptMaster,
                  .buffer_dtype = DType::kF32,
                  .tensor = slot.param->full_name(),
                  .shape = full_shape_of(*slot.param),
                  .tensor_dtype = a_.dtype,
                  .begin = full,
                  .count = n};
      ModelStates* sp = &set;
      master.io = [sp, flat, p](uint64_t at, uint64_t n, void* host) {
        if (p == Purpose::kSave) sp->read_master({flat + at, n}, static_cast<float*>(host));
        else sp->write_master({flat + at, n}, static_cast<const float*>(host));
      };
      out.push_back(master);
    });
    // The training-dtype parameters: written for consolidation and 16-bit tools; a load derives them
    // from the master (bit-identical: each step writes the master rounded). After the slot's master
    // items, so that a slice's runs of one buffer are consecutive (describe() joins them).
    if (p != Purpose::kSave || a_.dtype == DType::kF32) return;
    for_full_runs(slot, part, [&](uint64_t flat, uint64_t full, uint64_t n) {
      ModelStates* sp = &set;
      out.push_back(Item{.buffer = kCkptParams,
                         .buffer_dtype = a_.dtype,
                         .tensor = slot.param->full_name(),
                         .shape = full_shape_of(*slot.param),
                         .tensor_dtype = a_.dtype,
                         .begin = full,
                         .count = n,
                         .io = [sp, flat](uint64_t at, uint64_t n, void* host) { sp->read_params({flat + at, n}, host); }});
    });
  });
}

namespace {

// Elements of one block of a packed state: a run of the full tensor must start on one (and end on
// one, or at both tensors' ends) for its stored values and 32-bit words to be the full tensor's.
uint64_t block_elements(const optim::StateSpec& spec) {
  const uint64_t values_per_word = spec.value_bytes >= 4 ? 1 : 4 / spec.value_bytes;
  return spec.elements_per_value * values_per_word;
}

}  // namespace

void EngineCheckpoint::add_state_items(std::vector<Item>& out, ModelStates& set, Purpose p) {
  const auto specs = a_.specs;
  const ShardRange range = range_for(set, p, false);
  const ShardRange stepped = set.step_range();
  ModelStates* sp = &set;
  // The packed states' common block (CAdam: its int8 momentum's words and its 32-element scales),
  // which every run of a slice must respect (Note [tensor-parallel checkpoints]).
  uint64_t block = 1;
  std::string packed;
  for (const optim::StateSpec& spec : specs) {
    if (spec.value_bytes == sizeof(float) && spec.elements_per_value == 1) continue;
    block = std::lcm(block, block_elements(spec));
    packed += fmt::format("{}'{}'", packed.empty() ? "" : ", ", spec.name);
  }
  if (block > 1) {
    for_slots(set, range, p, [&](const ParamSlot& slot, ShardRange) {
      const nn::Parameter& param = *slot.param;
      const uint64_t full_numel = static_cast<uint64_t>(param.full_numel());
      // Every run of the whole slot, not only of this rank's part: ZeRO's shard boundaries are block multiples.
      param.for_each_full_run(0, slot.numel, [&](uint64_t local, uint64_t full, uint64_t n) {
        const bool ends = local + n == slot.numel && full + n == full_numel;
        if (local % block == 0 && full % block == 0 && (n % block == 0 || ends)) return;
        const nn::TensorSlice& ts = param.tensor_slice();
        throw CheckpointError(fmt::format(
            "parameter '{}' (shape {}, slice {} of {} along dim {}, stride {}, of the full shape {}): the optimizer "
            "states {} of {} are kept per block of {} elements, and this slice's runs of {} elements in the full "
            "tensor do not start and end on such blocks, so they cannot be stored as the full tensor's; use a model "
            "whose slices' rows are multiples of {} elements, or an optimizer with elementwise states (AdamW, Lion)",
            param.full_name(), shape_text(shape_of(param.shape())), ts.index, ts.parts, ts.dim, ts.stride,
            shape_text(full_shape_of(param)), packed, a_.config.optimizer.name(), block, n, block));
      });
    });
  }
  for (size_t k = 0; k < specs.size(); ++k) {
    const optim::StateSpec spec = specs[k];
    const bool elementwise = spec.value_bytes == sizeof(float) && spec.elements_per_value == 1;
    for_slots(set, range, p, [&](const ParamSlot& slot, ShardRange part) {
      const nn::Parameter& param = *slot.param;
      const uint64_t full_numel = static_cast<uint64_t>(param.full_numel());
      for_full_runs(slot, part, [&](uint64_t flat, uint64_t full, uint64_t n) {
        // Byte range of the state for the run, from the state buffer's start (the stepped range's).
        const size_t first_byte = (flat - stepped.offset) / spec.elements_per_value * spec.value_bytes;
        Item it{.buffer = std::string(spec.name), .buffer_dtype = DType::kF32};
        if (elementwise) {
          it.tensor = param.full_name();
          it.shape = full_shape_of(param);
          it.tensor_dtype = a_.dtype;
          it.begin = full;
          it.count = n;
        } else {
          // Packed: the full tensor's values as 32-bit words (whole blocks: slots and shards start on
          // multiples of the block, and so do the runs of a slice, checked above).
          const uint64_t tensor_bytes = spec.bytes_for(full_numel);
          const uint64_t lo = full / spec.elements_per_value * spec.value_bytes;
          const uint64_t hi =
              full + n == full_numel ? tensor_bytes : (full + n) / spec.elements_per_value * spec.value_bytes;
          ZS_ASSERT(lo % 4 == 0 && full % spec.elements_per_value == 0, "state '{}' of '{}' split inside a word",
                    spec.name, param.full_name());
          it.tensor = fmt::format("{}.{}", param.full_name(), spec.name);
          it.shape = {(tensor_bytes + 3) / 4};
          it.buffer_dtype = it.tensor_dtype = spec.value_bytes == sizeof(float) ? DType::kF32 : DType::kI32;
          it.begin = lo / 4;
          it.count = (hi + 3) / 4 - lo / 4;
        }
        it.io = [sp, k, first_byte, p](uint64_t at, uint64_t n, void* host) {
          const size_t offset = first_byte + at * 4, bytes = n * 4;
          if (p == Purpose::kSave) sp->read_state(k, offset, host, bytes);
          else sp->write_state(k, offset, host, bytes);
        };
        out.push_back(std::move(it));
      });
    });
  }
}

void EngineCheckpoint::add_compressed_items(std::vector<Item>& out, Purpose p, bool rank_local) {
  CompressedState& c = *a_.compressed;
  ModelStates& set = dense();
  const ShardRange stepped = set.step_range();
  auto f32_item = [&](const char* buffer, const ParamSlot& slot, ShardRange part, StateBuffer& b, size_t base_elem) {
    for_full_runs(slot, part, [&](uint64_t flat, uint64_t full, uint64_t n) {
      Item it{.buffer = buffer,
              .buffer_dtype = DType::kF32,
              .tensor = slot.param->full_name(),
              .shape = full_shape_of(*slot.param),
              .tensor_dtype = a_.dtype,
              .begin = full,
              .count = n};
      const StateBuffer* bp = &b;
      const ModelStates* sp = &set;
      const size_t first = flat - base_elem;
      it.io = [sp, bp, first, p](uint64_t at, uint64_t n, void* host) {
        if (p == Purpose::kSave) sp->read_bytes(*bp, (first + at) * sizeof(float), host, n * sizeof(float));
        else sp->write_bytes(*bp, (first + at) * sizeof(float), host, n * sizeof(float));
      };
      out.push_back(std::move(it));
    });
  };
  // The momentum is whole on every rank: its owner's part on save; on load every rank reads it all
  // (the checkpoint's owners tile it).
  for_slots(set, range_for(set, p, true), p, [&](const ParamSlot& slot, ShardRange part) {
    f32_item(kCkptMomentum, slot, part, c.momentum, 0);
  });
  for_slots(set, range_for(set, p, false), p, [&](const ParamSlot& slot, ShardRange part) {
    f32_item(kCkptVariance, slot, part, c.variance, stepped.offset);
  });
  if (!rank_local) return;
  // Rank-local states: this rank's own, whole (Note [checkpoint buffers]), named by its checkpoint
  // rank (its data-parallel rank at tp = 1).
  const int rank = ranks_.rank();
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
  local(kCkptErrorFeedback, "error_feedback.worker", c.reduce->worker_error().size(), span_io(c.reduce->worker_error()));
  local(kCkptErrorFeedback, "error_feedback.server", c.reduce->server_error().size(), span_io(c.reduce->server_error()));
  // The whole flat momentum, alignment gaps included (the compressed allreduce reads and writes them
  // as zero, comm/compressed_allreduce.h): one buffer per rank, as the step keeps it.
  const uint64_t total = set.layout.total();
  ModelStates* sp = &set;
  std::vector<std::pair<const char*, const StateBuffer*>> flat = {{"rank_local.exp_avg", &c.momentum}};
  if (!c.accumulator.empty()) {
    // 0/1 Adam at stage 0: every rank steps its own copy between synchronisations.
    local(kCkptRankLocal, "rank_local.fp32", total, [sp, p](uint64_t at, uint64_t n, void* host) {
      if (p == Purpose::kSave) sp->read_master({at, n}, static_cast<float*>(host));
      else sp->write_master({at, n}, static_cast<const float*>(host));
    });
    flat.emplace_back("rank_local.accumulator", &c.accumulator);
  }
  for (auto [name, buf] : flat) {
    local(kCkptRankLocal, name, total, [sp, buf, p](uint64_t at, uint64_t n, void* host) {
      if (p == Purpose::kSave) sp->read_bytes(*buf, at * sizeof(float), host, n * sizeof(float));
      else sp->write_bytes(*buf, at * sizeof(float), host, n * sizeof(float));
    });
  }
}

std::vector<Item> EngineCheckpoint::items(Purpose p) {
  std::vector<Item> out;
  for (auto& set : a_.sets) add_param_items(out, *set, p);
  if (a_.compressed) {
    add_compressed_items(out, p, p == Purpose::kSave || rank_local_ok_);
  } else {
    for (auto& set : a_.sets) add_state_items(out, *set, p);
  }
  return out;
}

std::map<std::string, checkpoint::Scalar> EngineCheckpoint::scalars() const {
  const EngineConfig& cfg = a_.config;
  std::map<std::string, checkpoint::Scalar> m;
  m["global_step"] = a_.global_step;
  m["micro_step"] = a_.micro_step;
  m["samples"] = a_.global_step * cfg.batch.train_batch_size;
  m["steps_taken"] = a_.steps_taken;  // updates applied (fp16 skips excluded): the optimizer's and schedule's step
  m["data.position"] = a_.global_step;  // the optimizer step whose batch comes next (BatchSource is keyed by it)
  m["data.seed"] = static_cast<int64_t>(cfg.data_seed.value_or(cfg.seed));
  m["rng.seed"] = static_cast<int64_t>(cfg.seed);
  m["lr_scheduler.last_batch_iteration"] = a_.steps_taken - 1;  // DeepSpeed's name for the schedule position
  m["lr_scheduler.lr"] = a_.schedule.lr_at(a_.steps_taken);
  const optim::LossScaler::State ls = a_.scaler.state();
  m["loss_scaler.scale"] = ls.scale;
  m["loss_scaler.hysteresis_left"] = ls.hysteresis_left;
  m["loss_scaler.good_steps"] = ls.good_steps;
  m["loss_scaler.overflows"] = ls.overflows;
  m["optimizer.type"] = std::string(cfg.optimizer.name());
  m["zero.stage"] = static_cast<int64_t>(a_.stage);
  m["precision"] = precision_name(cfg.precision);
  m["world_size"] = static_cast<int64_t>(ranks_.size());  // the rank files
  // Information (a load at any tp degree reads the full tensors): Note [tensor-parallel checkpoints].
  m["tensor_parallel_size"] = static_cast<int64_t>(ranks_.tp_size());
  if (ranks_.pp_size() > 1) m["pipeline_parallel_size"] = static_cast<int64_t>(ranks_.pp_size());  // information only
  m["offload_optimizer"] = offload_device_name(cfg.zero.offload_optimizer.device);
  m["offload_param"] = offload_device_name(cfg.zero.offload_param.device);
  if (a_.compressed) {
    const CompressedState& c = *a_.compressed;
    m["compressed.momentum_whole"] = static_cast<int64_t>(c.momentum_whole);
    m["compressed.flat_elements"] = static_cast<int64_t>(dense().layout.total());
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
