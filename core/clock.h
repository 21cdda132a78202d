// Seconds on a steady clock: the one clock step timings and benchmarks read.
#pragma once

#include <chrono>

namespace zs {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace zs
