#include "offload/detail/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "core/errors.h"
#include "core/log.h"
#include "offload/detail/fs_info.h"
#include "offload/detail/ring_worker.h"

namespace zs::offload::detail {

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = o.release();
  }
  return *this;
}

void UniqueFd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

namespace {

const char* op_name(IoOp op) { return op == IoOp::kRead ? "read" : "write"; }

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::string open_hint(int err, OpenMode mode) {
  switch (err) {
    case ENOENT: return mode == OpenMode::kExisting ? "the file does not exist" : "its directory does not exist";
    case EACCES:
    case EPERM: return "check the permissions of the file and its directory";
    case EEXIST: return "a file of that name already exists and zeroshard never overwrites one: remove it";
    case EROFS: return "the file system is mounted read-only";
    default: return "check the path";
  }
}

}  // namespace

FileIo::FileIo(std::string path, const AioConfig& cfg, OpenMode mode) : path_(std::move(path)), cfg_(cfg) {
  validate(cfg_, "aio");
  int flags = O_RDWR | O_CLOEXEC;
  if (mode != OpenMode::kExisting) flags |= O_CREAT;
  if (mode == OpenMode::kCreateExclusive) flags |= O_EXCL;
  const int dfd = ::open(path_.c_str(), flags | O_DIRECT, 0600);
  int open_err = dfd < 0 ? errno : 0;
  if (dfd < 0 && open_err != EINVAL) {
    throw IoError(fmt::format("cannot open '{}' for offload I/O: {}; {}", path_,
                              zs::detail::errno_text(open_err), open_hint(open_err, mode)));
  }
  fd_direct_ = UniqueFd(dfd);
  // The buffered descriptor. After EINVAL on the direct open the file may or may not have been
  // created (the O_DIRECT check comes after creation), and an O_EXCL open would have failed with
  // EEXIST before that check if the file had existed: O_CREAT without O_EXCL is right either way.
  int bflags = O_RDWR | O_CLOEXEC;
  if (dfd < 0 && mode != OpenMode::kExisting) bflags |= O_CREAT;
  const int bfd = ::open(path_.c_str(), bflags, 0600);
  if (bfd < 0) {
    const int err = errno;
    throw IoError(fmt::format("cannot open '{}' for offload I/O: {}; {}", path_, zs::detail::errno_text(err),
                              open_hint(err, mode)));
  }
  fd_buffered_ = UniqueFd(bfd);
  if (dfd < 0) {
    direct_on_.store(false);
    warn_direct_refused("at open", open_err);
  }
  for (int i = 0; i < cfg_.thread_count; ++i) workers_.push_back(std::make_unique<RingWorker>(*this, i));
  for (auto& w : workers_) w->start();
}

FileIo::~FileIo() {
  size_t unwaited_failures = 0;
  std::string first;
  {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return live_blocks_ == 0; });
    for (auto& [id, r] : requests_) {
      if (r.failed && unwaited_failures++ == 0) first = r.error;
    }
    stopping_ = true;
  }
  for (auto& w : workers_) w->wake();
  workers_.clear();  // joins each thread, then tears its ring down
  if (unwaited_failures > 0) {
    ZS_LOG_WARN("offload: {} request(s) of '{}' failed and were never waited for; the first: {}", unwaited_failures,
                path_, first);
  }
}

void FileIo::warn_direct_refused(const std::string& when, int err) {
  if (warned_.exchange(true)) return;
  ZS_LOG_WARN(
      "offload: the {} file system holding '{}' refuses O_DIRECT ({}: {}); zeroshard falls back to buffered I/O "
      "for this file (correct, but the data goes through the page cache and uses host memory; see "
      "docs/offload.md). For direct I/O put nvme_path on a local ext4 or xfs file system.",
      fs_type_name(parent_dir(path_)), path_, when, zs::detail::errno_text(err));
}

uint64_t FileIo::submit(IoOp op, uint64_t offset, std::byte* addr, size_t len) {
  if (!io_aligned(offset) || !io_aligned(reinterpret_cast<uintptr_t>(addr))) [[unlikely]] {
    throw IoError(fmt::format("misaligned {} of {} bytes on '{}': file offset {} and buffer address {} must both be "
                              "multiples of {} (allocate buffers with offload::AlignedBuffer and place data at "
                              "4096-byte boundaries)",
                              op_name(op), len, path_, offset, fmt::ptr(addr), kIoAlignment));
  }
  if (len == 0) return 0;
  const size_t bulk = len / kIoAlignment * kIoAlignment;
  const size_t nblocks = (bulk + cfg_.block_size - 1) / cfg_.block_size + (bulk < len ? 1 : 0);
  uint64_t id = 0;
  {
    std::lock_guard lock(mu_);
    if (!fatal_.empty()) throw IoError(fmt::format("{} of {} bytes at offset {} of '{}' refused: {}", op_name(op), len,
                                                   offset, path_, fatal_));
    id = next_id_++;
    Request& r = requests_[id];
    r.op = op;
    r.offset = offset;
    r.bytes = len;
    r.blocks_left = nblocks;
    for (size_t pos = 0; pos < bulk; pos += cfg_.block_size) {
      queue_.push_back(Block{id, op, offset + pos, addr + pos, std::min(cfg_.block_size, bulk - pos)});
    }
    if (bulk < len) queue_.push_back(Block{id, op, offset + bulk, addr + bulk, len - bulk});
    live_blocks_ += nblocks;
  }
  counters.requests.fetch_add(1, std::memory_order_relaxed);
  for (auto& w : workers_) w->wake();
  return id;
}

