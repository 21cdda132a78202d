// Note [Contended cores] in comm/detail/contention.h.
#include "comm/detail/contention.h"

#include <time.h>

namespace zs::comm::detail {

std::chrono::nanoseconds thread_cpu_time() {
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return std::chrono::nanoseconds(-1);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

bool SpinProbe::probe(Clock::time_point now) {
  const std::chrono::nanoseconds cpu = thread_cpu_time();
  next_ = now + kContentionWindow;
  if (cpu.count() < 0) [[unlikely]] return false;  // no per-thread clock: never judged contended
  if (cpu0_.count() >= 0) contended_ = preempted(cpu - cpu0_, now - wall0_);
  // Each window is judged on its own: a wait that ran well for 10 ms and is then preempted notices
  // within about one window.
  cpu0_ = cpu;
  wall0_ = now;
  return contended_;
}

}  // namespace zs::comm::detail
