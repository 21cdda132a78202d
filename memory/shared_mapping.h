// SharedMapping: memory that other processes on this machine can map too (the cpu backend's device
// arena for the direct shared-memory collectives, Note [Direct collectives] in comm/detail/shm_direct.h).
//
//   SharedMapping mine = SharedMapping::create(bytes);              // read-write, this process's
//   // ... another process learns (getpid(), mine.fd(), mine.size()) and maps the same pages:
//   SharedMapping peer = SharedMapping::open_peer(pid, fd, bytes, error);   // read-only
//   SharedMapping both = SharedMapping::open_peer(pid, fd, bytes, error, PeerAccess::kReadWrite);
//
// Note [Shared arena memory]
// The pages come from memfd_create, not from a named file in /dev/shm (MPI_Win_allocate_shared, shm_open):
//  - no name to clean up: the memory lives while some process maps it or holds the descriptor, so a
//    rank that crashes or is killed leaves nothing behind in /dev/shm;
//  - no /dev/shm size limit (a tmpfs mount often capped well below RAM, 64 MiB in default
//    containers): it is charged like any shmem page, and untouched pages cost nothing, as with the
//    private arena;
//  - memory/ stays below comm/ (no MPI here): comm only exchanges (pid, fd, bytes) and the peers open
//    /proc/<pid>/fd/<fd>, which Linux allows a process of the same user (the check ptrace's read
//    mode makes; Yama's ptrace_scope restricts attaching only).
// Cost: shmem gets transparent huge pages only with shmem_enabled != never; the private arena here
// gets none either (THP "madvise" and the arena does not ask), so a training step is unchanged
// (docs/benchmarks.md, the issue-17 comm rows).
// Thread-safety: an immutable owner once made. Move-only.
#pragma once

#include <cstddef>
#include <string>

namespace zs::memory {

// How open_peer maps a peer's pages: read-only (a reader of the peer's tensors), or read-write (the
// direct allreduce also writes its sums into the peers' tensors: Note [Direct allreduce's writes] in
// comm/detail/shm_direct.h).
enum class PeerAccess { kReadOnly, kReadWrite };

class SharedMapping {
 public:
  SharedMapping() = default;
  // `bytes` (> 0) of zeroed, shareable memory mapped read-write, page-aligned. Throws
  // OutOfMemoryError when the OS refuses (memfd_create, ftruncate or mmap).
  static SharedMapping create(size_t bytes);
  // Maps process `pid`'s mapping behind its descriptor `fd` (read-only unless `access` says
  // otherwise). Returns an empty mapping and sets `error` (the OS's reason and the path) when it
  // cannot be opened or mapped.
  static SharedMapping open_peer(int pid, int fd, size_t bytes, std::string& error,
                                 PeerAccess access = PeerAccess::kReadOnly);
  SharedMapping(SharedMapping&& other) noexcept;
  SharedMapping& operator=(SharedMapping&& other) noexcept;
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;
  ~SharedMapping();

  void* data() const { return data_; }
  size_t size() const { return size_; }  // bytes
  int fd() const { return fd_; }         // -1 for a peer's mapping (closed once mapped)
  explicit operator bool() const { return data_ != nullptr; }

 private:
  void reset() noexcept;
  void* data_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;
};

}  // namespace zs::memory
