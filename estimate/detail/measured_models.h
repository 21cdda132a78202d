// The built-in models as the estimator measures them (internal): one rank's parameters, declared and
// not allocated, over simulated groups that the returned model keeps alive (an aliasing shared_ptr).
#pragma once

#include <memory>

#include "estimate/measure.h"
#include "nn/llama.h"
#include "nn/model.h"
#include "run/run_config.h"

namespace zs::engine::detail {

// The config's GPT (GPT-MoE, tensor-parallel, or pipeline stage `pipeline_stage`) for one rank of
// `hosts`'s layout over `ranks` data-parallel ranks; `groups` gets the model's own simulated groups.
std::shared_ptr<nn::Model> builtin_model(const run::RunConfig& cfg, int ranks, int pipeline_stage, const HostLayout& hosts,
                                         MeasureGroups& groups);
// LLaMA at tensor-parallel degree tp (tp rank 0's slices over a simulated tp group when tp > 1).
std::shared_ptr<nn::Model> builtin_llama(const nn::LlamaConfig& c, int tp, MeasureGroups& groups);

}  // namespace zs::engine::detail
