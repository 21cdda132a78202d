#include "offload/detail/ring_worker.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <bit>
#include <cerrno>

#include <fmt/format.h>

#include "core/errors.h"
#include "core/log.h"

namespace zs::offload::detail {

RingWorker::RingWorker(FileIo& owner, int index)
    : owner_(owner),
      index_(index),
      queue_depth_(owner.config().queue_depth),
      single_submit_(owner.config().single_submit),
      overlap_events_(owner.config().overlap_events) {
  // One entry per data slot plus the eventfd poll; the completion queue is twice that (the default),
  // so it cannot overflow.
  const unsigned entries = std::bit_ceil(static_cast<unsigned>(queue_depth_) + 1);
  const int rc = io_uring_queue_init(entries, &ring_, 0);
  if (rc < 0) {
    throw IoError(fmt::format("cannot set up io_uring ({} entries) for '{}': {}; io_uring may be disabled "
                              "(sysctl kernel.io_uring_disabled, or a container's seccomp profile) or the "
                              "locked-memory limit too low (ulimit -l); lower aio.queue_depth or enable io_uring",
                              entries, owner.path(), zs::detail::errno_text(-rc)));
  }
  ring_ok_ = true;
  const int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (efd < 0) {
    const int err = errno;
    io_uring_queue_exit(&ring_);
    ring_ok_ = false;
    throw IoError(fmt::format("cannot create an eventfd for the I/O worker of '{}': {}", owner.path(),
                              zs::detail::errno_text(err)));
  }
  event_fd_ = UniqueFd(efd);
  slots_.resize(static_cast<size_t>(queue_depth_));
  for (int s = queue_depth_ - 1; s >= 0; --s) free_.push_back(s);
}

RingWorker::~RingWorker() {
  if (thread_.joinable()) {
    wake();
    thread_.join();
  }
  // Only the eventfd poll can still be in flight here; tearing the ring down cancels it, and a poll
  // writes nothing to our memory.
  if (ring_ok_) io_uring_queue_exit(&ring_);
}

void RingWorker::start() { thread_ = std::thread([this] { run(); }); }

void RingWorker::wake() {
  const uint64_t one = 1;
  // EAGAIN means the counter is already huge: the worker is being woken anyway.
  [[maybe_unused]] ssize_t n = ::write(event_fd_.get(), &one, sizeof one);
}

void RingWorker::run() noexcept {
  try {
    loop();
  } catch (const std::exception& e) {
    drain_after_fatal(fmt::format("the I/O worker {} of '{}' stopped: {}", index_, owner_.path(), e.what()));
  } catch (...) {
    drain_after_fatal(fmt::format("the I/O worker {} of '{}' stopped on an unknown error", index_, owner_.path()));
  }
}

void RingWorker::loop() {
  arm_wake();
  for (;;) {
    fill();
    if (in_flight_ == 0 && owner_.stopping()) return;  // an unsubmitted poll SQE is simply dropped
    io_uring_cqe* cqe = nullptr;
    if (!unsubmitted_.empty()) {
      // Submit and sleep in one system call, as a hand-written loop would.
      const int rc = io_uring_submit_and_wait(&ring_, 1);
      if (rc > 0) {
        for (int i = 0; i < rc && !unsubmitted_.empty(); ++i) unsubmitted_.pop_front();
      } else if (rc != -EINTR) {
        flush();  // the slow path: retries, or throws with the reason
      }
    } else {
      const int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) throw IoError(fmt::format("io_uring_wait_cqe: {}", zs::detail::errno_text(-rc)));
    }
    unsigned head = 0, seen = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      handle(cqe->user_data, cqe->res);
      ++seen;
    }
    io_uring_cq_advance(&ring_, seen);
    // Resubmissions prepared above go out with the next fill, in the same system call.
  }
}

void RingWorker::fill() {
  // overlap_events=false: a new batch starts only when the previous one has fully completed.
  if (!overlap_events_ && in_flight_ > 0) return;
  while (in_flight_ < queue_depth_) {
    Block b;
    if (!owner_.take_block(b)) return;
    const int s = free_.back();
    free_.pop_back();
    slots_[static_cast<size_t>(s)] = Slot{.block = b};
    ++in_flight_;
    prepare(s);
  }
}

