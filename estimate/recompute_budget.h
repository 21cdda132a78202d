// Budget-driven recompute (activation_checkpointing.device_budget_mb; MindSpeed's adaptive recompute,
// done analytically): the fewest of the built-in GPT's blocks to checkpoint so the device peak the
// estimator predicts fits a budget, chosen before the engine is built.
//
//   run::RunConfig cfg = run::parse_run_config(doc, world.size());
//   RecomputeChoice c = resolve_recompute_budget(cfg, world.size());  // cfg now says "first c.blocks"
//   Engine engine(model, cfg, group);
//
// How. The first m blocks are checkpointed (for m blocks the lowest peak: their re-runs come last in
// the backward, after the later blocks' activations are freed; nn::GptRecompute::first). For each m
// tried, the engine's own code runs over the measuring backend (estimate/measure.h) as every rank
// class, and the largest reserved peak of the device arena is the prediction; the peak does not grow
// with m, so a binary search over 0..n_layer finds the fewest blocks that fit with log2(n_layer) + 2
// measurements. Deterministic: every rank computes the same choice.
#pragma once

#include <cstdint>

#include "engine/config.h"
#include "run/run_config.h"

namespace zs::engine {

struct RecomputeChoice {
  bool applies = false;           // the config had a budget
  int64_t blocks = 0;             // the first `blocks` blocks recompute (0: none needed)
  int64_t n_layer = 0;
  uint64_t budget_bytes = 0;      // device_budget_mb (or device.memory_mb for "auto"), in bytes
  uint64_t predicted_peak_bytes = 0;  // the device arena's reserved peak predicted with the choice
  uint64_t none_peak_bytes = 0;       // ...without recompute
  uint64_t all_peak_bytes = 0;        // ...with every block recomputed (0 when not measured)
  int measurements = 0;               // estimator runs made
};

// Turns cfg.recompute's device_budget_mb into checkpoint_blocks "first k" (Blocks::kFirst)
// and clears the budget; a config without a budget is left as it is (applies false). Throws
// ConfigError, before any training: without the built-in GPT (a model section without moe), when
// the budget exceeds device.memory_mb (the arena could not hold what the choice assumes), and when
// even every block recomputed predicts a peak above the budget (the message gives the peak needed).
RecomputeChoice resolve_recompute_budget(run::RunConfig& cfg, int ranks);

}  // namespace zs::engine
