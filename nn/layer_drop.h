// Progressive layer drop (DeepSpeed's `progressive_layer_drop`; Zhang & He 2020, "Accelerating
// Training of Transformer-Based Language Models with Progressive Layer Dropping"): while training,
// each transformer block is skipped (its residual stream passes through unchanged) with a probability
// that grows along the run and with depth:
//   theta(t) = (1 - theta) exp(-gamma t) + theta          (DeepSpeed's ProgressiveLayerDrop, t = optimizer step)
//   block i of L (0-based) kept with probability 1 - (i + 1) / L (1 - theta(t))
// so every block runs at step 0, the first block almost always, the last with probability theta(t).
// Kept blocks are not rescaled (as DeepSpeed's BERT example). Evaluation runs every block.
//
// The draw is a counter-based hash of (seed, step, block): every rank, every micro-batch of a step
// and a recomputed forward agree, so a run drops the same blocks whatever the world size, tensor
// parallelism or accumulation. A skipped block still passes through the Context's hooks
// (Context::skip_forward), so ZeRO-3's recorded module order and the gradient buckets see every module
// each step; its parameters get a zero gradient for the step.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "nn/context.h"
#include "nn/module.h"

namespace zs::nn {

struct ProgressiveLayerDrop {
  bool enabled = false;
  double theta = 1.0;    // DeepSpeed's default: the keep probability's floor (1: nothing is dropped)
  double gamma = 0.001;  // DeepSpeed's default: how fast theta(t) falls from 1 to theta
  uint64_t seed = 0;     // the run's seed (not a DeepSpeed key)

  double theta_at(int64_t step) const {
    return (1.0 - theta) * std::exp(-gamma * static_cast<double>(step)) + theta;
  }
  double keep_probability(int64_t block, int64_t n_blocks, int64_t step) const {
    return 1.0 - static_cast<double>(block + 1) / static_cast<double>(n_blocks) * (1.0 - theta_at(step));
  }
  // Whether block `block` of n_blocks runs in training step `step`.
  bool keeps(int64_t block, int64_t n_blocks, int64_t step) const {
    if (!enabled) return true;
    uint64_t x = seed ^ (static_cast<uint64_t>(step) * 0x9e3779b97f4a7c15ULL) ^
                 (static_cast<uint64_t>(block) * 0xc2b2ae3d27d4eb4fULL);
    for (int i = 0; i < 2; ++i) {  // splitmix64's finaliser, twice
      x += 0x9e3779b97f4a7c15ULL;
      x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
      x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
      x ^= x >> 31;
    }
    const double u = static_cast<double>(x >> 11) * 0x1.0p-53;  // uniform in [0, 1)
    return u < keep_probability(block, n_blocks, step);
  }
};

// Before a forward: marks each of `blocks`' children (of type BlockT, with set_dropped) dropped or
// kept for this pass - all kept outside training or with `pld` off.
template <typename BlockT>
void mark_dropped_blocks(Module& blocks, const ProgressiveLayerDrop& pld, const Context& ctx) {
  const std::vector<Module*> children = blocks.children();
  const auto n = static_cast<int64_t>(children.size());
  for (int64_t i = 0; i < n; ++i) {
    const bool dropped = pld.enabled && ctx.training() && !pld.keeps(i, n, ctx.batch_position().step);
    static_cast<BlockT&>(*children[static_cast<size_t>(i)]).set_dropped(dropped);
  }
}

}  // namespace zs::nn
