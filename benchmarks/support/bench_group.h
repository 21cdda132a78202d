// Timing across ranks for the benchmarks: a step is as slow as its slowest rank.
#pragma once

#include "comm/group.h"

namespace zs::bench {

// The largest `v` over the group's ranks (every rank gets it); `v` itself on a group of one.
// Collective: every rank calls it in the same order.
double slowest(const comm::Group& g, double v);

}  // namespace zs::bench
