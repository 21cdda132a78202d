#include "comm/detail/body_watchdog.h"

#include <fmt/format.h>

#include "comm/world.h"

namespace zs::comm::detail {

BodyWatchdog::BodyWatchdog() : thread_([this] { loop(); }) {}

BodyWatchdog::~BodyWatchdog() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

BodyWatchdog::Ticket BodyWatchdog::arm(double timeout_s, std::string (*describe)(const void*), const void* subject) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  std::lock_guard lock(mu_);
  return armed_.insert(armed_.end(), Entry{deadline, timeout_s, describe, subject});
}

void BodyWatchdog::disarm(Ticket t) {
  std::lock_guard lock(mu_);
  armed_.erase(t);
}

void BodyWatchdog::loop() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(100));
    const auto now = Clock::now();
    for (const Entry& e : armed_) {
      if (now < e.deadline) continue;
      // Note [Stalled body]: nothing can unblock the thread inside MPI; end the job with the message.
      const std::string message = fmt::format(
          "{} timed out after {} s in its data exchange, after every rank of the group had joined it "
          "(comm.timeout_s + {} s): a rank stopped or failed mid-collective; ending the job",
          e.describe(e.subject), e.timeout_s, kGraceS);
      lock.unlock();
      World::abort(message, 1);
    }
  }
}

}  // namespace zs::comm::detail
