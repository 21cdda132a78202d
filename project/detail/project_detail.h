// The projection's parts shared by its sources (internal).
#pragma once

#include <boost/json/value.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "estimate/measure.h"
#include "project/project.h"
#include "run/run_config.h"

namespace zs::project::detail {

// The config as a run of `ranks` ranks in layout `l` would read it: model.tensor_parallel_size,
// model.pipeline_parallel_size and an MoE model's model.moe.ep_size set to the layout's (ConfigError: the
// config's reason the layout is refused).
run::RunConfig layout_config(const boost::json::value& config, const Layout& l, int ranks);

// Measured compute of one rank's shapes at tensor-parallel degree tp (Note [projection model]; the
// split: project_compute.cpp): per micro-batch, the seconds and model FLOPs of one layer and of the rest
// (embeddings, head, loss); the optimizer's seconds of one layer's and the rest's parameters when one
// rank steps them all. A "layer" is `period` blocks: an MoE model's every_n_layers (one MoE block and the
// dense ones before it), 1 for a dense model. An MoE model is measured with its experts on one rank
// (model.moe.ep_size 1): under a balanced load a rank's experts process as many rows whatever the
// expert-parallel degree (E / ep experts, each fed by ep ranks), so the passes' seconds hold for every ep;
// expert_share_layer is the experts' share of a layer's parameters, which ep divides at ZeRO stage 0.
struct ComputeCost {
  double forward_layer = 0, backward_layer = 0, optimizer_layer = 0, flops_layer = 0;
  double forward_rest = 0, backward_rest = 0, optimizer_rest = 0, flops_rest = 0;
  double expert_share_layer = 0;
};
ComputeCost measure_compute(const boost::json::value& config, int tp, int64_t micro_batch, int period = 1);

// Seconds of one group's collectives of one step on one rank: each collective's latency (shared memory
// inside a host; the network's, hops times, when it crosses hosts), its bytes inside the host over the
// shared-memory bandwidth and those across hosts over the link, which the host's `link_sharers` ranks
// share. `group_hosts`: hosts the group spans.
double group_seconds(const engine::GroupStep& g, const Options& opt, int group_hosts, int link_sharers);

// One phase of a step's collectives across hosts, in the step's order (Note [the link's bucket] in
// project_compute.cpp).
struct LinkPhase {
  double busiest_bytes = 0;  // its calls' busiest member's bytes across hosts, summed (one rank's count)
  uint64_t calls = 0;
  double compute_s = 0;      // the compute its calls are spread over (interleaved), or that precedes them
  bool interleaved = false;
  // Interleaved: the pauses the compute comes in (0: one before each call). ZeRO-3's prefetch gathers a
  // pass's modules in bursts, back to back, so its calls find far fewer pauses than calls.
  double pauses = 0;
  double seconds = 0;        // in: the calls' cost (group_seconds); out: at least what the link lets through
};
// Raises each phase's seconds to the time its bytes beyond the link's bucket take at the rate, the
// host's `link_sharers` ranks sharing the link; the phases repeat every step (steady state).
void bound_by_link(std::vector<LinkPhase>& phases, const Network& net, int link_sharers);

}  // namespace zs::project::detail
