// The run module: the config of a run of the `zeroshard` program (or of any program that trains the
// built-in models): the engine's keys plus the sections of the program that builds the model.
//
//   run::RunConfig cfg = run::parse_run_config(parse_json_file(path), world.size());
//   nn::GptModel model(*cfg.model);
//   engine::Engine engine(model, cfg, group);   // a RunConfig is an engine::EngineConfig
#pragma once

#include "run/gpt_pipeline.h"  // GptPipelineModel: a pipeline stage of the built-in GPT
#include "run/hf_weights.h"  // Hugging Face names, --init-from, checkpoint export
#include "run/run_config.h"  // RunConfig, DataConfig, parse_run_config
