// Work: the handle of an asynchronous collective (like std::future<void>).
//
//   comm::Work w = group.allreduce_async(grads);   // queued on the World's comm worker
//   backward_of_next_layer();                      // overlaps with the reduction
//   w.wait();                                      // rethrows the collective's CommError, if any
//
// Thread-safety: one Work may be waited or tested from any one thread. Move-only.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

namespace zs::comm {

// The outcome of work done on another thread: ok, or the exception it raised, kept to be rethrown on
// the caller's thread (exceptions become a Status only where they cross a thread).
class Status {
 public:
  Status() = default;
  static Status from_current_exception() { return Status(std::current_exception()); }
  bool ok() const { return error_ == nullptr; }
  std::string message() const;   // "" when ok
  void rethrow_if_error() const;  // rethrows the original exception (CommError, ...)

 private:
  explicit Status(std::exception_ptr e) : error_(std::move(e)) {}
  std::exception_ptr error_;
};

namespace detail {

// Counts the threads blocked on a World's collectives (Work::wait, a sync call queued behind async
// ones, World::flush), so that the comm worker spins only while somebody waits for it and otherwise
// backs off (Note [Polling] in comm/detail/runtime.h). Thread-safe.
class WaitHint {
 public:
  void enter();                // a thread starts blocking; wakes a sleeping poller
  void leave();                // that thread stopped blocking
  bool waited() const { return waiters_.load(std::memory_order_relaxed) > 0; }
  // Sleeps up to `us` microseconds, returning early once a thread blocks.
  void sleep_unless_waited(long us);

 private:
  std::atomic<int> waiters_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

// Shared between a Work and the worker that completes it.
class WorkState {
 public:
  WorkState() = default;
  explicit WorkState(std::shared_ptr<WaitHint> hint) : hint_(std::move(hint)) {}
  void complete(Status status);
  void wait();   // blocks until complete (counted in the hint meanwhile); rethrows
  bool test();   // true when complete; rethrows
  // A simulated collective (Group::simulated): incomplete until wait() is called, which completes it
  // at once. test() says false meanwhile, as for a collective MPI has not progressed.
  void defer() { deferred_ = true; }

 private:
  std::shared_ptr<WaitHint> hint_;  // may be null
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  bool deferred_ = false;
  Status status_;
};

}  // namespace detail

class Work {
 public:
  Work() = default;  // an empty handle: complete, nothing to wait for
  explicit Work(std::shared_ptr<detail::WorkState> state, uint64_t bytes_sent = 0)
      : state_(std::move(state)), bytes_sent_(bytes_sent) {}
  Work(Work&&) noexcept = default;
  Work& operator=(Work&&) noexcept = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Blocks until the collective finished; throws its CommError (timeout, mismatch, MPI error).
  // The collective's tensors may be read or reused once wait() returns. Safe to call twice.
  void wait() const {
    if (state_) state_->wait();
  }
  // Non-blocking: true when finished (throws its error then), false while queued or running.
  bool test() const { return !state_ || state_->test(); }
  // Bytes this collective adds to CommCounters::bytes_sent (comm/config.h's rule), known when it is
  // submitted: what a caller tallies as its own share of the traffic (the engine's gradient bytes).
  uint64_t bytes_sent() const { return bytes_sent_; }

 private:
  std::shared_ptr<detail::WorkState> state_;
  uint64_t bytes_sent_ = 0;
};

}  // namespace zs::comm
