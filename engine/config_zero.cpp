// The zero_optimization and checkpoint sections of the config (engine/detail/config_readers.h): the
// largest of parse_config's readers, apart so engine/config.cpp stays one concept long.
#include <string>
#include <string_view>

#include <boost/json/serialize.hpp>

#include "engine/detail/config_readers.h"
#include "engine/detail/deepspeed_keys.h"

namespace zs::engine::detail {

// ZeRO++ (engine/detail/zeropp_gather.h): stage 3 only, as DeepSpeed's. That the hpZ size divides the
// data-parallel size is checked where that size is known (the engine: make_hpz_groups).
void read_zeropp(ObjectReader& r, ZeroConfig& z) {
  r.read("zero_hpz_partition_size", z.zero_hpz_partition_size, IntRange{1, 1 << 20});
  r.read("zero_quantized_weights", z.zero_quantized_weights);
  r.read("zero_quantized_gradients", z.zero_quantized_gradients);
  if (z.stage == 3) {
    if (z.zero_quantized_gradients && !z.reduce_scatter) {
      throw ConfigError(fmt::format("{}: qgZ is a quantised reduce-scatter, and {} is false (an allreduce); remove one "
                                    "of the two", r.path_of("zero_quantized_gradients"), r.path_of("reduce_scatter")));
    }
    return;
  }
  for (std::string_view key : {"zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_gradients"}) {
    const bool on = key == "zero_hpz_partition_size" ? z.zero_hpz_partition_size > 1
                    : key == "zero_quantized_weights" ? z.zero_quantized_weights
                                                      : z.zero_quantized_gradients;
    if (on) {
      throw ConfigError(fmt::format("{}: ZeRO++ works on ZeRO stage 3's partitioned parameters (as DeepSpeed's); set "
                                    "zero_optimization.stage to 3 or remove the key (stage is {})",
                                    r.path_of(key), z.stage));
    }
  }
}

void read_zero(ObjectReader& r, ZeroConfig& z, Notes& notes) {
  r.known_keys(detail::deepspeed_keys("zero_optimization"), "DeepSpeed");
  r.read("stage", z.stage, IntRange{0, 3});
  r.read("overlap_comm", z.overlap_comm);
  bool contiguous = true;
  if (r.read("contiguous_gradients", contiguous) && !contiguous) {
    notes.push_back(fmt::format("{}: accepted; has no effect in zeroshard: gradients always live in contiguous flat "
                                "buffers",
                                r.path_of("contiguous_gradients")));
  }
  r.read("reduce_scatter", z.reduce_scatter);
  // DeepSpeed allows 0: its bucket is then reduced before each next gradient joins, so every bucket
  // holds one parameter, which is what plan_buckets makes of a size of 1 element.
  if (r.read("reduce_bucket_size", z.reduce_bucket_size, IntRange::non_negative()) && z.reduce_bucket_size == 0) {
    z.reduce_bucket_size = 1;
  }
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
  r.alias("stage3_max_reuse_distance", "max_reuse_distance");
  r.read("stage3_max_reuse_distance", z.stage3_max_reuse_distance, IntRange::non_negative());
  read_hint<bool>(r, "use_multi_rank_bucket_allreduce", notes, "a DeepSpeed communication tuning");
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
  const bool has_offload_optimizer = r.read_object("offload_optimizer", [&](ObjectReader& o) {
    o.known_keys(detail::deepspeed_keys("offload_optimizer"), "DeepSpeed");
    auto& c = z.offload_optimizer;
    read_device(o, c.device);
    o.read("nvme_path", c.nvme_path);
    o.read("pin_memory", c.pin_memory);
    o.read("buffer_count", c.buffer_count, IntRange{1, 64});
    o.read("fast_init", c.fast_init);
    for (std::string_view key : {"pipeline_read", "pipeline_write"}) {
      read_hint<bool>(o, key, notes,
                      "zeroshard's NVMe optimizer step always overlaps the next sub-group's read and the last one's write "
                      "with the update (docs/offload.md)");
    }
    o.unsupported("ratio", "zeroshard offloads all or none of the optimizer states");
    require_path(o, c.device, c.nvme_path);
  });
  const bool has_offload_param = r.read_object("offload_param", [&](ObjectReader& o) {
    o.known_keys(detail::deepspeed_keys("offload_param"), "DeepSpeed");
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
  // DeepSpeed's old spellings (still accepted there, with a deprecation warning): cpu_offload true is
  // offload_optimizer {device: cpu}, cpu_offload_param true is offload_param {device: cpu}, and
  // cpu_offload_use_pin_memory their pin_memory.
  auto read_old_offload = [&](std::string_view key, std::string_view new_key, bool has_new, OffloadDevice& device) {
    bool on = false;
    if (!r.read(key, on) || !on) return false;
    if (has_new) {
      throw ConfigError(fmt::format("{}: both {} (DeepSpeed's old spelling) and {} are set; keep only {}", r.path_of(key),
                                    r.path_of(key), r.path_of(new_key), r.path_of(new_key)));
    }
    device = OffloadDevice::kCpu;
    return true;
  };
  const bool old_optimizer = read_old_offload("cpu_offload", "offload_optimizer", has_offload_optimizer,
                                              z.offload_optimizer.device);
  // "cpu_offload_params" is the spelling of DeepSpeed 0.3 (ZeRO-3's first release configs use it).
  const bool old_param_plural = read_old_offload("cpu_offload_params", "offload_param", has_offload_param, z.offload_param.device);
  const bool old_param =
      read_old_offload("cpu_offload_param", "offload_param", has_offload_param, z.offload_param.device) || old_param_plural;
  bool old_pin = false;
  if (r.read("cpu_offload_use_pin_memory", old_pin)) {
    if (old_optimizer) z.offload_optimizer.pin_memory = old_pin;
    if (old_param) z.offload_param.pin_memory = old_pin;
    if (!old_optimizer && !old_param) {
      notes.push_back(fmt::format("{}: accepted; has no effect: it applies to cpu_offload and cpu_offload_param, which "
                                  "are not set (use pin_memory in offload_optimizer / offload_param)",
                                  r.path_of("cpu_offload_use_pin_memory")));
    }
  }
  if (z.offload_optimizer.device != OffloadDevice::kNone && z.stage == 0) {
    throw ConfigError(fmt::format("{}: optimizer offload needs ZeRO stage 1, 2 or 3 (the stepped partition is what moves); "
                                  "set zero_optimization.stage",
                                  r.path_of(old_optimizer ? "cpu_offload" : "offload_optimizer")));
  }
  if (z.offload_param.device != OffloadDevice::kNone && z.stage != 3) {
    // DeepSpeed reads offload_param only at stage 3 and ignores it below: so does zeroshard, saying so.
    notes.push_back(fmt::format("{}: accepted; has no effect below ZeRO stage 3 (only partitioned parameters can move; "
                                "DeepSpeed ignores it there too): parameters stay on the device at stage {}",
                                r.path_of(old_param_plural ? "cpu_offload_params" : old_param ? "cpu_offload_param" : "offload_param"),
                                z.stage));
    z.offload_param = OffloadParamConfig{};
  }
  read_zeropp(r, z);
  // Switches whose false (off) is what zeroshard does; true asks for a DeepSpeed feature it lacks.
  for (std::string_view key :
       {"memory_efficient_linear", "elastic_checkpoint", "round_robin_gradients",
        "zero_quantized_nontrainable_weights",
        "mics_hierarchical_params_gather", "legacy_stage1", "log_trace_cache_warnings", "enable_sanity_checks",
        "stage3_use_all_reduce_for_fetch_params", "use_all_reduce_for_fetch_params", "stage3_allgather_sequential",
        "allgather_sequential", "pipeline_loading_checkpoint", "sdma_allgather"}) {
    read_false_only(r, key);
  }
}

// DeepSpeed's `checkpoint` section (runtime/checkpoint_engine and runtime/config.py) plus zeroshard's
// own keys (docs/checkpoints.md).
void read_checkpoint(ObjectReader& r, CheckpointConfig& c, Notes& notes) {
  r.known_keys(detail::deepspeed_keys("checkpoint"), "DeepSpeed");
  // DeepSpeed accepts the names in any case ("Warn", "WARN", "warn").
  if (const boost::json::value* v = r.find("tag_validation")) {
    std::string text = v->is_string() ? std::string(v->as_string()) : std::string();
    std::transform(text.begin(), text.end(), text.begin(), [](unsigned char ch) { return std::tolower(ch); });
    if (text == "ignore") c.tag_validation = TagValidation::kIgnore;
    else if (text == "warn") c.tag_validation = TagValidation::kWarn;
    else if (text == "fail") c.tag_validation = TagValidation::kFail;
    else {
      throw ConfigError(fmt::format("{}: expected \"Ignore\", \"Warn\" or \"Fail\", got {}", r.path_of("tag_validation"),
                                    boost::json::serialize(*v)));
    }
  }
  bool universal = false;
  if (r.read("load_universal", universal) && universal) {
    notes.push_back(fmt::format("{}: accepted; every zeroshard checkpoint loads at any world size, ZeRO stage and "
                                "offload target directly (it is stored by parameter name), so there is no separate "
                                "universal format",
                                r.path_of("load_universal")));
  }
  bool node_local = false;
  if (r.read("use_node_local_storage", node_local) && node_local) {
    throw ConfigError(fmt::format("{}: not supported by zeroshard: a load re-slices every rank's file by parameter name "
                                  "(so it works at another world size), which needs one directory that every rank "
                                  "sees; set it to false and put checkpoint.dir on a shared filesystem",
                                  r.path_of("use_node_local_storage")));
  }
  r.read_object("parallel_write", [&](ObjectReader& p) {
    bool pipeline_stage = false;
    if (p.read("pipeline_stage", pipeline_stage) && pipeline_stage) {
      throw ConfigError(fmt::format("{}: every rank, of every pipeline stage, already writes its own file in parallel. "
                                    "Set it to false or remove it",
                                    p.path_of("pipeline_stage")));
    }
  });
  r.read("dir", c.dir);
  r.read("save_interval", c.save_interval, IntRange::non_negative());
  r.read("keep_last", c.keep_last, IntRange::non_negative());
  r.read("async", c.async);
}


}  // namespace zs::engine::detail
