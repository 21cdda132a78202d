// RingWorker: one thread driving one io_uring ring for a FileIo. Internal.
//
// The thread takes blocks from its FileIo while fewer than queue_depth are in flight, issues one SQE
// per block (a no-op when the fault plan fails it), and handles completions: short transfers are
// reissued for the rest, EINTR/EAGAIN retried, other errors fail the request (Note [Request life
// cycle] in offload/detail/file_io.h). It sleeps in io_uring_wait_cqe; new work wakes it through an
// eventfd polled on the ring itself (a poll, not a read, so nothing of ours is written at teardown).
// The ring and eventfd are created in the constructor (errors throw there, on the caller's thread);
// the thread runs from start() until the FileIo is stopping and nothing is in flight.
#pragma once

#include <liburing.h>

#include <cstdint>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "offload/detail/file_io.h"

namespace zs::offload::detail {

class RingWorker {
 public:
  RingWorker(FileIo& owner, int index);
  ~RingWorker();  // joins; the owner must be stopping (or the thread never started)
  RingWorker(const RingWorker&) = delete;
  RingWorker& operator=(const RingWorker&) = delete;

  void start();
  void wake();  // callable from any thread

 private:
  struct Slot {
    Block block;
    size_t sqe_len = 0;
    bool direct = false;
    int injected_errno = 0;
  };
  static constexpr uint64_t kWakeTag = ~uint64_t{0};
  static constexpr int kWakeSlot = -1;

  void run() noexcept;
  void loop();
  void fill();
  void prepare(int slot);
  void arm_wake();
  void flush();
  void handle(uint64_t tag, int res);
  void finish(int slot);
  // After a fatal ring error: fail everything, wait for SQEs the kernel already has, release the rest.
  void drain_after_fatal(const std::string& message) noexcept;

  FileIo& owner_;
  int index_;
  int queue_depth_;
  bool single_submit_;
  bool overlap_events_;
  io_uring ring_{};
  bool ring_ok_ = false;
  UniqueFd event_fd_;
  std::thread thread_;
  std::vector<Slot> slots_;
  std::vector<int> free_;
  int in_flight_ = 0;              // data slots in use
  std::deque<int> unsubmitted_;    // slots (kWakeSlot for the poll) prepared, not yet submitted, in order
};

}  // namespace zs::offload::detail
