// Read-only file mappings for the datasets (data.cpp, token_files.cpp).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>

namespace zs::nn::detail {

// A read-only private mapping of a whole file, unmapped when its owner goes.
class MappedFile {
 public:
  MappedFile(void* addr, size_t size) : addr_(addr), size_(size) {}
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() {
    if (size_ > 0) ::munmap(addr_, size_);
  }
  const char* data() const { return static_cast<const char*>(addr_); }
  size_t size() const { return size_; }

 private:
  void* addr_;
  size_t size_;
};

// Closes a descriptor on every path out of a function.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace zs::nn::detail
