// Seconds on a steady clock: the one clock step timings and benchmarks read; and the CPU seconds
// the calling thread has run (a pass's cost where ranks share cores: pp::Pipeline's pass times) or
// the whole process has (a step's cost over all its threads).
#pragma once

#include <time.h>

#include <chrono>

namespace zs {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

inline double process_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace zs
