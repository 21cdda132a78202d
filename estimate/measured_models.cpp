// The built-in models as the estimator measures them: one rank's parameters over simulated groups
// (estimate/detail/measured_models.h).
#include "estimate/detail/measured_models.h"

#include "core/errors.h"
#include "moe/gpt_moe.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "run/gpt_pipeline.h"
#include "tp/gpt.h"
#include "tp/llama.h"

namespace zs::engine::detail {

namespace {

// The GPT-MoE as the estimator measures it: rank 0's experts (every rank holds as many, of the same
// shapes) over simulated groups, where the MoE layer routes a balanced load (moe/moe_layer.h).
// `ep_hosts`: the first expert-parallel group's hosts (every group of the layouts the projection takes
// has their shape: Note [expert-parallel layouts] in project/project.cpp).
struct MeasuredGptMoe {
  MeasuredGptMoe(const moe::GptMoeConfig& c, int ranks, std::vector<int> ep_hosts)
      : groups{comm::Group::simulated(0, ranks, "dp"), comm::Group::simulated(0, c.moe.ep_size, "ep", std::move(ep_hosts)),
               comm::Group::simulated(0, ranks / c.moe.ep_size, "edp")},
        model(c, &groups) {}
  comm::ExpertGroups groups;  // the model keeps a pointer: declared first, destroyed last
  moe::GptMoeModel model;
};

// The tensor-parallel GPT as the estimator measures it: tp rank 0's slices over a simulated tp group
// (every tp rank holds slices of the same sizes; the layers' collectives move nothing there).
struct MeasuredTpGpt {
  MeasuredTpGpt(const nn::GptConfig& c, const tp::TensorParallelConfig& par)
      : group(comm::Group::simulated(0, par.tensor_parallel_size, "tp")), model(c, par, &group) {}
  comm::Group group;  // the model keeps a pointer: declared first, destroyed last
  tp::GptModel model;
};

// The GPT-MoE at tp > 1: tp rank 0's slices and whole experts over simulated tp and expert groups.
struct MeasuredTpGptMoe {
  MeasuredTpGptMoe(const moe::GptMoeConfig& c, const tp::TensorParallelConfig& par, int ranks, std::vector<int> ep_hosts)
      : group(comm::Group::simulated(0, par.tensor_parallel_size, "tp")),
        groups{comm::Group::simulated(0, ranks, "dp"), comm::Group::simulated(0, c.moe.ep_size, "ep", std::move(ep_hosts)),
               comm::Group::simulated(0, ranks / c.moe.ep_size, "edp")},
        model(c, &groups, {.group = &group, .sequence_parallel = par.sequence_parallel}) {}
  comm::Group group;          // the model keeps pointers: declared first, destroyed last
  comm::ExpertGroups groups;
  moe::GptMoeModel model;
};

// The tensor-parallel LLaMA as the estimator measures it, as MeasuredTpGpt.
struct MeasuredTpLlama {
  MeasuredTpLlama(const nn::LlamaConfig& c, int tp) : group(comm::Group::simulated(0, tp, "tp")), model(c, &group) {}
  comm::Group group;
  tp::LlamaModel model;
};

// A pipeline stage of the built-in GPT as the estimator measures it: stage `stage` of a simulated "pp"
// group (tp rank 0's slices over a simulated tp group at tp > 1), built as zeroshard train builds it.
struct MeasuredPipelineStage {
  MeasuredPipelineStage(const run::RunConfig& cfg, int stage, std::vector<int> hosts)
      : pp(comm::Group::simulated(stage, cfg.pipeline.pipeline_parallel_size, "pp", std::move(hosts))),
        tp(comm::Group::simulated(0, cfg.tensor_parallel.tensor_parallel_size, "tp")),
        model(*cfg.model, pp, run::gpt_pipeline_config(cfg, &tp)) {}
  comm::Group pp;  // the model keeps pointers: declared first, destroyed last
  comm::Group tp;
  run::GptPipelineModel model;
};

}  // namespace

std::shared_ptr<nn::Model> builtin_model(const run::RunConfig& cfg, int ranks, int pipeline_stage, const HostLayout& hosts,
                                         MeasureGroups& groups) {
  if (cfg.pipeline.pipeline_parallel_size > 1) {
    auto target = std::make_shared<MeasuredPipelineStage>(cfg, pipeline_stage, hosts.pp_hosts(0, 0));
    groups.pp = &target->pp;
    if (cfg.tensor_parallel.tensor_parallel_size > 1) groups.tp = &target->tp;
    return std::shared_ptr<nn::Model>(target, &target->model);
  }
  if (cfg.tensor_parallel.tensor_parallel_size > 1 && cfg.model_moe) {
    if (ranks % cfg.model_moe->moe.ep_size != 0) {
      throw ConfigError(fmt::format("model.moe.ep_size: {} does not divide the {} data-parallel ranks estimated; "
                                    "estimate a multiple of {} ranks",
                                    cfg.model_moe->moe.ep_size, ranks,
                                    cfg.model_moe->moe.ep_size * cfg.tensor_parallel.tensor_parallel_size));
    }
    auto target = std::make_shared<MeasuredTpGptMoe>(*cfg.model_moe, cfg.tensor_parallel, ranks,
                                                     hosts.ep_hosts(cfg.model_moe->moe.ep_size));
    groups.tp = &target->group;
    groups.ep = &target->groups.ep;
    return std::shared_ptr<nn::Model>(target, &target->model);
  }
  if (cfg.tensor_parallel.tensor_parallel_size > 1) {
    auto target = std::make_shared<MeasuredTpGpt>(*cfg.model, cfg.tensor_parallel);
    groups.tp = &target->group;
    return std::shared_ptr<nn::Model>(target, &target->model);
  }
  if (!cfg.model_moe) return std::make_shared<nn::GptModel>(*cfg.model);
  const int e = cfg.model_moe->moe.ep_size;
  if (ranks % e != 0) {
    throw ConfigError(fmt::format("model.moe.ep_size: {} does not divide the {} ranks estimated; estimate a multiple of "
                                  "{} ranks",
                                  e, ranks, e));
  }
  auto target = std::make_shared<MeasuredGptMoe>(*cfg.model_moe, ranks, hosts.ep_hosts(e));
  groups.ep = &target->groups.ep;
  return std::shared_ptr<nn::Model>(target, &target->model);
}


std::shared_ptr<nn::Model> builtin_llama(const nn::LlamaConfig& c, int tp, MeasureGroups& groups) {
  if (tp == 1) return std::make_shared<nn::LlamaModel>(c);
  auto target = std::make_shared<MeasuredTpLlama>(c, tp);
  groups.tp = &target->group;
  return std::shared_ptr<nn::Model>(target, &target->model);
}

}  // namespace zs::engine::detail
