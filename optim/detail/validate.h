// The range checks of the hyper-parameters Adam, Lamb and Lion share, written once. Throws
// ConfigError "PATH.KEY: must be ..., got X" (PATH is the params' JSON path, e.g. "optimizer.params").
#pragma once

#include <array>
#include <optional>
#include <string>

#include "core/errors.h"

namespace zs::optim::detail {

[[noreturn]] inline void fail_param(const std::string& path, const std::string& key, const std::string& what) {
  throw ConfigError(fmt::format("{}.{}: {}", path, key, what));
}

// lr >= 0, each beta in [0, 1), eps > 0 (optimizers that have one), weight_decay >= 0.
inline void validate_hyper(double lr, const std::array<double, 2>& betas, std::optional<double> eps, double weight_decay,
                           const std::string& path) {
  if (!(lr >= 0)) fail_param(path, "lr", fmt::format("must be >= 0, got {}", lr));
  for (int i = 0; i < 2; ++i) {
    if (!(betas[i] >= 0 && betas[i] < 1)) {
      fail_param(path, fmt::format("betas[{}]", i), fmt::format("must be in [0, 1), got {}", betas[i]));
    }
  }
  if (eps && !(*eps > 0)) fail_param(path, "eps", fmt::format("must be > 0, got {}", *eps));
  if (!(weight_decay >= 0)) fail_param(path, "weight_decay", fmt::format("must be >= 0, got {}", weight_decay));
}

}  // namespace zs::optim::detail
