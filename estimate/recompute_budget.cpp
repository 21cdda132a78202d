#include "estimate/recompute_budget.h"

#include <algorithm>

#include "core/errors.h"
#include "engine/dataset_source.h"
#include "estimate/estimate.h"
#include "estimate/measure.h"
#include "nn/data.h"
#include "nn/gpt.h"

namespace zs::engine {

RecomputeChoice resolve_recompute_budget(run::RunConfig& cfg, int ranks) {
  RecomputeConfig& ac = cfg.recompute;
  RecomputeChoice choice;
  if (!ac.budget()) return choice;
  const char* key = "activation_checkpointing.device_budget_mb";
  if (cfg.model_llama) {
    throw ConfigError(fmt::format("{}: the budget chooses blocks of the built-in GPT; for model.type \"llama\" choose "
                                  "them with activation_checkpointing.checkpoint_blocks and remove device_budget_mb",
                                  key));
  }
  if (!cfg.model || cfg.model_moe) {
    throw ConfigError(fmt::format("{}: the budget chooses blocks of the built-in GPT (a `model` section without moe); "
                                  "with {} mark checkpointed modules yourself (nn::Module::set_recomputed) and "
                                  "remove device_budget_mb",
                                  key, cfg.model_moe ? "the GPT-MoE" : "your own model"));
  }
  const uint64_t arena = static_cast<uint64_t>(cfg.device.memory_mb) << 20;
  choice.applies = true;
  choice.n_layer = cfg.model->n_layer;
  choice.budget_bytes = ac.budget_auto ? arena : static_cast<uint64_t>(ac.device_budget_mb) << 20;
  if (choice.budget_bytes > arena) {
    throw ConfigError(fmt::format("{}: {} MiB exceeds the device arena (device.memory_mb = {}): a choice that fits the "
                                  "budget would still not fit the arena; lower it, raise device.memory_mb, or write "
                                  "\"auto\" (the arena)",
                                  key, ac.device_budget_mb, cfg.device.memory_mb));
  }
  // The predicted reserved peak with the first m blocks checkpointed: the largest over rank classes.
  auto peak_with = [&](int64_t m) {
    run::RunConfig c = cfg;
    c.recompute.device_budget_mb = 0;
    c.recompute.budget_auto = false;
    c.recompute.blocks = m > 0 ? RecomputeConfig::Blocks::kFirst
                                              : RecomputeConfig::Blocks::kNone;
    c.recompute.k = m;
    nn::GptModel model(*c.model);
    DatasetSource source(nn::Dataset::builtin(c.model->seq_len), c.seed);  // the shapes count, not the text
    const Measurement meas = estimate(model, c, ranks, source);
    ++choice.measurements;
    uint64_t peak = 0;
    for (const RankMeasurement& r : meas.classes) peak = std::max<uint64_t>(peak, r.memory.device_reserved_peak_bytes);
    return peak;
  };
  const int64_t L = choice.n_layer;
  choice.none_peak_bytes = peak_with(0);
  int64_t lo = 0, hi = L;  // peak(lo) > budget, peak(hi) <= budget
  uint64_t hi_peak = choice.none_peak_bytes;
  if (choice.none_peak_bytes > choice.budget_bytes) {
    choice.all_peak_bytes = hi_peak = peak_with(L);
    if (choice.all_peak_bytes > choice.budget_bytes) {
      throw ConfigError(fmt::format(
          "{}: {:.1f} MiB is below what the run needs even with every one of the {} blocks recomputed: the predicted "
          "device peak is then {:.1f} MiB ({:.1f} MiB without recompute); raise the budget (and device.memory_mb) to "
          "at least that, or lower train_micro_batch_size_per_gpu, or shard more model states (zero_optimization)",
          key, static_cast<double>(choice.budget_bytes) / (1 << 20), L,
          static_cast<double>(choice.all_peak_bytes) / (1 << 20), static_cast<double>(choice.none_peak_bytes) / (1 << 20)));
    }
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      const uint64_t p = peak_with(mid);
      if (p <= choice.budget_bytes) {
        hi = mid;
        hi_peak = p;
      } else {
        lo = mid;
      }
    }
  } else {
    hi = 0;
  }
  choice.blocks = hi;
  choice.predicted_peak_bytes = hi_peak;
  ac.device_budget_mb = 0;
  ac.budget_auto = false;
  ac.blocks = hi > 0 ? RecomputeConfig::Blocks::kFirst : RecomputeConfig::Blocks::kNone;
  ac.k = hi;
  return choice;
}

}  // namespace zs::engine
