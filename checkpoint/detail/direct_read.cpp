#include "checkpoint/detail/direct_read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "core/errors.h"
#include "checkpoint/h5.h"

namespace zs::checkpoint::detail {

std::unique_ptr<DirectReader> DirectReader::open(hid_t dataset, hid_t mem_type, const std::filesystem::path& path,
                                                 std::string_view name) {
  h5::Handle dcpl(ZS_H5_CHECK(H5Dget_create_plist(dataset), path, fmt::format("creation properties of '{}'", name)),
                  H5Pclose);
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout != H5D_CHUNKED && layout != H5D_CONTIGUOUS) return nullptr;
  if (ZS_H5_CHECK(H5Pget_nfilters(dcpl.get()), path, fmt::format("filters of '{}'", name)) != 0) return nullptr;
  h5::Handle type(ZS_H5_CHECK(H5Dget_type(dataset), path, fmt::format("type of '{}'", name)), H5Tclose);
  if (ZS_H5_CHECK(H5Tequal(type.get(), mem_type), path, fmt::format("type of '{}'", name)) <= 0) return nullptr;
  h5::Handle space = h5::dataset_space(dataset, path, name);
  if (ZS_H5_CHECK(H5Sget_simple_extent_ndims(space.get()), path, fmt::format("rank of '{}'", name)) != 1) {
    return nullptr;
  }
  hsize_t length = 0;
  ZS_H5_CHECK(H5Sget_simple_extent_dims(space.get(), &length, nullptr), path, fmt::format("shape of '{}'", name));
  const size_t elem = H5Tget_size(mem_type);
  uint64_t chunk = std::max<uint64_t>(length, 1);
  if (layout == H5D_CHUNKED) {
    hsize_t dims = 0;
    if (ZS_H5_CHECK(H5Pget_chunk(dcpl.get(), 1, &dims), path, fmt::format("chunk of '{}'", name)) != 1 || dims == 0) {
      return nullptr;
    }
    chunk = dims;
  }
  // Small chunks stay with HDF5: the address table below holds a word per chunk.
  if (layout == H5D_CHUNKED && chunk * elem < kMinChunkBytes) return nullptr;
  std::unique_ptr<DirectReader> r(new DirectReader(dataset, chunk, elem, path, std::string(name)));
  r->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZS_SYS_CHECK(r->fd_, "open of checkpoint file '{}'", path.string());
  struct stat st {};
  ZS_SYS_CHECK(::fstat(r->fd_, &st), "stat of checkpoint file '{}'", path.string());
  r->file_bytes_ = static_cast<uint64_t>(st.st_size);
  if (layout == H5D_CONTIGUOUS) {
    const haddr_t addr = H5Dget_offset(dataset);  // HADDR_UNDEF while nothing is allocated
    H5Eclear2(H5E_DEFAULT);
    if (addr == HADDR_UNDEF) return nullptr;
    const uint64_t bytes = length * elem;
    if (addr > r->file_bytes_ || bytes > r->file_bytes_ - addr) {
      throw CheckpointError(fmt::format("checkpoint file '{}': dataset '{}' ({} bytes at {}) lies outside the file's "
                                        "{} bytes: the file is truncated or corrupt",
                                        path.string(), name, bytes, addr, r->file_bytes_));
    }
    r->address_.assign(1, addr);
  } else {
    r->address_.assign(length == 0 ? 0 : (length + chunk - 1) / chunk, kUnknown);
  }
  return r;
}

DirectReader::DirectReader(hid_t dataset, uint64_t chunk, size_t elem, std::filesystem::path path, std::string name)
    : dataset_(dataset),
      chunk_(chunk),
      elem_(elem),
      path_(std::move(path)),
      name_(std::move(name)) {}

DirectReader::~DirectReader() {
  if (fd_ >= 0) ::close(fd_);
}

uint64_t DirectReader::chunk_address(uint64_t c) {
  uint64_t& slot = address_[c];
  if (slot != kUnknown) return slot;
  hsize_t offset = c * chunk_;
  unsigned mask = 0;
  haddr_t addr = HADDR_UNDEF;
  hsize_t size = 0;
  ZS_H5_CHECK(H5Dget_chunk_info_by_coord(dataset_, &offset, &mask, &addr, &size), path_,
              fmt::format("chunk {} of '{}'", c, name_));
  if (addr == HADDR_UNDEF) return slot = kUnallocated;
  // An unfiltered chunk is stored whole, edge chunks included.
  const uint64_t bytes = chunk_ * elem_;
  if (size != bytes || addr > file_bytes_ || bytes > file_bytes_ - addr) {
    throw CheckpointError(fmt::format("checkpoint file '{}': chunk {} of dataset '{}' ({} bytes at {}, {} expected) "
                                      "lies outside the file's {} bytes: the file is truncated or corrupt",
                                      path_.string(), c, name_, size, addr, bytes, file_bytes_));
  }
  return slot = addr;
}

bool DirectReader::resolve(uint64_t start, uint64_t n) {
  if (n == 0) return true;
  const uint64_t first = start / chunk_, last = (start + n - 1) / chunk_;
  for (uint64_t c = first; c <= last; ++c) {
    if (chunk_address(c) == kUnallocated) return false;
  }
  return true;
}

bool DirectReader::read(uint64_t start, uint64_t n, std::byte* into) {
  if (n == 0) return true;
  if (!resolve(start, n)) return false;
  const uint64_t first = start / chunk_, last = (start + n - 1) / chunk_;
  // Runs of chunks that lie back to back in the file: one pread each.
  for (uint64_t c = first; c <= last;) {
    uint64_t run_end = c + 1;
    while (run_end <= last && address_[run_end] == address_[run_end - 1] + chunk_ * elem_) ++run_end;
    const uint64_t lo = std::max(start, c * chunk_), hi = std::min(start + n, run_end * chunk_);
    pread_all(address_[c] + (lo - c * chunk_) * elem_, (hi - lo) * elem_, into + (lo - start) * elem_, lo);
    c = run_end;
  }
  return true;
}

void DirectReader::pread_all(uint64_t address, size_t bytes, std::byte* into, uint64_t first_element) const {
  for (size_t done = 0; done < bytes;) {
    ssize_t got = ::pread(fd_, into + done, bytes - done, static_cast<off_t>(address + done));
    if (got == -1 && errno == EINTR) continue;
    ZS_SYS_CHECK(got, "read of checkpoint file '{}' ({} bytes at {})", path_.string(), bytes - done, address + done);
    if (got == 0) {
      throw CheckpointError(fmt::format("checkpoint file '{}': dataset '{}' element {}: the file ends at {} bytes, "
                                        "before its data: the file is truncated",
                                        path_.string(), name_, first_element + done / elem_, address + done));
    }
    done += static_cast<size_t>(got);
  }
}

}  // namespace zs::checkpoint::detail
