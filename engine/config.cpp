#include "engine/config.h"

#include <algorithm>
#include <cctype>

#include "core/json.h"
#include "nn/gpt.h"

namespace zs::engine {
namespace {

void read_fp16(ObjectReader& r, EngineConfig& cfg) {
  bool enabled = false;
  r.read("enabled", enabled);
  auto& ls = cfg.loss_scaler;
  r.read("loss_scale", ls.loss_scale, RealRange::non_negative());
  r.read("initial_scale_power", ls.initial_scale_power, IntRange{0, 64});
  r.read("loss_scale_window", ls.loss_scale_window, IntRange::positive());
  r.read("hysteresis", ls.hysteresis, IntRange::positive());
  r.read("consecutive_hysteresis", ls.consecutive_hysteresis);
  r.read("min_loss_scale", ls.min_loss_scale, RealRange::positive());
  r.unsupported("auto_cast", "zeroshard does not implement auto_cast yet");
  r.unsupported("fp16_master_weights_and_grads", "zeroshard keeps fp32 master weights and does not implement this mode yet");
  if (enabled) cfg.precision = Precision::kFp16;
}

void read_bf16(ObjectReader& r, EngineConfig& cfg, bool fp16_enabled) {
  bool enabled = false;
  r.read("enabled", enabled);
  r.unsupported("immediate_grad_update", "zeroshard does not implement immediate_grad_update yet");
  if (enabled && fp16_enabled) {
    throw ConfigError("bf16.enabled: bf16 and fp16 cannot both be enabled; set fp16.enabled or bf16.enabled to false");
  }
  if (enabled) cfg.precision = Precision::kBf16;
}

void read_memory_modes(ObjectReader& r, MemoryModes& m, Precision precision) {
  r.read("release_fp32_grad", m.release_fp32_grad);
  r.read("reuse_fp32_param", m.reuse_fp32_param);
  if (m.reuse_fp32_param && precision != Precision::kBf16) {
    throw ConfigError(fmt::format("{}: the fp32 master weight can share memory with the parameter only in bf16 (its upper "
                                  "half); enable bf16 or set it to false",
                                  r.path_of("reuse_fp32_param")));
  }
}

void read_scheduler(ObjectReader& r, optim::LrScheduleConfig& s) {
  std::string type;
  r.require("type", type);
  s.type = optim::parse_schedule_type(type, r.path_of("type"));
  r.read_object("params", [&](ObjectReader& p) {
    const bool warmup_lr = s.type != optim::ScheduleType::kWarmupCosineLR;
    if (warmup_lr) {
      p.read("warmup_min_lr", s.warmup_min_lr, RealRange::non_negative());
      p.read("warmup_max_lr", s.warmup_max_lr, RealRange::non_negative());
    } else {
      p.read("warmup_min_ratio", s.warmup_min_ratio, RealRange::closed(0, 1));
      p.read("cos_min_ratio", s.cos_min_ratio, RealRange::closed(0, 1));
    }
    p.read("warmup_num_steps", s.warmup_num_steps, IntRange::non_negative());
    if (s.type != optim::ScheduleType::kWarmupLR) p.read("total_num_steps", s.total_num_steps, IntRange::positive());
    p.read_enum("warmup_type", s.warmup_type, {{"log", optim::WarmupType::kLog}, {"linear", optim::WarmupType::kLinear}});
    p.unsupported("last_batch_iteration", "resuming a schedule comes with checkpoints, which zeroshard does not implement yet");
  });
  optim::validate(s, json_path_join(r.path(), "params"));
}

void read_zero(ObjectReader& r, ZeroConfig& z) {
  r.read("stage", z.stage, IntRange{0, 3});
  r.read("overlap_comm", z.overlap_comm);
  r.read("contiguous_gradients", z.contiguous_gradients);
  if (!z.contiguous_gradients) {
    throw ConfigError(fmt::format("{}: zeroshard always keeps gradients in contiguous flat buffers; remove the key or set "
                                  "it to true",
                                  r.path_of("contiguous_gradients")));
  }
  r.read("reduce_scatter", z.reduce_scatter);
  r.read("reduce_bucket_size", z.reduce_bucket_size, IntRange::positive());
  r.read("allgather_bucket_size", z.allgather_bucket_size, IntRange::positive());
  bool allgather_partitions = true;
  r.read("allgather_partitions", allgather_partitions);
  if (!allgather_partitions) {
    throw ConfigError(fmt::format("{}: zeroshard always allgathers updated partitions (the broadcast variant is not "
                                  "implemented); remove the key or set it to true",
                                  r.path_of("allgather_partitions")));
  }
  r.alias("stage3_prefetch_bucket_size", "prefetch_bucket_size");
  r.read("stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size, IntRange::non_negative());
  r.alias("stage3_param_persistence_threshold", "param_persistence_threshold");
  r.read("stage3_param_persistence_threshold", z.stage3_param_persistence_threshold, IntRange::non_negative());
  r.alias("stage3_max_live_parameters", "max_live_parameters");
  r.read("stage3_max_live_parameters", z.stage3_max_live_parameters, IntRange::positive());
  auto read_device = [](ObjectReader& o, OffloadDevice& d) {
    o.read_enum("device", d, {{"none", OffloadDevice::kNone}, {"cpu", OffloadDevice::kCpu}, {"nvme", OffloadDevice::kNvme}});
  };
  auto require_path = [](ObjectReader& o, OffloadDevice d, const std::string& path) {
    if (d == OffloadDevice::kNvme && path.empty()) {
      throw ConfigError(fmt::format("{}: device nvme needs a directory for the swap files; set nvme_path (e.g. a mount "
                                    "point of a local NVMe drive)",
                                    o.path_of("nvme_path")));
    }
  };
  r.read_object("offload_optimizer", [&](ObjectReader& o) {
    auto& c = z.offload_optimizer;
    read_device(o, c.device);
    o.read("nvme_path", c.nvme_path);
    o.read("pin_memory", c.pin_memory);
    o.read("buffer_count", c.buffer_count, IntRange{1, 64});
    o.read("fast_init", c.fast_init);
    o.unsupported("ratio", "zeroshard offloads all or none of the optimizer states");
    require_path(o, c.device, c.nvme_path);
  });
  r.read_object("offload_param", [&](ObjectReader& o) {
    auto& c = z.offload_param;
    read_device(o, c.device);
    o.read("nvme_path", c.nvme_path);
    o.read("pin_memory", c.pin_memory);
    o.read("buffer_count", c.buffer_count, IntRange{1, 64});
    o.read("buffer_size", c.buffer_size, IntRange::positive());
    o.read("max_in_cpu", c.max_in_cpu, IntRange::non_negative());
    require_path(o, c.device, c.nvme_path);
  });
  r.read("sub_group_size", z.sub_group_size, IntRange::positive());
  for (std::string_view key : {"cpu_offload", "cpu_offload_params", "cpu_offload_use_pin_memory"}) {
    r.unsupported(key, "use offload_optimizer / offload_param (DeepSpeed's current keys)");
  }
  if (z.offload_optimizer.device != OffloadDevice::kNone && z.stage == 0) {
    throw ConfigError(fmt::format("{}: optimizer offload needs ZeRO stage 1, 2 or 3 (the stepped partition is what moves); "
                                  "set zero_optimization.stage",
                                  r.path_of("offload_optimizer")));
  }
  if (z.offload_param.device != OffloadDevice::kNone && z.stage != 3) {
    throw ConfigError(fmt::format("{}: parameter offload needs ZeRO stage 3 (only partitioned parameters can move); set "
                                  "zero_optimization.stage to 3",
                                  r.path_of("offload_param")));
  }
  for (std::string_view key :
       {"stage3_max_reuse_distance", "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
        "elastic_checkpoint", "round_robin_gradients", "zero_hpz_partition_size", "zero_quantized_weights",
        "zero_quantized_gradients", "mics_shard_size", "mics_hierarchical_params_gather", "load_from_fp32_weights",
        "ignore_unused_parameters", "legacy_stage1", "memory_efficient_linear", "model_persistence_threshold",
        "use_multi_rank_bucket_allreduce", "log_trace_cache_warnings", "max_reuse_distance"}) {
    r.unsupported(key, "zeroshard does not implement this ZeRO option yet");
  }
}

void read_model(ObjectReader& r, nn::GptConfig& m) {
  std::string type = "gpt";
  r.read_choice("type", type, {"gpt"});
  r.read("n_layer", m.n_layer, IntRange::positive());
  r.read("d_model", m.d_model, IntRange::positive());
  r.read("n_head", m.n_head, IntRange::positive());
  r.read("seq_len", m.seq_len, IntRange::at_least(2));
  r.read("vocab_size", m.vocab_size, IntRange{256, 1 << 24});
  r.read("tied_embeddings", m.tied_embeddings);
  r.read("init_std", m.init_std, RealRange::positive());
  nn::validate(m);
}

}  // namespace

std::string offload_device_name(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::kNone: return "none";
    case OffloadDevice::kCpu: return "cpu";
    case OffloadDevice::kNvme: return "nvme";
  }
  return "?";
}

memory::DType EngineConfig::compute_dtype() const {
  switch (precision) {
    case Precision::kBf16: return memory::DType::kBF16;
    case Precision::kFp16: return memory::DType::kF16;
    case Precision::kFp32: break;
  }
  return memory::DType::kF32;
}

std::string precision_name(Precision p) {
  switch (p) {
    case Precision::kFp32: return "fp32";
    case Precision::kBf16: return "bf16";
    case Precision::kFp16: return "fp16";
  }
  return "?";
}

BatchConfig resolve_batch(int64_t train, int64_t micro, int64_t accum, int dp) {
  const int64_t n = dp;
  auto explain = [&]() {
    return fmt::format("train_batch_size ({}) must equal train_micro_batch_size_per_gpu ({}) x gradient_accumulation_steps "
                       "({}) x data-parallel size ({})",
                       train ? std::to_string(train) : "absent", micro ? std::to_string(micro) : "absent",
                       accum ? std::to_string(accum) : "absent", n);
  };
  BatchConfig b;
  if (train && micro && accum) {
    if (train != micro * accum * n) throw ConfigError(fmt::format("train_batch_size: {}; fix one of the three values", explain()));
    b = {train, micro, accum};
  } else if (train && micro) {
    if (train % (micro * n) != 0) {
      throw ConfigError(fmt::format("train_batch_size: {} is not divisible by train_micro_batch_size_per_gpu x data-parallel "
                                    "size ({}); {}",
                                    train, micro * n, explain()));
    }
    b = {train, micro, train / (micro * n)};
  } else if (train && accum) {
    if (train % (accum * n) != 0) {
      throw ConfigError(fmt::format("train_batch_size: {} is not divisible by gradient_accumulation_steps x data-parallel "
                                    "size ({}); {}",
                                    train, accum * n, explain()));
    }
    b = {train, train / (accum * n), accum};
  } else if (micro && accum) {
    b = {micro * accum * n, micro, accum};
  } else if (train) {
    if (train % n != 0) {
      throw ConfigError(fmt::format("train_batch_size: {} is not divisible by the data-parallel size {}; set "
                                    "train_micro_batch_size_per_gpu and gradient_accumulation_steps, or change it",
                                    train, n));
    }
    b = {train, train / n, 1};
  } else if (micro) {
    b = {micro * n, micro, 1};
  } else {
    throw ConfigError("train_batch_size: set train_batch_size or train_micro_batch_size_per_gpu (DeepSpeed needs one of them)");
  }
  return b;
}

EngineConfig parse_config(const boost::json::value& doc, int dp) {
  EngineConfig cfg;
  ObjectReader root(doc, "");
  int64_t train = 0, micro = 0, accum = 0;
  root.read("train_batch_size", train, IntRange::positive());
  root.read("train_micro_batch_size_per_gpu", micro, IntRange::positive());
  root.read("gradient_accumulation_steps", accum, IntRange::positive());

  root.read("gradient_clipping", cfg.gradient_clipping, RealRange::non_negative());
  root.read("steps_per_print", cfg.steps_per_print, IntRange::positive());
  root.read("wall_clock_breakdown", cfg.wall_clock_breakdown);
  root.read("seed", cfg.seed);
  root.read("train_steps", cfg.train_steps, IntRange::positive());

  bool fp16_enabled = false;
  root.read_object("fp16", [&](ObjectReader& r) {
    read_fp16(r, cfg);
    fp16_enabled = cfg.precision == Precision::kFp16;
  });
  root.alias("bf16", "bfloat16");
  root.read_object("bf16", [&](ObjectReader& r) { read_bf16(r, cfg, fp16_enabled); });
  root.read_object("optimizer", [&](ObjectReader& r) { cfg.optimizer = optim::read_optimizer(r); });
  cfg.scheduler.base_lr = cfg.optimizer.lr();
  root.read_object("scheduler", [&](ObjectReader& r) { read_scheduler(r, cfg.scheduler); });
  root.read_object("zero_optimization", [&](ObjectReader& r) { read_zero(r, cfg.zero); });

  root.read_object("memory", [&](ObjectReader& r) { read_memory_modes(r, cfg.memory, cfg.precision); });
  root.read_object("aio", [&](ObjectReader& r) {
    auto& a = cfg.aio;
    int64_t block = static_cast<int64_t>(a.block_size);
    r.read("block_size", block, IntRange{4096, int64_t{1} << 30});
    a.block_size = static_cast<size_t>(block);
    r.read("queue_depth", a.queue_depth, IntRange{1, 1024});
    r.alias("intra_op_parallelism", "thread_count");  // DeepSpeed renamed it; old configs say thread_count
    r.read("intra_op_parallelism", a.thread_count, IntRange{1, 64});
    r.read("single_submit", a.single_submit);
    r.read("overlap_events", a.overlap_events);
    r.unsupported("use_gds", "GPUDirect Storage needs a GPU");
    offload::validate(a, r.path());
  });
  root.read_object("device", [&](ObjectReader& r) {
    r.read("memory_mb", cfg.device.memory_mb, IntRange{1, int64_t{1} << 30});
    // The names memory::make_backend knows.
    r.read_choice("backend", cfg.device.backend, {"cpu", "guarded"});
  });
  root.read_object("model", [&](ObjectReader& r) {
    nn::GptConfig m;
    read_model(r, m);
    cfg.model = m;
  });
  root.read_object("data", [&](ObjectReader& r) {
    r.read("path", cfg.data.path);
    uint64_t seed = 0;
    if (r.read("seed", seed)) cfg.data.seed = seed;
  });
  root.read_object("comm", [&](ObjectReader& r) { r.read("timeout_s", cfg.comm.timeout_s, RealRange::positive()); });
  root.read_object("log", [&](ObjectReader& r) {
    r.read_choice("level", cfg.log.level, {"trace", "debug", "info", "warn", "error", "off"});
    r.read("all_ranks", cfg.log.all_ranks);
  });

  // DeepSpeed sections and keys zeroshard does not implement yet: refused, never ignored.
  for (std::string_view key :
       {"amp", "activation_checkpointing", "sparse_attention", "flops_profiler", "autotuning", "elasticity",
        "pipeline", "compression_training", "data_efficiency", "curriculum_learning", "tensorboard", "wandb",
        "csv_monitor", "comms_logger", "dump_state", "checkpoint", "communication_data_type", "prescale_gradients",
        "gradient_predivide_factor", "sparse_gradients", "memory_breakdown", "zero_allow_untested_optimizer",
        "zero_force_ds_cpu_optimizer", "disable_allgather", "eigenvalue", "quantize_training", "progressive_layer_drop",
        "hybrid_engine", "nebula", "weight_quantization", "data_types", "seq_parallel_communication_data_type",
        "trace", "fp32_reduce_scatter", "graph_harvesting", "use_data_before_expert_parallel_"}) {
    root.unsupported(key, "zeroshard does not implement this DeepSpeed feature yet");
  }
  root.finish();
  if (cfg.zero.offload_optimizer.device != OffloadDevice::kNone) {
    if (cfg.optimizer.compressed()) {
      throw ConfigError(fmt::format("zero_optimization.offload_optimizer: {} keeps whole-model momentum and error buffers "
                                    "beside the sharded states, and zeroshard does not offload those yet; use {} "
                                    "with offload, or remove offload_optimizer",
                                    cfg.optimizer.name(), optim::optimizer_type_list(/*elementwise_only=*/true)));
    }
    if (cfg.memory.reuse_fp32_param) {
      throw ConfigError("memory.reuse_fp32_param: the master weight then lives inside the bf16 parameters on the device, "
                        "so it cannot be offloaded; set it to false or remove zero_optimization.offload_optimizer");
    }
  }
  // After finish(): a misspelled batch key is reported as unknown, with its did-you-mean.
  cfg.batch = resolve_batch(train, micro, accum, dp);
  return cfg;
}

}  // namespace zs::engine
