// Reads of an unfiltered data dataset's elements straight from its file with pread (Note [Direct
// reads]); the reader (reader.cpp) falls back to H5Dread for anything this does not take.
//
// Note [Direct reads]: an unfiltered chunk (or a contiguous dataset's storage) holds its elements'
// bytes as the dataset's file type lays them out, at the address HDF5's chunk index gives. H5Dread of
// such data with no chunk cache does reach the caller's memory without a bounce, but every call builds
// hyperslab selections, walks the chunk index and HDF5's I/O vector machinery once per chunk, and
// reads at most one chunk per system call: a whole-checkpoint load ran at 0.68x of plain read() of the
// same bytes. Where the data dataset is 1-D, has no filter and its file type equals the memory type
// (every buffer zeroshard writes without zstd), the reader looks each chunk's address up once
// (H5Dget_chunk_info_by_coord), checks that the chunk lies inside the file (a corrupt index is a
// CheckpointError, never a read elsewhere), and preads ranges into the caller's memory, one system
// call per run of chunks that lie back to back in the file. The bytes are the ones H5Dread would copy;
// the per-block checksums (detail/checksum.h) are verified by the caller the same way after either
// path. A chunk HDF5 never allocated (it would read as the fill value) is left to H5Dread.
#pragma once

#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace zs::checkpoint::detail {

class DirectReader {
 public:
  // A reader for `dataset` (of the file at `path`, named `name` in errors) read as `mem_type`, or
  // nullptr when the dataset does not qualify (filtered, not 1-D, another type, another layout,
  // chunks under 64 KiB).
  static std::unique_ptr<DirectReader> open(hid_t dataset, hid_t mem_type, const std::filesystem::path& path,
                                            std::string_view name);
  ~DirectReader();
  DirectReader(const DirectReader&) = delete;
  DirectReader& operator=(const DirectReader&) = delete;

  // Elements [start, start + n) (inside the dataset) into `into`. False, having read nothing, when a
  // chunk of the range is not allocated: the caller reads the range through HDF5. CheckpointError
  // naming the file for a chunk outside the file or a short read (a truncated file); IoError for a
  // failing read.
  bool read(uint64_t start, uint64_t n, std::byte* into);
  // Looks up the addresses of the chunks of elements [start, start + n); false when one is not
  // allocated. After it returned true, read() of any part of that range touches no HDF5 and no
  // state of this reader, so several threads may run such reads at once (Note [Overlapped checksums]
  // in reader.cpp).
  bool resolve(uint64_t start, uint64_t n);

 private:
  DirectReader(hid_t dataset, uint64_t chunk, size_t elem, std::filesystem::path path, std::string name);
  // The file address of chunk `c`, looked up on first use; kUnallocated if HDF5 has none.
  uint64_t chunk_address(uint64_t c);
  void pread_all(uint64_t address, size_t bytes, std::byte* into, uint64_t first_element) const;

  static constexpr uint64_t kMinChunkBytes = 64u << 10;
  static constexpr uint64_t kUnknown = ~uint64_t{0};
  static constexpr uint64_t kUnallocated = ~uint64_t{0} - 1;
  int fd_ = -1;
  hid_t dataset_;     // not owned: the reader's handle outlives this
  uint64_t chunk_;    // elements per chunk (the whole length for contiguous storage)
  size_t elem_;       // bytes per element
  uint64_t file_bytes_ = 0;  // at open
  std::vector<uint64_t> address_;  // per chunk: file address, kUnknown or kUnallocated
  std::filesystem::path path_;
  std::string name_;
};

}  // namespace zs::checkpoint::detail
