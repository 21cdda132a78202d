// The run's config: one DeepSpeed-style JSON file (docs/config.md), of which the engine reads its
// keys (engine/config.h) and the program that builds the model reads its own sections:
//   model      the built-in model by model.type: "gpt" and "gpt2" (nn::GptConfig), "llama"
//              (nn::LlamaConfig); absent: the program brings its own model
//   model.moe  the built-in GPT with MoE layers (moe::GptMoeConfig)
//   data       the corpus, its sampling seed, evaluation and varying sequence lengths
//   log        the log level and which ranks log
// parse_run_config validates the whole document once: the engine's parser reads every section in one
// order (ProgramSection, engine/config.h), so the first problem reported, the unknown-key check and
// its did-you-mean are the same whichever part of the program reads a section.
//
//   RunConfig cfg = parse_run_config(parse_json_file(path), /*ranks=*/world.size());
//   init_logging({rank, size}, cfg.log);
//   nn::GptModel model(*cfg.model);
//   engine::Engine engine(model, cfg, group);
#pragma once

#include <boost/json/value.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "core/log.h"
#include "engine/config.h"
#include "moe/gpt_moe.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "pp/partition.h"
#include "pp/schedule.h"
#include "tp/gpt.h"
#include "tp/llama.h"

namespace zs::run {

// The `data` section.
struct DataConfig {
  // What `path` holds (nn/data.h): a text (bytes are tokens), llm.c's token shards or Megatron's
  // indexed dataset; token files need `path`.
  nn::DataFormat format = nn::DataFormat::kText;
  std::string path;          // a text file, shard(s) or a prefix; empty (text only): the built-in corpus
  std::optional<uint64_t> seed;  // sampling seed; defaults to the top-level seed
  // Evaluation by `zeroshard train` (Engine::eval_batch): every eval_interval optimizer steps (0: never)
  // the mean loss of eval_batches global batches drawn from a held-out split, the last eval_fraction
  // of the corpus's tokens, which training then never reads. Here, not at the top level: DeepSpeed's
  // config has no evaluation key (its users evaluate in their own loop), and the split is of this
  // section's corpus.
  int64_t eval_interval = 0;
  double eval_fraction = 0.1;
  int64_t eval_batches = 1;
  // Varying sequence lengths: each training step's samples have a length drawn uniformly from
  // [min_seq_len, model.seq_len] (nn::Dataset::seq_len_at); 0: every sample is model.seq_len long.
  int64_t min_seq_len = 0;
};

// Pipeline parallelism of the built-in GPT (docs/pipeline_parallel.md): model.pipeline_parallel_size
// stages (comm::Topology's "pp" group: ranks tp x dp apart), model.virtual_pipeline_size chunks per
// rank (the interleaved schedule), and the `pipeline` section.
struct PipelineRunConfig {
  int pipeline_parallel_size = 1;                   // model.pipeline_parallel_size
  int virtual_pipeline_size = 1;                    // model.virtual_pipeline_size
  pp::Schedule schedule = pp::Schedule::kOneFOneB;  // pipeline.schedule
  pp::PartitionConfig partition;                    // pipeline.partition_method, pipeline.partition_boundaries
};

// The engine's config plus the program's sections. A RunConfig is an engine::EngineConfig (the
// engine takes it as one and keeps only that part), so code that trains reads both from one value.
struct RunConfig : engine::EngineConfig {
  RunConfig() = default;
  // The engine's part alone: a run whose program brings its own model (no model, default data and
  // log). Explicit, so an EngineConfig never silently stands in where the built-in model is needed.
  explicit RunConfig(const engine::EngineConfig& e) : engine::EngineConfig(e) {}
  // model.type: "gpt" (the byte-level demo GPT, the default), "gpt2" (Hugging Face's GPT-2) or "llama".
  std::string model_type = "gpt";
  std::optional<nn::GptConfig> model;  // the built-in GPT or GPT-2 (`model` section); absent: LLaMA or the program's model
  std::optional<nn::LlamaConfig> model_llama;  // model.type "llama" (nn/llama.h)
  // `model.moe`: the built-in GPT with MoE layers (moe/gpt_moe.h); its `gpt` equals *model. The engine
  // never reads it (expert parameters reach it through parameter metadata).
  std::optional<moe::GptMoeConfig> model_moe;
  // Tensor parallelism of the built-in GPT (Megatron's names, in the `model` section): the ranks of
  // each consecutive group of tensor_parallel_size split every block's weights (tp/), and the engine
  // shards states over the data-parallel size ranks / tensor_parallel_size (comm::Topology's order).
  // model.tensor_parallel_size and model.sequence_parallel (norms and the residual stream on sequence
  // shards); validated by tp::validate.
  tp::TensorParallelConfig tensor_parallel;
  PipelineRunConfig pipeline;
  DataConfig data;
  LogConfig log;

  // A `model` section of any type (the program builds one of the built-in models).
  bool built_in_model() const;
  // The built-in model's sequence length (model.seq_len, or model.max_seq_len for gpt2 and llama).
  int64_t model_seq_len() const;
};

// Parses and validates a whole config document for a run of `ranks` processes (the engine's keys
// through engine::parse_config, the program's sections here). The batch arithmetic is over the
// data-parallel size, ranks / (model.tensor_parallel_size x model.pipeline_parallel_size). Throws ConfigError
// naming the JSON path of the first problem and how to fix it.
RunConfig parse_run_config(const boost::json::value& doc, int ranks);

}  // namespace zs::run
