// AsyncFile: asynchronous reads and writes of one file on io_uring, with O_DIRECT.
//
//   AioConfig aio;                                  // DeepSpeed's "aio" section (defaults shown below)
//   validate(aio, "aio");                           // ConfigError naming the key
//   AsyncFile f("/nvme/state.bin", aio, OpenMode::kCreate);
//   AlignedBuffer buf(8 << 20);
//   Ticket w = f.write_async(0, buf.span());        // returns at once; the bytes move in the background
//   ... compute ...
//   f.wait(w);                                      // IoError (file, offset, bytes, errno text) on failure
//
// Requests. A request's file offset and buffer address must be multiples of 4096 (kIoAlignment;
// AlignedBuffer gives such buffers); otherwise it is refused at once with an IoError naming both. Its
// length may be anything: the aligned bulk goes through O_DIRECT in `block_size` pieces and a tail
// shorter than 4096 bytes through a second, buffered descriptor of the same file (the kernel keeps the
// two coherent). A request stays in flight until wait() or wait_all() returns for it; its buffer must
// stay alive and untouched until then (a read's too: the kernel writes into it).
//
// Engine. Each AsyncFile runs `thread_count` worker threads, each owning one io_uring ring. The blocks
// of all requests wait in one FIFO queue; every worker keeps up to `queue_depth` of them in flight on
// its ring, so one large request is spread over all rings and at most thread_count * queue_depth
// blocks are in flight. A completion that moved fewer bytes than asked (a short read or write) is
// resubmitted for the rest; EINTR and EAGAIN are retried; end of file during a read, a write that
// moves nothing, and every other errno fail the request: its queued blocks are dropped, its blocks in
// flight are waited for, and wait() throws. Requests never fail silently.
//
// O_DIRECT fallback. Some file systems refuse O_DIRECT (tmpfs before Linux 6.6, ramfs, some FUSE and
// network file systems): open() fails with EINVAL, or the first direct transfer does. AsyncFile then
// logs one warning naming the path, the file system type and that it continues with buffered I/O
// (through the page cache: correct, but the data passes through host memory and competes with it),
// and goes on. direct() says which mode is in use.
//
// Thread-safety: every method may be called from any thread; a Ticket must be waited for once, by
// one thread. Destruction waits for all requests still in flight (their errors are logged, not thrown).
// Move-only; a moved-from AsyncFile may only be destroyed or assigned to.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "offload/aligned_buffer.h"

namespace zs::offload {

// DeepSpeed's "aio" section. What each key does in zeroshard:
struct AioConfig {
  size_t block_size = size_t{1} << 20;  // bytes per I/O submission; multiple of 4096, 4 KiB..1 GiB
  int queue_depth = 8;                  // blocks in flight per ring, 1..1024
  int thread_count = 1;                 // rings (one worker thread each) sharing a file's blocks, 1..64
                                        // (DeepSpeed's intra_op_parallelism)
  bool single_submit = false;           // true: one io_uring_submit per block; false: one per batch
  bool overlap_events = true;           // true: refill each ring as blocks complete; false: submit a
                                        // batch of queue_depth blocks and wait for all of it
};

// Throws ConfigError naming `json_path` + "." + key, the value and the accepted range.
void validate(const AioConfig& cfg, const std::string& json_path = "aio");

enum class OpenMode {
  kExisting,         // the file must exist
  kCreate,           // created (mode 0600) if missing, kept if present
  kCreateExclusive,  // created; an existing file is an IoError (never clobbers someone's file)
};

// A request in flight. Ticket{} (id 0) is an empty ticket: waiting for it returns at once.
struct Ticket {
  uint64_t id = 0;
  bool empty() const { return id == 0; }
};

enum class FaultOp { kAny, kRead, kWrite };

// Test hook: faults injected in the real submission and completion path. Submissions are counted
// from 1 after set_fault_plan, across all rings, including resubmissions.
//   - short_every = k: every k-th submission is really issued for fewer bytes (sometimes a multiple of
//     4096, sometimes an odd count), so the completion is short and the remainder is resubmitted by
//     the normal code.
//   - fail_nth = n: the n-th submission whose op matches fail_op is issued as a no-op whose
//     completion carries -fail_errno, and goes through normal error handling (EIO, ENOSPC, ...).
//   - refuse_direct: every O_DIRECT submission completes with EINVAL (issued as a no-op), as on a
//     file system that accepts O_DIRECT at open but refuses it at the first transfer; exercises
//     the buffered fallback.
struct FaultPlan {
  uint64_t short_every = 0;
  uint64_t fail_nth = 0;
  int fail_errno = EIO;
  FaultOp fail_op = FaultOp::kAny;
  bool refuse_direct = false;
  uint64_t seed = 1;  // picks the shortened lengths
};

// Counts since the file was opened (all are counts except the byte sums).
struct AioStats {
  uint64_t requests = 0;          // read_async + write_async calls with a non-zero length
  uint64_t submissions = 0;       // SQEs for data (resubmissions included)
  uint64_t buffered_submissions = 0;  // of which went through the buffered descriptor
  uint64_t short_completions = 0; // completions that moved fewer bytes than asked
  uint64_t retries = 0;           // EINTR / EAGAIN / O_DIRECT-refused resubmissions
  uint64_t injected_faults = 0;   // shortened or failed by the FaultPlan
  uint64_t bytes_read = 0;        // byte sum
  uint64_t bytes_written = 0;     // byte sum
};

namespace detail {
class FileIo;
}

class AsyncFile {
 public:
  // Opens `path`; io_uring setup failure or an unopenable file is an IoError naming the path.
  AsyncFile(const std::string& path, const AioConfig& cfg, OpenMode mode = OpenMode::kExisting);
  AsyncFile(AsyncFile&& other) noexcept;
  AsyncFile& operator=(AsyncFile&& other) noexcept;
  AsyncFile(const AsyncFile&) = delete;
  AsyncFile& operator=(const AsyncFile&) = delete;
  ~AsyncFile();

  // Reads dst.size() bytes at `offset` into dst / writes src at `offset`. Alignment: see above.
  Ticket read_async(uint64_t offset, std::span<std::byte> dst);
  Ticket write_async(uint64_t offset, std::span<const std::byte> src);
  // Blocks until the request is complete; throws its IoError. A ticket is consumed by waiting.
  void wait(Ticket t);
  // Waits for every request in flight (consuming all tickets); throws the first failure's IoError.
  void wait_all();
  // Synchronous forms: submit and wait.
  void read(uint64_t offset, std::span<std::byte> dst) { wait(read_async(offset, dst)); }
  void write(uint64_t offset, std::span<const std::byte> src) { wait(write_async(offset, src)); }

  // Makes the file's size exactly `bytes` (ftruncate). No request may be in flight.
  void truncate(uint64_t bytes);
  // fsync: data and metadata reach the device.
  void sync();

  const std::string& path() const;
  const AioConfig& config() const;
  uint64_t size() const;            // bytes (fstat)
  bool direct() const;              // false after the O_DIRECT fallback
  AioStats stats() const;
  // Requests not yet waited for (finished or not): 0 means no ticket is outstanding.
  size_t requests_in_flight() const;
  // Replaces the fault plan (resets its submission counters). Call while no request is in flight.
  void set_fault_plan(const FaultPlan& plan);

 private:
  std::unique_ptr<detail::FileIo> io_;
};

}  // namespace zs::offload