void RingWorker::prepare(int s) {
  Slot& sl = slots_[static_cast<size_t>(s)];
  const Block& b = sl.block;
  const FaultDecision d = owner_.decide(b.op, b.len);
  sl.sqe_len = d.len;
  sl.injected_errno = d.fail_errno;
  const int fd = owner_.fd_for(b.offset, b.addr, d.len, sl.direct);
  if (sl.injected_errno == 0 && sl.direct && owner_.inject_direct_einval()) sl.injected_errno = EINVAL;
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  // Cannot be null: at most queue_depth + 1 SQEs are ever outstanding and the ring has that many.
  ZS_ASSERT(sqe != nullptr, "io_uring submission queue of '{}' full", owner_.path());
  if (sl.injected_errno != 0) {
    io_uring_prep_nop(sqe);
  } else if (b.op == IoOp::kRead) {
    io_uring_prep_read(sqe, fd, b.addr, static_cast<unsigned>(d.len), b.offset);
  } else {
    io_uring_prep_write(sqe, fd, b.addr, static_cast<unsigned>(d.len), b.offset);
  }
  sqe->user_data = static_cast<uint64_t>(s);
  owner_.counters.submissions.fetch_add(1, std::memory_order_relaxed);
  if (!sl.direct) owner_.counters.buffered_submissions.fetch_add(1, std::memory_order_relaxed);
  unsubmitted_.push_back(s);
  if (single_submit_) flush();
}

void RingWorker::arm_wake() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  ZS_ASSERT(sqe != nullptr, "io_uring submission queue of '{}' full", owner_.path());
  io_uring_prep_poll_add(sqe, event_fd_.get(), POLLIN);
  sqe->user_data = kWakeTag;
  unsubmitted_.push_back(kWakeSlot);
}

void RingWorker::flush() {
  int busy_spins = 0;
  while (!unsubmitted_.empty()) {
    const int rc = io_uring_submit(&ring_);
    if (rc > 0) {
      for (int i = 0; i < rc && !unsubmitted_.empty(); ++i) unsubmitted_.pop_front();
      continue;
    }
    if (rc == -EINTR) continue;
    if ((rc == 0 || rc == -EAGAIN || rc == -EBUSY) && ++busy_spins < 100000) {
      // The kernel is short of resources for a moment; completions already queued will free them.
      std::this_thread::yield();
      continue;
    }
    throw IoError(fmt::format("io_uring_submit: {}", rc < 0 ? zs::detail::errno_text(-rc) : "no progress"));
  }
}

void RingWorker::handle(uint64_t tag, int res) {
  if (tag == kWakeTag) {
    uint64_t value = 0;
    [[maybe_unused]] ssize_t n = ::read(event_fd_.get(), &value, sizeof value);  // resets the counter
    arm_wake();
    return;
  }
  const int s = static_cast<int>(tag);
  Slot& sl = slots_[static_cast<size_t>(s)];
  Block& b = sl.block;
  if (sl.injected_errno != 0) res = -sl.injected_errno;
  if (res < 0) {
    const int err = -res;
    if (owner_.request_failed(b.request)) return finish(s);
    if (err == EINTR || err == EAGAIN) {
      owner_.counters.retries.fetch_add(1, std::memory_order_relaxed);
      return prepare(s);
    }
    if (err == EINVAL && sl.direct && owner_.refuse_direct(err)) {
      owner_.counters.retries.fetch_add(1, std::memory_order_relaxed);
      return prepare(s);  // now through the buffered descriptor
    }
    owner_.fail_request(b, sl.sqe_len, err);
    return finish(s);
  }
  if (res == 0) {
    // A read at or past the end of the file, or a write the file system would not take: retrying
    // would spin forever.
    owner_.fail_request(b, sl.sqe_len, 0);
    return finish(s);
  }
  if (sl.direct) owner_.mark_direct_proven();
  const auto moved = static_cast<size_t>(res);
  owner_.add_done(b.request, b.op, moved);
  if (moved < b.len) owner_.counters.short_completions.fetch_add(1, std::memory_order_relaxed);
  b.offset += moved;
  b.addr += moved;
  b.len -= moved;
  if (b.len == 0 || owner_.request_failed(b.request)) return finish(s);
  prepare(s);  // the rest of a short transfer
}

void RingWorker::finish(int s) {
  const uint64_t id = slots_[static_cast<size_t>(s)].block.request;
  free_.push_back(s);
  --in_flight_;
  owner_.block_done(id);
}

void RingWorker::drain_after_fatal(const std::string& message) noexcept {
  try {
    ZS_LOG_ERROR("offload: {}", message);
    owner_.fail_everything(message);
    // SQEs still in the submission queue never reach the kernel (we submit nothing more): release
    // their slots now. The others are in the kernel's hands: wait for each completion before
    // letting go of the request (its buffer may be freed as soon as wait() returns).
    for (int s : unsubmitted_) {
      if (s != kWakeSlot) finish(s);
    }
    unsubmitted_.clear();
    while (in_flight_ > 0) {
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) break;  // the ring itself is gone: nothing more will complete
      const uint64_t tag = cqe->user_data;
      io_uring_cqe_seen(&ring_, cqe);
      if (tag != kWakeTag) finish(static_cast<int>(tag));
    }
  } catch (...) {
    // Nothing more can be done on this thread; requests were already failed above.
  }
}

}  // namespace zs::offload::detail