void FileIo::wait(uint64_t id) {
  if (id == 0) return;
  Request r;
  {
    std::unique_lock lock(mu_);
    auto it = requests_.find(id);
    ZS_ASSERT(it != requests_.end(), "ticket {} of '{}' is unknown: waited for twice, consumed by wait_all, or from "
              "another file", id, path_);
    done_cv_.wait(lock, [&] { return it->second.blocks_left == 0; });  // std::map iterators stay valid
    r = std::move(it->second);
    requests_.erase(it);
  }
  if (r.failed) throw IoError(r.error);
}

void FileIo::wait_all() {
  std::vector<std::string> errors;
  {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return live_blocks_ == 0; });
    for (auto& [id, r] : requests_) {
      if (r.failed) errors.push_back(std::move(r.error));
    }
    requests_.clear();
  }
  if (errors.empty()) return;
  if (errors.size() == 1) throw IoError(errors.front());
  throw IoError(fmt::format("{} (and {} more failed request(s) on this file)", errors.front(), errors.size() - 1));
}

void FileIo::truncate(uint64_t bytes) {
  {
    std::lock_guard lock(mu_);
    ZS_ASSERT(live_blocks_ == 0, "truncate of '{}' while requests are in flight", path_);
  }
  ZS_SYS_CHECK(::ftruncate(fd_buffered_.get(), static_cast<off_t>(bytes)), "resizing '{}' to {} bytes", path_, bytes);
}

void FileIo::sync() { ZS_SYS_CHECK(::fsync(fd_buffered_.get()), "fsync of '{}'", path_); }

size_t FileIo::requests_in_flight() {
  std::lock_guard lock(mu_);
  return requests_.size();
}

uint64_t FileIo::size() const {
  struct stat st {};
  ZS_SYS_CHECK(::fstat(fd_buffered_.get(), &st), "fstat of '{}'", path_);
  return static_cast<uint64_t>(st.st_size);
}

AioStats FileIo::stats() const {
  auto get = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  return AioStats{.requests = get(counters.requests),
                  .submissions = get(counters.submissions),
                  .buffered_submissions = get(counters.buffered_submissions),
                  .short_completions = get(counters.short_completions),
                  .retries = get(counters.retries),
                  .injected_faults = get(counters.injected_faults),
                  .bytes_read = get(counters.bytes_read),
                  .bytes_written = get(counters.bytes_written)};
}

void FileIo::set_fault_plan(const FaultPlan& plan) {
  std::lock_guard lock(fault_mu_);
  plan_ = plan;
  fault_submissions_ = fault_matches_ = 0;
}

// ---- worker side ---------------------------------------------------------------------------------

bool FileIo::take_block(Block& out) {
  std::lock_guard lock(mu_);
  if (queue_.empty()) return false;
  out = queue_.front();
  queue_.pop_front();
  return true;
}

bool FileIo::stopping() {
  std::lock_guard lock(mu_);
  return stopping_;
}

FaultDecision FileIo::decide(IoOp op, size_t len) {
  FaultDecision d{.len = len};
  std::lock_guard lock(fault_mu_);
  const uint64_t n = ++fault_submissions_;
  const bool matches = plan_.fail_op == FaultOp::kAny || (plan_.fail_op == FaultOp::kRead) == (op == IoOp::kRead);
  if (plan_.fail_nth != 0 && matches && ++fault_matches_ == plan_.fail_nth) {
    d.fail_errno = plan_.fail_errno;
    counters.injected_faults.fetch_add(1, std::memory_order_relaxed);
    return d;
  }
  if (plan_.short_every != 0 && n % plan_.short_every == 0 && len > 1) {
    const uint64_t r = splitmix64(plan_.seed * 0x100000001B3ull + n);
    // Half the time a whole number of 4096-byte blocks (the remainder stays on the direct path),
    // otherwise any count (the remainder goes through the buffered descriptor).
    if (len >= 2 * kIoAlignment && (r & 1) != 0) {
      d.len = kIoAlignment * (1 + (r >> 1) % (len / kIoAlignment - 1));
    } else {
      d.len = 1 + (r >> 1) % (len - 1);
    }
    counters.injected_faults.fetch_add(1, std::memory_order_relaxed);
  }
  return d;
}

