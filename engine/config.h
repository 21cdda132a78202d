// The run configuration: one DeepSpeed-style JSON file, validated once into plain structs.
//
// DeepSpeed's keys keep their names and meaning (train_batch_size, train_micro_batch_size_per_gpu,
// gradient_accumulation_steps, gradient_clipping, fp16, bf16, optimizer, scheduler, zero_optimization,
// steps_per_print, wall_clock_breakdown). zeroshard's own sections: device, memory, comm, checkpoint,
// plus the top-level seed and train_steps. The sections of the program that builds the model (model,
// data, log) are read by that program (run/run_config.h) through ProgramSection, in the same pass. Every section rejects unknown keys with a did-you-mean; a
// DeepSpeed key zeroshard does not implement yet is an error saying so, never silently ignored
// (engine/detail/deepspeed_keys.h holds DeepSpeed's key tables). A DeepSpeed key whose value asks for
// what zeroshard does is accepted (`"prescale_gradients": false`, a monitor section with
// `"enabled": false`); a performance hint zeroshard has no use for is accepted and noted in `notes`.
// Hugging Face's "auto" placeholders are refused with a message saying what to write instead.
//
//   EngineConfig cfg = parse_config(parse_json_file(path), /*data_parallel_size=*/world.size());
//   // or, with the built-in model's sections: run::parse_run_config (run/run_config.h)
//
// Batch arithmetic is DeepSpeed's: train_batch_size = micro_batch x accumulation x data-parallel size;
// any one of the three may be left out and is inferred; all three given must agree.
#pragma once

#include <boost/json/value.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/config.h"
#include "core/json.h"
#include "engine/recompute_config.h"
#include "engine/monitor_config.h"
#include "memory/dtype.h"
#include "nn/layer_drop.h"
#include "nn/sparse_attention.h"
#include "offload/aio.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/registry.h"

namespace zs::engine {

enum class Precision { kFp32, kBf16, kFp16 };

struct BatchConfig {
  int64_t train_batch_size = 0;             // samples per optimizer step, all ranks together
  int64_t micro_batch_per_rank = 0;         // train_micro_batch_size_per_gpu
  int64_t gradient_accumulation_steps = 0;  // micro-batches per optimizer step on each rank
};

// The `optimizer` section: a registered optimizer type and its parsed, validated params
// (optim/registry.h). The engine asks it (compressed(), make(), state_specs(), lr()) and never
// compares type names.
using OptimizerConfig = optim::OptimizerChoice;

// zeroshard's memory-reuse modes (section `memory`; MindSpeed's names).
struct MemoryModes {
  // Gradients reach the optimizer in fp32 through a small reused buffer, chunk by chunk, instead of a
  // persistent fp32 copy of this rank's stepped gradients (bf16/fp16 only; fp32 gradients are fp32).
  bool release_fp32_grad = true;
  // bf16 only: the fp32 master weight is stored as the bf16 parameter (its upper half, rounded) plus a
  // 16-bit residual, so no separate fp32 master buffer exists (Note [reuse_fp32_param] in engine_step.cpp).
  bool reuse_fp32_param = false;
};

enum class OffloadDevice { kNone, kCpu, kNvme };
std::string offload_device_name(OffloadDevice d);

// zero_optimization.offload_optimizer (stages 1-3): the fp32 master weights and optimizer states of
// this rank's stepped range live on the host (cpu) or in a swap file under nvme_path (nvme), and the
// optimizer steps them sub-group by sub-group (sub_group_size); the gradient shard of stages 2-3 lives
// on the host too. docs/offload.md.
struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;
  bool pin_memory = false;  // mlock the host buffers
  int64_t buffer_count = 4; // nvme: host buffers of one sub-group each (read ahead, compute, write back)
  bool fast_init = false;   // accepted; zeroshard initialises states in place, sub-group by sub-group
};

// zero_optimization.offload_param (stage 3): this rank's parameter shard lives on the host (cpu) or in
// a swap file (nvme) and is read ahead of use by the ZeRO-3 prefetch.
struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;
  bool pin_memory = false;
  int64_t buffer_count = 5;          // nvme: staging buffers for reads in flight...
  int64_t buffer_size = 100'000'000; // ...of this many elements each (bounds the prefetch window)
  int64_t max_in_cpu = 1'000'000'000;  // nvme: parameter elements in host memory (caps the prefetch window)
};

