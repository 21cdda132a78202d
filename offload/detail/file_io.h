// FileIo: the engine behind AsyncFile (see offload/aio.h for the contract). Internal.
//
// Note [Request life cycle]
// A request is split into blocks (block_size pieces of the 4096-aligned bulk, then a tail shorter
// than 4096 bytes) that wait in one FIFO queue under mu_. Each RingWorker (one thread, one io_uring
// ring) takes blocks while it has fewer than queue_depth in flight and turns each into one SQE at a
// time; a short completion updates the block and issues an SQE for the rest. A request's blocks_left
// counts its blocks not yet finished (queued or in flight); it reaches 0 exactly once, and only then
// may wait() return, so no buffer is released while the kernel may still touch it. When a block
// fails, the request is marked failed, its queued blocks are dropped at once, and its blocks in
// flight finish without being resubmitted.
//
// Note [Direct and buffered descriptors]
// Two descriptors of the same file: one opened with O_DIRECT (absent when the file system refuses it
// at open) and one without. An SQE uses the direct one when O_DIRECT is on and its offset, address
// and length are all multiples of 4096, else the buffered one (request tails, remainders of odd short
// transfers). Linux keeps them coherent: a direct transfer first writes back and invalidates cached
// pages of its range. EINVAL from a direct SQE before any direct SQE has succeeded means the file
// system refuses direct I/O: O_DIRECT is turned off for the file (one warning) and the SQE reissued.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "offload/aio.h"

namespace zs::offload::detail {

enum class IoOp : uint8_t { kRead, kWrite };

// A file descriptor, closed on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset();

 private:
  int fd_ = -1;
};

struct Block {
  uint64_t request = 0;
  IoOp op = IoOp::kRead;
  uint64_t offset = 0;      // file bytes
  std::byte* addr = nullptr;
  size_t len = 0;           // bytes still to move
};

// What the fault plan does to one submission.
struct FaultDecision {
  size_t len = 0;       // bytes to issue (< the block's length when shortened)
  int fail_errno = 0;   // non-zero: issue a no-op and complete with -fail_errno
};

class RingWorker;

class FileIo {
 public:
  FileIo(std::string path, const AioConfig& cfg, OpenMode mode);
  ~FileIo();
  FileIo(const FileIo&) = delete;
  FileIo& operator=(const FileIo&) = delete;

  // Caller side (any thread).
  uint64_t submit(IoOp op, uint64_t offset, std::byte* addr, size_t len);
  void wait(uint64_t id);
  void wait_all();
  void truncate(uint64_t bytes);
  void sync();
  uint64_t size() const;
  size_t requests_in_flight();
  AioStats stats() const;
  void set_fault_plan(const FaultPlan& plan);
  const std::string& path() const { return path_; }
  const AioConfig& config() const { return cfg_; }
  bool direct() const { return direct_on_.load(); }

  // Worker side (see Note [Request life cycle]).
  bool take_block(Block& out);
  bool stopping();
  FaultDecision decide(IoOp op, size_t len);
  bool inject_direct_einval();  // FaultPlan::refuse_direct
  // fd for an SQE of (offset, addr, len); sets `direct`.
  int fd_for(uint64_t offset, const std::byte* addr, size_t len, bool& direct);
  // EINVAL on a direct SQE: true (and O_DIRECT off) when no direct SQE has succeeded yet.
  bool refuse_direct(int err);
  void mark_direct_proven() { direct_proven_.store(true, std::memory_order_relaxed); }
  bool request_failed(uint64_t id);
  void add_done(uint64_t id, IoOp op, size_t bytes);
  // Marks the request failed with `err` on the SQE (offset, len) of `b`; drops its queued blocks.
  void fail_request(const Block& b, size_t sqe_len, int err);
  void fail_request_message(uint64_t id, std::string message);
  void block_done(uint64_t id);
  // A worker can no longer run: every request fails with `message`, new ones are refused.
  void fail_everything(const std::string& message);

  struct Counters {
    std::atomic<uint64_t> requests{0}, submissions{0}, buffered_submissions{0}, short_completions{0},
        retries{0}, injected_faults{0}, bytes_read{0}, bytes_written{0};
  };
  Counters counters;

 private:
  struct Request {
    IoOp op = IoOp::kRead;
    uint64_t offset = 0;
    size_t bytes = 0;
    size_t done = 0;         // bytes moved so far
    size_t blocks_left = 0;  // queued + in flight
    bool failed = false;
    std::string error;
  };
  void warn_direct_refused(const std::string& when, int err);
  std::string describe(IoOp op, uint64_t offset, size_t len) const;

  std::string path_;
  AioConfig cfg_;
  UniqueFd fd_direct_;
  UniqueFd fd_buffered_;
  std::atomic<bool> direct_on_{true};
  std::atomic<bool> direct_proven_{false};
  std::atomic<bool> warned_{false};

  std::mutex mu_;  // guards queue_, requests_, live_blocks_, stopping_, fatal_
  std::condition_variable done_cv_;
  std::deque<Block> queue_;
  std::map<uint64_t, Request> requests_;
  uint64_t next_id_ = 1;
  size_t live_blocks_ = 0;
  bool stopping_ = false;
  std::string fatal_;

  std::mutex fault_mu_;  // guards the fault plan and its counters
  FaultPlan plan_;
  uint64_t fault_submissions_ = 0;
  uint64_t fault_matches_ = 0;

  std::vector<std::unique_ptr<RingWorker>> workers_;
};

}  // namespace zs::offload::detail
