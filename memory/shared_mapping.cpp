#include "memory/shared_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/errors.h"

namespace zs::memory {

SharedMapping SharedMapping::create(size_t bytes) {
  ZS_ASSERT(bytes > 0, "a zero-byte shared mapping");
  auto refused = [bytes](const char* call) {
    return OutOfMemoryError(fmt::format("the OS refused {} bytes of shareable memory ({}: {}). Fix: lower "
                                        "device.memory_mb, or set comm.shared_arena to false",
                                        bytes, call, std::strerror(errno)));
  };
  SharedMapping m;
  m.fd_ = ::memfd_create("zeroshard-arena", MFD_CLOEXEC);
  if (m.fd_ < 0) throw refused("memfd_create");
  if (::ftruncate(m.fd_, static_cast<off_t>(bytes)) != 0) throw refused("ftruncate");
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd_, 0);
  if (p == MAP_FAILED) throw refused("mmap");
  m.data_ = p;
  m.size_ = bytes;
  return m;
}

SharedMapping SharedMapping::open_peer(int pid, int fd, size_t bytes, std::string& error, PeerAccess access) {
  const std::string path = fmt::format("/proc/{}/fd/{}", pid, fd);
  const bool write = access == PeerAccess::kReadWrite;
  SharedMapping m;
  const int own = ::open(path.c_str(), (write ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (own < 0) {
    error = fmt::format("cannot open {}: {}", path, std::strerror(errno));
    return m;
  }
  void* p = ::mmap(nullptr, bytes, write ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, own, 0);
  const int mmap_errno = errno;
  ::close(own);  // the mapping keeps the pages
  if (p == MAP_FAILED) {
    error = fmt::format("cannot map {} bytes of {}: {}", bytes, path, std::strerror(mmap_errno));
    return m;
  }
  m.data_ = p;
  m.size_ = bytes;
  return m;
}

SharedMapping::SharedMapping(SharedMapping&& other) noexcept { *this = std::move(other); }

SharedMapping& SharedMapping::operator=(SharedMapping&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

SharedMapping::~SharedMapping() { reset(); }

void SharedMapping::reset() noexcept {
  if (data_ != nullptr) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
  data_ = nullptr;
  size_ = 0;
  fd_ = -1;
}

}  // namespace zs::memory