struct ZeroConfig {
  int stage = 0;
  bool overlap_comm = true;            // start bucket reductions during backward
  bool contiguous_gradients = true;    // always true in zeroshard: gradients live in flat buffers
  bool reduce_scatter = true;          // stages 1+: reduce-scatter buckets (false: allreduce them)
  int64_t reduce_bucket_size = 500'000'000;     // elements
  int64_t allgather_bucket_size = 500'000'000;  // elements
  int64_t stage3_prefetch_bucket_size = 50'000'000;        // elements gathered ahead of use
  int64_t stage3_param_persistence_threshold = 100'000;    // modules with fewer own elements stay gathered
  int64_t stage3_max_live_parameters = 1'000'000'000;      // elements gathered at once (prefetch stops there)
  int64_t stage3_max_reuse_distance = 1'000'000'000;       // forward-released modules reused within it are kept
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;
  int64_t sub_group_size = 1'000'000'000;  // elements the offloaded optimizer steps at a time
  // ZeRO++ (stage 3; docs/zero.md "ZeRO++"). hpZ: a secondary copy of the parameter partition inside
  // each group of this many consecutive data-parallel ranks (1: off), from which the backward gathers.
  int64_t zero_hpz_partition_size = 1;
  bool zero_quantized_weights = false;    // qwZ: the forward's gathers carry int8 blocks
  bool zero_quantized_gradients = false;  // qgZ: gradients reduce-scattered in int8 blocks, by host group
  bool zeropp() const { return zero_hpz_partition_size > 1 || zero_quantized_weights || zero_quantized_gradients; }
};

struct DeviceConfig {
  int64_t memory_mb = 4096;   // capacity of the device arena per rank
  std::string backend = "cpu";  // memory::make_backend: "cpu", or "guarded" (faults on stray device access)
  // Rank 0's device arena records its allocation trace (memory/alloc_trace.h) and the engine writes it
  // here when destroyed; empty: no trace. For replaying into other allocator policies (benchmarks/).
  std::string alloc_trace;
};

struct CommSectionConfig {
  double timeout_s = 300.0;  // a collective not done within this raises CommError on that rank
  // comm.shared_memory: "auto" (default), true, false (comm::SharedMemory, comm/config.h).
  comm::SharedMemory shared_memory = comm::SharedMemory::kAuto;
  // comm.shared_arena: the device arena in memory the node's other ranks map (memfd,
  // comm/shared_arena.h), so collectives on it read the peers' tensors directly instead of staging
  // through the window (Note [Direct collectives] in comm/detail/shm_direct.h). Takes effect with
  // shared_memory not false and the "cpu" device backend; otherwise collectives stay staged.
  bool shared_arena = true;
};

// DeepSpeed's checkpoint.tag_validation: whether every rank must save under the same tag.
enum class TagValidation { kIgnore, kWarn, kFail };

// The `checkpoint` section: DeepSpeed's keys plus zeroshard's own (docs/checkpoints.md).
struct CheckpointConfig {
  TagValidation tag_validation = TagValidation::kWarn;  // DeepSpeed's default
  std::string dir;            // `zeroshard train` saves here when --save is not given; empty: no saves
  int64_t save_interval = 0;  // `zeroshard train` saves every this many optimizer steps (0: at the end only)
  int64_t keep_last = 0;      // tags kept under the directory after a save (0: all)
  // Engine::save_checkpoint snapshots this rank's states to host memory and writes its file on a
  // background thread while training goes on; Engine::wait_checkpoint (or the next save or load) commits.
  bool async = false;
  // zero_optimization.stage3_gather_16bit_weights_on_model_save: each save also writes the parameters
  // in the training dtype, whole and by name, to <tag>/zs_model_16bit.h5 (DeepSpeed's 16-bit model file).
  bool gather_16bit_weights = false;
};

