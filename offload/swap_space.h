// SwapSpace: one rank's NVMe swap file for offloaded model states, with 4096-aligned regions.
//
//   SwapSpace swap("/local_nvme", rank, "optimizer", SwapSpace::bytes_for({master, m, v}), aio, &tracker);
//   SwapRegion master_r = swap.allocate(master);        // 4096-aligned, reserved_bytes() rounded up
//   swap.write(master_r, 0, buf.prefix(io_align_up(master)));
//   Ticket t = swap.read_async(master_r, 0, buf.prefix(io_align_up(master)));
//   swap.wait(t);
//
// Preflight, before anything is created: nvme_path exists and is a directory; it is writable (access
// W_OK, then a real create-and-remove of a probe file named like the swap file, with ".probe", since
// root passes access() on read-only trees such as /proc); the file system has at least the bytes
// asked for, rounded up to 4096, free (statvfs f_bavail). Each failure is an IoError naming the path
// and what to do. Then the file
//     <nvme_path>/zeroshard-swap-r<rank>-<pid>-<name>.bin
// is created exclusively (never overwriting anything) and preallocated with fallocate (a file system
// without fallocate gets a sparse file instead; ENOSPC is the same clear IoError as the preflight).
//
// Cleanup: the destructor removes the file, so it is removed on normal exit and when an exception
// unwinds past its owner. A killed process (SIGKILL, OOM killer, node failure) leaves its files: they
// are named by pid so they never collide with a live run, and construction logs a warning listing
// same-named files of processes no longer running on this host (it never deletes them: on a shared
// file system the pid may belong to another node). Nothing but our own file is ever touched.
//
// Regions are carved in order from the start of the file; each starts at a multiple of 4096 and
// reserves its size rounded up to 4096, so a transfer of the rounded size stays inside the region
// (and is fully O_DIRECT). allocate() past the reserved size is an OutOfMemoryError.
// Accounting: with a tracker, the file's size is counted under (category, Tier::kNvme) while it lives.
// Thread-safety: allocate() is not thread-safe; transfers are (see AsyncFile). Not movable (regions
// point at their SwapSpace).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include "memory/category.h"
#include "memory/tracker.h"
#include "offload/aio.h"

namespace zs::offload {

class SwapSpace;

// A 4096-aligned byte range of a swap file. A value; valid while its SwapSpace lives.
struct SwapRegion {
  SwapSpace* space = nullptr;
  uint64_t offset = 0;  // bytes from the start of the file, multiple of 4096
  size_t bytes = 0;     // bytes asked for
  size_t reserved_bytes() const { return io_align_up(bytes); }
};

class SwapSpace {
 public:
  // `name`: letters, digits, '_', '-' and '.' only (it is part of the file name), else ConfigError.
  // `bytes`: what allocate() may hand out in total, counting each region rounded up (bytes_for).
  SwapSpace(const std::string& nvme_path, int rank, const std::string& name, size_t bytes, const AioConfig& aio,
            memory::MemoryTracker* tracker = nullptr, memory::Category category = memory::Category::kOptimizer);
  ~SwapSpace();
  SwapSpace(const SwapSpace&) = delete;
  SwapSpace& operator=(const SwapSpace&) = delete;

  // The reservation that holds regions of these sizes: the sum of each rounded up to 4096.
  static size_t bytes_for(std::span<const size_t> region_bytes);
  static size_t bytes_for(std::initializer_list<size_t> region_bytes) {
    return bytes_for(std::span<const size_t>(region_bytes.begin(), region_bytes.size()));
  }
  // "<nvme_path>/zeroshard-swap-r<rank>-<pid>-<name>.bin" for this process.
  static std::string file_path(const std::string& nvme_path, int rank, const std::string& name);

  SwapRegion allocate(size_t bytes);

  // Transfers within a region: `offset` from the region's start (multiple of 4096), length up to
  // the region's reserved_bytes() - offset; the buffer 4096-aligned (AsyncFile's rules).
  Ticket read_async(const SwapRegion& r, uint64_t offset, std::span<std::byte> dst);
  Ticket write_async(const SwapRegion& r, uint64_t offset, std::span<const std::byte> src);
  void read(const SwapRegion& r, uint64_t offset, std::span<std::byte> dst) { wait(read_async(r, offset, dst)); }
  void write(const SwapRegion& r, uint64_t offset, std::span<const std::byte> src) {
    wait(write_async(r, offset, src));
  }
  void wait(Ticket t) { file_.wait(t); }
  void wait_all() { file_.wait_all(); }

  AsyncFile& file() { return file_; }
  const std::string& path() const { return path_.path; }
  const std::string& name() const { return name_; }
  int rank() const { return rank_; }
  size_t capacity() const { return capacity_; }  // bytes reserved in the file (multiple of 4096)
  size_t used() const { return used_; }          // bytes handed out by allocate (rounded)

 private:
  // Removes the file when destroyed (declared first: destroyed last, after the AsyncFile closed it).
  struct FileGuard {
    std::string path;
    bool created = false;
    ~FileGuard();
  };
  // Checks nvme_path (exists, directory, writable, free space); returns `bytes`.
  static size_t preflight(const std::string& dir, const std::string& file, size_t bytes);
  // Creates and preallocates the file; runs after the preflight.
  static AsyncFile create_file(FileGuard& guard, const std::string& dir, size_t bytes, const AioConfig& aio);
  static void warn_stale_files(const std::string& dir);
  void check_range(const SwapRegion& r, uint64_t offset, size_t len, const char* what) const;

  FileGuard path_;
  std::string name_;
  int rank_ = 0;
  size_t capacity_ = 0;
  size_t used_ = 0;
  AsyncFile file_;
  memory::TrackedBytes tracked_;
};

// Removes the names of every live swap file of this process now; each file stays usable through the
// descriptors its SwapSpace opened (they never reopen it by name) and its blocks are freed when the
// process ends, even by SIGKILL. Async-signal-safe (unlink only): for a preemption signal handler,
// since the kill that follows a SIGTERM cannot be caught (launch/preemption.h).
void unlink_swap_files_now() noexcept;

}  // namespace zs::offload
