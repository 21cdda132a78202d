// zeroshard's pipeline parallelism: a model split into stages over the "pp" group, micro-batches
// flowing through them under Megatron-LM's schedules (all-forward-all-backward, 1F1B, interleaved).
//
//   #include "pp/pp.h"
//   comm::Topology topo(world.group(), {.pipeline_parallel_size = 2});
//   pp::GptPipeline gpt(cfg, topo.pipeline_parallel(), {.pipeline = {.schedule = pp::Schedule::kOneFOneB}});
//   gpt.materialize(seed);
//   pp::StepStats st = gpt.step(ctx, micro_batches, 1.0f / micro_batches.size());
//
// Parts: partition.h (stage boundaries by parameters, uniformly or explicitly), schedule.h (the
// schedules and the transfer order), pipeline.h (StageModel and the executor), gpt.h (the built-in GPT
// as a pipeline). docs/pipeline_parallel.md is the guide.
#pragma once

#include "pp/gpt.h"
#include "pp/partition.h"
#include "pp/pipeline.h"
#include "pp/schedule.h"