struct EngineConfig {
  BatchConfig batch;
  Precision precision = Precision::kFp32;
  optim::LossScalerConfig loss_scaler;  // fp16 only
  // fp16.auto_cast (DeepSpeed's): Engine::forward and eval_batch cast the batch's floating-point tensors
  // (inputs and targets; token ids stay int32) to compute_dtype() before the model sees them. Only
  // with fp16 enabled (DeepSpeed reads it from the enabled fp16 section).
  bool auto_cast = false;
  double gradient_clipping = 0.0;       // 0: off
  OptimizerConfig optimizer;
  optim::LrScheduleConfig scheduler;    // type kConstant when there is no `scheduler` section
  ZeroConfig zero;
  MemoryModes memory;
  offload::AioConfig aio;  // DeepSpeed's `aio` section (NVMe offload)
  int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;    // log forward/backward/step times every steps_per_print
  RecomputeConfig recompute;  // the `activation_checkpointing` section (engine/recompute_config.h)
  // DeepSpeed's `sparse_attention` section (nn/sparse_attention.h): the block-sparse layout of the
  // built-in models' attention (run/run_config.cpp hands it to them); a program's own model may read
  // it here, as a DeepSpeed model reads it from its engine. Absent: dense causal attention.
  std::optional<nn::SparseAttentionConfig> sparse_attention{};
  // DeepSpeed's `progressive_layer_drop` section (nn/layer_drop.h): the built-in models skip blocks
  // along its schedule; a program's own model may read it here. Off by default.
  nn::ProgressiveLayerDrop progressive_layer_drop{};

  DeviceConfig device;
  CommSectionConfig comm;
  CheckpointConfig checkpoint;  // Engine::save_checkpoint / load_checkpoint; `zeroshard train --save/--load`
  MonitorConfig monitor;      // csv_monitor, tensorboard, comms_logger, memory_breakdown (engine/monitor.h)
  uint64_t seed = 1234;       // parameter initialisation and data sampling
  // The data's sampling seed, recorded in checkpoints (`data.seed`); absent: `seed`. Set by the program
  // that reads the data (run/run_config.h); the engine only records it.
  std::optional<uint64_t> data_seed;
  int64_t train_steps = 100;  // optimizer steps `zeroshard train` runs (--steps overrides)

  // One line per accepted key that has no effect here, starting with its JSON path
  // ("zero_optimization.contiguous_gradients: accepted; has no effect in zeroshard: ...").
  // Also the optimizer a config without an `optimizer` section trains with ("optimizer: no ...").
  // parse_config logs nothing (it runs on every rank); the program logs these once, on rank 0.
  std::vector<std::string> notes;
  // The config document as parsed (compact JSON), saved into checkpoints; empty for a config built in C++.
  std::string json;

  // The storage dtype of parameters and gradients the model computes with.
  memory::DType compute_dtype() const;
  // DeepSpeed's `communication_data_type`: the dtype gradients are averaged in (put on the wire;
  // comm sums 16-bit values in fp32). Absent: the compute dtype, as DeepSpeed.
  std::optional<memory::DType> communication_data_type;
  memory::DType gradient_comm_dtype() const { return communication_data_type.value_or(compute_dtype()); }
};

// A top-level section that the program using the engine reads itself (run/run_config.h: model, data,
// log). parse_config declares it at the root, so the root's unknown-key check and did-you-mean cover
// it, and calls `read` with the section's reader at its place in the one validation order: right
// after the engine's section named `after` ("device" or "comm"), so the first problem reported does
// not depend on which part of the program reads a section. `parsed` holds what the engine has read
// so far (the top-level seed, for instance). The reader is finished (unknown keys) after `read`.
struct ProgramSection {
  std::string_view key;
  std::string_view after;
  std::function<void(ObjectReader& section, const EngineConfig& parsed)> read;
};

// Parses and validates a whole config document for a run with `data_parallel_size` ranks: the
// engine's keys, and `program_sections` through their readers (any other key is unknown).
// Throws ConfigError naming the JSON path of the first problem and how to fix it.
EngineConfig parse_config(const boost::json::value& doc, int data_parallel_size,
                          std::span<const ProgramSection> program_sections = {});

// Resolves DeepSpeed's batch arithmetic: each argument is 0 when absent from the config.
BatchConfig resolve_batch(int64_t train_batch_size, int64_t micro_batch, int64_t accumulation, int data_parallel_size);

std::string precision_name(Precision p);

}  // namespace zs::engine
