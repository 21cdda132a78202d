#include "engine/detail/deepspeed_keys.h"

namespace zs::engine::detail {

const std::vector<std::string_view>& deepspeed_keys(std::string_view section) {
  // runtime/constants.py and DeepSpeedConfig._initialize_params (runtime/config.py), plus the section
  // names other modules read from the same dict (monitor/config.py: tensorboard, wandb, csv_monitor,
  // comet; comm/config.py: comms_logger; elasticity, flops_profiler, autotuning, nebula, datastates,
  // compile, timers, tensor_parallel, expert_parallel).
  static const std::vector<std::string_view> top = {
      "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
      "managed_gradient_accumulation", "steps_per_print", "dump_state", "disable_allgather",
      "communication_data_type", "seq_parallel_communication_data_type", "seq_parallel_comm_data_type",
      "prescale_gradients", "gradient_predivide_factor", "gradient_allreduce_op", "sparse_gradients",
      "zero_optimization", "activation_checkpointing", "comms_logger", "tensorboard", "wandb", "csv_monitor",
      "comet", "gradient_clipping", "fp16", "bf16", "bfloat16", "amp", "torch_autocast",
      "compression_training", "graph_harvesting", "optimizer", "zero_allow_untested_optimizer",
      "zero_force_ds_cpu_optimizer", "scheduler", "flops_profiler", "wall_clock_breakdown", "memory_breakdown",
      "autotuning", "eigenvalue", "use_data_before_expert_parallelism", "hybrid_engine", "sparse_attention",
      "pipeline", "progressive_layer_drop", "curriculum_learning", "data_efficiency", "checkpoint",
      "data_types", "aio", "dataloader_drop_last", "log_level", "nebula", "datastates", "weight_quantization",
      "compile", "timers", "tensor_parallel", "expert_parallel", "elasticity", "vocabulary_size",
      "disable_python_gc", "sequence_parallel_size", "quantize_training"};
  // DeepSpeedZeroConfig (runtime/zero/config.py): each field and its stage3_ alias.
  static const std::vector<std::string_view> zero = {
      "stage", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size", "use_multi_rank_bucket_allreduce",
      "allgather_partitions", "allgather_bucket_size", "overlap_comm", "load_from_fp32_weights",
      "elastic_checkpoint", "offload_param", "offload_optimizer", "zenflow", "sub_group_size",
      "cpu_offload_param", "cpu_offload_use_pin_memory", "cpu_offload", "prefetch_bucket_size",
      "stage3_prefetch_bucket_size", "param_persistence_threshold", "stage3_param_persistence_threshold",
      "model_persistence_threshold", "stage3_model_persistence_threshold", "max_live_parameters",
      "stage3_max_live_parameters", "max_reuse_distance", "stage3_max_reuse_distance",
      "gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save",
      "stage3_gather_fp16_weights_on_model_save", "module_granularity_threshold",
      "stage3_module_granularity_threshold", "use_all_reduce_for_fetch_params",
      "stage3_use_all_reduce_for_fetch_params", "allgather_sequential", "stage3_allgather_sequential",
      "partition_stream_chunk_size", "stage3_partition_stream_chunk_size", "ignore_unused_parameters",
      "legacy_stage1", "round_robin_gradients", "zero_hpz_partition_size", "zero_quantized_weights",
      "zero_quantized_nontrainable_weights", "zero_quantized_gradients", "zeropp_loco_param", "mics_shard_size",
      "mics_hierarchical_params_gather", "memory_efficient_linear", "pipeline_loading_checkpoint",
      "override_module_apply", "log_trace_cache_warnings", "enable_sanity_checks",
      "save_muon_momentum_buffer_in_memory", "leaf_module",
      "sdma_allgather"};  // newer than the zero/config.py read; DeepSpeed's examples/sdma_allgather configs set it
  // DeepSpeedZeroOffloadOptimizerConfig / DeepSpeedZeroOffloadParamConfig (runtime/zero/offload_config.py).
  static const std::vector<std::string_view> offload_optimizer = {
      "device", "nvme_path", "buffer_count", "pin_memory", "pipeline_read", "pipeline_write", "fast_init", "ratio"};
  static const std::vector<std::string_view> offload_param = {"device",     "nvme_path",  "buffer_count",
                                                              "buffer_size", "max_in_cpu", "pin_memory"};
  // DeepSpeedFP16Config / DeepSpeedBF16Config (runtime/precision_config.py; constants.py for check_overflow
  // and the older fused_mode).
  static const std::vector<std::string_view> fp16 = {
      "enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
      "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads", "fused_mode"};
  static const std::vector<std::string_view> bf16 = {"enabled", "immediate_grad_update", "check_grad_overflow",
                                                     "check_overflow", "bf16_master_weights_and_grads",
                                                     "bf16_optimizer_states"};
  static const std::vector<std::string_view> optimizer = {"type", "params", "legacy_fusion"};
  static const std::vector<std::string_view> scheduler = {"type", "params"};
  // runtime/swap_tensor/aio_config.py.
  static const std::vector<std::string_view> aio = {"block_size",    "queue_depth",    "intra_op_parallelism",
                                                    "thread_count",  "single_submit",  "overlap_events",
                                                    "use_gds"};
  // runtime/config.py (checkpoint section: CHECKPOINT_TAG_VALIDATION, LOAD_UNIVERSAL_CHECKPOINT,
  // USE_NODE_LOCAL_STORAGE_CHECKPOINT, CHECKPOINT_PARALLEL_WRITE).
  static const std::vector<std::string_view> checkpoint = {"tag_validation", "load_universal", "use_node_local_storage",
                                                           "parallel_write"};
  static const std::vector<std::string_view> none;
  if (section.empty()) return top;
  if (section == "zero_optimization") return zero;
  if (section == "offload_optimizer") return offload_optimizer;
  if (section == "offload_param") return offload_param;
  if (section == "fp16") return fp16;
  if (section == "bf16") return bf16;
  if (section == "optimizer") return optimizer;
  if (section == "scheduler") return scheduler;
  if (section == "aio") return aio;
  if (section == "checkpoint") return checkpoint;
  return none;
}

}  // namespace zs::engine::detail