bool FileIo::inject_direct_einval() {
  std::lock_guard lock(fault_mu_);
  if (!plan_.refuse_direct) return false;
  counters.injected_faults.fetch_add(1, std::memory_order_relaxed);
  return true;
}

int FileIo::fd_for(uint64_t offset, const std::byte* addr, size_t len, bool& direct) {
  direct = direct_on_.load(std::memory_order_relaxed) && fd_direct_.get() >= 0 && io_aligned(offset) &&
           io_aligned(reinterpret_cast<uintptr_t>(addr)) && io_aligned(len);
  return direct ? fd_direct_.get() : fd_buffered_.get();
}

bool FileIo::refuse_direct(int err) {
  if (direct_proven_.load(std::memory_order_relaxed)) return false;
  if (direct_on_.exchange(false)) warn_direct_refused("at the first transfer", err);
  return true;
}

bool FileIo::request_failed(uint64_t id) {
  std::lock_guard lock(mu_);
  auto it = requests_.find(id);
  return it == requests_.end() || it->second.failed;
}

void FileIo::add_done(uint64_t id, IoOp op, size_t bytes) {
  (op == IoOp::kRead ? counters.bytes_read : counters.bytes_written).fetch_add(bytes, std::memory_order_relaxed);
  std::lock_guard lock(mu_);
  auto it = requests_.find(id);
  if (it != requests_.end()) it->second.done += bytes;
}

std::string FileIo::describe(IoOp op, uint64_t offset, size_t len) const {
  return fmt::format("{} of {} bytes at offset {} of '{}'", op_name(op), len, offset, path_);
}

void FileIo::fail_request(const Block& b, size_t sqe_len, int err) {
  std::string msg;
  size_t request_bytes = 0, request_done = 0;
  uint64_t request_offset = 0;
  {
    std::lock_guard lock(mu_);
    auto it = requests_.find(b.request);
    if (it != requests_.end()) {
      request_bytes = it->second.bytes;
      request_done = it->second.done;
      request_offset = it->second.offset;
    }
  }
  const std::string what = describe(b.op, b.offset, sqe_len);
  const std::string part = request_bytes != sqe_len
                               ? fmt::format(" (part of a {}-byte {} at offset {})", request_bytes, op_name(b.op),
                                             request_offset)
                               : std::string();
  if (err == 0 && b.op == IoOp::kRead) {
    uint64_t file_size = 0;
    struct stat st {};
    if (::fstat(fd_buffered_.get(), &st) == 0) file_size = static_cast<uint64_t>(st.st_size);
    msg = fmt::format("{}{} reached the end of the file ({} bytes): the file is shorter than the data asked for "
                      "(truncated or replaced by someone else?)", what, part, file_size);
  } else if (err == 0) {
    msg = fmt::format("{}{} failed: the file system accepted no bytes", what, part);
  } else if (err == ENOSPC || err == EDQUOT) {
    const uint64_t needed = request_bytes > request_done ? request_bytes - request_done : sqe_len;
    msg = fmt::format("{}{} failed: {}: the file system of '{}' needs {} more for this write; free space there or "
                      "point nvme_path at a directory with room",
                      what, part, zs::detail::errno_text(err), parent_dir(path_), human_bytes(needed));
  } else {
    msg = fmt::format("{}{} failed: {}", what, part, zs::detail::errno_text(err));
  }
  fail_request_message(b.request, std::move(msg));
}

void FileIo::fail_request_message(uint64_t id, std::string message) {
  std::lock_guard lock(mu_);
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second.failed) return;
  Request& r = it->second;
  r.failed = true;
  r.error = std::move(message);
  const size_t before = queue_.size();
  std::erase_if(queue_, [&](const Block& q) { return q.request == id; });
  const size_t dropped = before - queue_.size();
  r.blocks_left -= dropped;  // the caller's own block is still counted and finishes through block_done
  live_blocks_ -= dropped;
}

void FileIo::block_done(uint64_t id) {
  std::lock_guard lock(mu_);
  auto it = requests_.find(id);
  ZS_ASSERT(it != requests_.end() && it->second.blocks_left > 0, "block of unknown request {} on '{}'", id, path_);
  --live_blocks_;
  if (--it->second.blocks_left == 0) done_cv_.notify_all();
}

void FileIo::fail_everything(const std::string& message) {
  std::vector<uint64_t> ids;
  {
    std::lock_guard lock(mu_);
    fatal_ = message;
    for (auto& [id, r] : requests_) {
      if (!r.failed && r.blocks_left > 0) ids.push_back(id);
    }
  }
  for (uint64_t id : ids) fail_request_message(id, message);
  std::lock_guard lock(mu_);
  done_cv_.notify_all();
}

}  // namespace zs::offload::detail
