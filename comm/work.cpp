#include "comm/work.h"

#include <stdexcept>

namespace zs::comm {

std::string Status::message() const {
  if (!error_) return "";
  try {
    std::rethrow_exception(error_);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

void Status::rethrow_if_error() const {
  if (error_) std::rethrow_exception(error_);
}

namespace detail {

void WorkState::complete(Status status) {
  {
    std::lock_guard lock(mu_);
    status_ = std::move(status);
    done_ = true;
  }
  cv_.notify_all();
}

void WaitHint::enter() {
  {
    std::lock_guard lock(mu_);  // pairs with sleep_unless_waited's predicate check: no lost wake-up
    waiters_.fetch_add(1, std::memory_order_relaxed);
  }
  cv_.notify_all();
}

void WaitHint::leave() { waiters_.fetch_sub(1, std::memory_order_relaxed); }

void WaitHint::sleep_unless_waited(long us) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, std::chrono::microseconds(us), [&] { return waited(); });
}

void WorkState::wait() {
  std::unique_lock lock(mu_);
  if (deferred_) done_ = true;
  if (!done_) {
    if (hint_) hint_->enter();
    cv_.wait(lock, [&] { return done_; });
    if (hint_) hint_->leave();
  }
  status_.rethrow_if_error();
}

bool WorkState::test() {
  std::lock_guard lock(mu_);
  if (done_) status_.rethrow_if_error();
  return done_;
}

}  // namespace detail
}  // namespace zs::comm
