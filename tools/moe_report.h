// The GPT-MoE's routing figures for `zeroshard train`'s progress line and summary: how balanced the
// experts are, how many routed choices were dropped for capacity, and what the all-to-all moved.
#pragma once

#include <cstdint>
#include <string>

#include <boost/json/object.hpp>

#include "comm/group.h"
#include "moe/gpt_moe.h"

namespace zs::tools {

struct MoeRouting {
  double l_aux = 0.0;             // the MoE layers' load-balancing losses summed, mean over ranks
  double dropped_fraction = 0.0;  // routed choices dropped for capacity / routed choices, all ranks
  int64_t expert_min = 0;         // tokens routed to the least / most loaded expert (layers and ranks summed)
  int64_t expert_max = 0;
  uint64_t alltoall_bytes = 0;    // bytes this rank sent in all-to-alls so far (the whole run)
};

// Collective over `dp` (every rank calls it at the same step): the figures of the last micro-batch's
// forward.
MoeRouting gather_routing(const moe::GptMoeModel& model, const comm::Group& dp);

// "l_aux 1.013 | dropped 2.1% | expert tokens min 52 max 71 | all-to-all 1.2 MiB (rank 0)"
std::string routing_line(const MoeRouting& r);

// Accumulates the per-step figures for the summary's "moe" object.
class MoeSummary {
 public:
  void record(const MoeRouting& r);
  boost::json::object json() const;

 private:
  int64_t steps_ = 0;
  double l_aux_sum_ = 0.0, dropped_sum_ = 0.0;
  int64_t min_ = 0, max_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace zs::tools
