// CompressedState: one-bit Adam's and 0/1 Adam's state beside the state owners (compressed_step.cpp,
// Note [compressed optimizers]). Internal: not installed.
#pragma once

#include <optional>

#include "comm/compressed_allreduce.h"
#include "engine/detail/model_states.h"
#include "optim/zero_one_adam.h"

namespace zs::engine {

// One-bit Adam / 0/1 Adam state (compressed_step.cpp). The momentum is whole on every rank: the
// compressed allreduce needs each rank's whole local momentum (Note [compressed optimizers]). Its
// buffers (momentum, variance, accumulator) are placed by the dense set's owner from its plan.
struct CompressedState : CompressedBuffers {
  std::optional<comm::OneBitAllreduce> reduce;
  std::optional<optim::ZeroOneSchedule> schedule;
  bool momentum_whole = false;      // the momentum outside the stepped range is valid (gathered at freeze)
  bool errors_reset = false;        // 0/1 Adam: error buffers were zeroed when the variance froze
};

}  // namespace zs::engine
