#include "checkpoint/writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>

#include "core/errors.h"
#include "core/parallel.h"
#include "checkpoint/detail/checksum.h"
#include "checkpoint/detail/serialize.h"
#include "checkpoint/h5.h"
#include "checkpoint/reader.h"
#include "checkpoint/zstd_filter.h"

namespace zs::checkpoint {

namespace fs = std::filesystem;

void fsync_path(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZS_SYS_CHECK(fd, "open of '{}' for fsync", path.string());
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc == -1) {
    errno = err;
    ZS_SYS_CHECK(rc, "fsync of '{}'", path.string());
  }
}

namespace {

// Unfiltered data is written and hashed in pieces of this many bytes (Note [Write then hash]): small
// enough to stay in the CPU's cache between the kernel's copy and the hash, large enough that HDF5's
// cost per write stays small (pieces of 0.5-2 MiB measured no faster).
constexpr uint64_t kHashPieceBytes = 4u << 20;

std::string tensor_names_blob(const Layout& layout) {
  std::string out;
  for (const TensorInfo& t : layout.tensors) {
    out += t.name;
    out += '\n';
  }
  return out;
}

void write_common_attrs(hid_t file, const Metadata& meta, const fs::path& path) {
  h5::write_attr(file, "format_version", meta.version, path);
  h5::write_attr(file, "run_id", std::string_view(meta.run_id), path);
  h5::write_attr(file, "tag", std::string_view(meta.tag), path);
  h5::write_attr(file, "world_size", static_cast<int64_t>(meta.layout.world_size), path);
}

}  // namespace

struct ShardWriter::Impl {
  struct Buffer {
    h5::Handle dataset;
    size_t elem_size = 4;
    hid_t type = H5T_NATIVE_FLOAT;
    uint64_t total = 0;    // elements
    uint64_t written = 0;  // elements on disk
    uint64_t chunk = 1;    // elements per chunk
    bool checksum = false;
    // Unfiltered: every append goes straight to its place in the file, whatever its alignment
    // (Note [Direct writes]); filtered (zstd): whole chunks, the rest through `staging`.
    bool direct = false;
    uint64_t block = 1;              // elements per checksum block
    std::vector<uint64_t> sums;      // per block written (Note [Checksum blocks])
    std::vector<std::byte> staging;  // filtered: < one chunk, not yet on disk
    std::vector<std::byte> tail;     // direct: the open checksum block's bytes (< one block), to hash it whole
    // Where each segment starts: in the caller's stream (its segments end to end) and in the data,
    // which may hold a gap before it (Note [Page phase]).
    std::vector<uint64_t> seg_stream, seg_data;
    uint64_t stream_total = 0;  // elements the caller appends
    uint64_t appended = 0;      // of those, appended so far
    size_t segment = 0;         // the segment `appended` lies in
  };
  h5::Handle file;
  int hash_threads = 1;  // WriteOptions::hash_threads
  int fd = -1;  // HDF5's descriptor of the file (its default sec2 driver), for start_writeback
  uint64_t unflushed_bytes = 0;   // written since the last start_writeback
  std::map<std::string, Buffer, std::less<>> buffers;

  // Note [early writeback]: each data write asks the kernel to start writing the file's dirty pages
  // now (sync_file_range, which does not wait for them), so by finish() most of the file is on disk
  // and its fsync waits only for the last pieces and the metadata. Without it the kernel kept the
  // whole file dirty until the fsync, which then waited 35-75 ms for 37 MiB on this project's VM
  // disk (the save's latency, on the training thread when a commit waits for it). Advice only: a
  // failure here is caught by the fsync. Asked once per chunk's worth of bytes, not per write (the
  // direct path's writes include the few-byte gaps of Note [Page phase]).
  void start_writeback(uint64_t bytes, uint64_t chunk_bytes) {
    unflushed_bytes += bytes;
    if (unflushed_bytes < chunk_bytes) return;
    unflushed_bytes = 0;
#ifdef SYNC_FILE_RANGE_WRITE
    if (fd >= 0) (void)::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
#endif
  }

  // Elements [first, first + count) of the data from `data`, through H5Dwrite.
  void write_data(Buffer& b, const std::byte* data, uint64_t first, uint64_t count, const fs::path& path,
                  std::string_view name) {
    hsize_t start = first, n = count;
    h5::Handle file_space = h5::dataset_space(b.dataset.get(), path, name);
    ZS_H5_CHECK(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &n, nullptr), path,
                "select hyperslab");
    h5::Handle mem_space = h5::dataspace_simple({n});
    ZS_H5_CHECK(H5Dwrite(b.dataset.get(), b.type, mem_space.get(), file_space.get(), H5P_DEFAULT, data), path,
                fmt::format("write of buffer '{}' elements [{}, {}) ({} bytes)", name, start, start + n,
                            n * b.elem_size));
  }

  // The checksums of consecutive blocks of `data` (`count` elements; the last block may be short) into
  // `out`.
  static void hash_blocks(const Buffer& b, const std::byte* data, uint64_t count, uint64_t* out) {
    for (uint64_t e = 0; e < count; e += b.block) {
      *out++ = detail::block_checksum(data + e * b.elem_size, std::min<uint64_t>(b.block, count - e) * b.elem_size);
    }
  }

  // Filtered data: writes start on a chunk boundary (push_staged keeps them chunk-aligned), hence on a
  // checksum block's: each block's checksum is one hash of the caller's bytes.
  void write_range(Buffer& b, const std::byte* data, uint64_t count, const fs::path& path, std::string_view name) {
    ZS_ASSERT(b.written % b.chunk == 0 && b.written % b.block == 0);
    if (b.checksum) {
      const size_t at = b.sums.size();
      b.sums.resize(at + (count + b.block - 1) / b.block);
      hash_blocks(b, data, count, b.sums.data() + at);
    }
    write_data(b, data, b.written, count, path, name);
    b.written += count;
    start_writeback(count * b.elem_size, b.chunk * b.elem_size);
  }
  // Appends `bytes` to the data as stored (gaps included).
  void push(Buffer& b, const fs::path& path, std::string_view buffer, std::span<const std::byte> bytes) {
    if (b.direct) {
      push_direct(b, path, buffer, bytes);
    } else {
      push_staged(b, path, buffer, bytes);
    }
  }
  void push_staged(Buffer& b, const fs::path& path, std::string_view buffer, std::span<const std::byte> bytes);
  void push_direct(Buffer& b, const fs::path& path, std::string_view buffer, std::span<const std::byte> bytes);
};

void ShardWriter::Impl::push_staged(Buffer& b, const fs::path& path, std::string_view buffer,
                                    std::span<const std::byte> bytes) {
  const size_t chunk_bytes = b.chunk * b.elem_size;
  // Top up a partial chunk first; then whole chunks straight from the caller's memory (no copy);
  // then keep the tail. Writes stay chunk-aligned, so each chunk is filtered and written once.
  if (!b.staging.empty()) {
    size_t take = std::min(bytes.size(), chunk_bytes - b.staging.size());
    b.staging.insert(b.staging.end(), bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(take));
    bytes = bytes.subspan(take);
    if (b.staging.size() == chunk_bytes) {
      write_range(b, b.staging.data(), b.chunk, path, buffer);
      b.staging.clear();
    }
  }
  size_t whole = bytes.size() / chunk_bytes * chunk_bytes;
  if (whole > 0) {
    write_range(b, bytes.data(), whole / b.elem_size, path, buffer);
    bytes = bytes.subspan(whole);
  }
  if (!bytes.empty()) {
    b.staging.reserve(chunk_bytes);
    b.staging.insert(b.staging.end(), bytes.begin(), bytes.end());
  }
  // The last, partial chunk of the dataset.
  if (!b.staging.empty() && b.written + b.staging.size() / b.elem_size == b.total) {
    write_range(b, b.staging.data(), b.staging.size() / b.elem_size, path, buffer);
    b.staging.clear();
    b.staging.shrink_to_fit();
  }
}

// Note [Direct writes]: unfiltered data is written straight from the caller's memory at its place
// in the file, whatever its alignment to chunks: HDF5 with no chunk cache writes a partial chunk of an
// unfiltered dataset in place (the fill time is never, so nothing has to be read or filled first).
// Staging partial chunks instead (as filtered data must, so that each chunk is compressed once) copied
// about one 4 MiB chunk per segment boundary, as the gaps of Note [Page phase] and the tensors' own
// boundaries fall anywhere in a chunk: most of a save's bytes went through an extra memcpy. Only the
// checksum block that straddles two appends is copied (into `tail`, < 64 KiB) to be hashed whole.
//
// Note [Write then hash]: the whole blocks are written and hashed kHashPieceBytes at a time, each
// piece hashed right after the kernel has copied it into the page cache, so the hash reads it from the
// CPU's cache (20-40 GB/s) rather than from memory (8-12), and the source is read from memory once, as
// a plain write() reads it. Hashing all of an append before writing it read it from memory twice.
// Hashing each piece before its write (the copy then reading from cache) measured slower: the kernel's
// copy costs its page-cache side (fresh pages, stores), not its reads.
//
// With WriteOptions::hash_threads >= 2 each piece's write and hash run at once on two threads of the
// worker pool (as the reader verifies, Note [Overlapped checksums] in reader.cpp), so a save takes
// the time of its writes rather than writes plus hashes. It shows where the page cache takes writes
// fast: on a tmpfs of huge pages (plain write() at 7.4-8.8 GB/s), checkpoint_bench's save went from
// 0.67-0.74x of plain writes to 1.01-1.10x (docs/checkpoints.md, "Benchmarks"); where fresh pages are
// slow (1-2 GB/s) the writes hide the hash either way. A synchronous save passes its compute threads;
// the asynchronous writer keeps 1, leaving the other cores to the training steps.
void ShardWriter::Impl::push_direct(Buffer& b, const fs::path& path, std::string_view buffer,
                                    std::span<const std::byte> bytes) {
  const uint64_t count = bytes.size() / b.elem_size;
  if (count == 0) return;
  const uint64_t end = b.written + count;
  // What the hash takes from these bytes: first the rest of the open block (through `tail`), then
  // whole blocks straight from the caller's memory, then the start of the next block (into `tail`).
  uint64_t head = 0, whole = 0;
  if (b.checksum) {
    const uint64_t open_block = b.written % b.block;
    ZS_DEBUG_ASSERT(b.tail.size() == open_block * b.elem_size);
    if (open_block != 0) head = std::min(count, b.block - open_block);
    whole = (count - head) / b.block * b.block;
    if (end == b.total) whole = count - head;  // the last block may be short
    if (head > 0) {
      b.tail.insert(b.tail.end(), bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(head * b.elem_size));
      if (b.tail.size() == b.block * b.elem_size || end == b.total) {
        b.sums.push_back(detail::block_checksum(b.tail.data(), b.tail.size()));
        b.tail.clear();
      }
    }
  }
  // Pieces of whole blocks: piece k is written (piece 0 with the head before it, the last with the
  // rest after it), then hashed.
  const std::byte* hashed = bytes.data() + head * b.elem_size;
  const uint64_t piece = std::max<uint64_t>(1, kHashPieceBytes / (b.block * b.elem_size)) * b.block;
  const uint64_t pieces = std::max<uint64_t>(1, (whole + piece - 1) / piece);
  for (uint64_t k = 0; k < pieces; ++k) {
    const uint64_t lo = std::min(whole, k * piece), hi = std::min(whole, (k + 1) * piece);
    const uint64_t first = k == 0 ? 0 : head + lo, last = k + 1 == pieces ? count : head + hi;
    const size_t at = b.sums.size();
    b.sums.resize(at + (hi - lo + b.block - 1) / b.block);
    auto write = [&] { write_data(b, bytes.data() + first * b.elem_size, b.written + first, last - first, path, buffer); };
    auto hash = [&] { hash_blocks(b, hashed + lo * b.elem_size, hi - lo, b.sums.data() + at); };
    if (hash_threads < 2 || hi == lo) {
      write();
      hash();
      continue;
    }
    // Note [Write then hash]: the write and the hash of the piece at once, on two threads. Either
    // may take either part; HDF5 is still called by one thread at a time (one write per region).
    std::exception_ptr failed;
    parallel_for_threads(2, 2, 1, [&](int64_t c0, int64_t c1, int) {
      for (int64_t c = c0; c < c1; ++c) {
        if (c == 1) {
          hash();
          continue;
        }
        try {
          write();
        } catch (...) {
          failed = std::current_exception();
        }
      }
    });
    if (failed) std::rethrow_exception(failed);
  }
  if (b.checksum) {
    const uint64_t rest = count - head - whole;
    b.tail.insert(b.tail.end(), hashed + whole * b.elem_size, hashed + (whole + rest) * b.elem_size);
  }
  b.written = end;
  start_writeback(count * b.elem_size, b.chunk * b.elem_size);
  if (b.written == b.total) {
    b.tail.clear();
    b.tail.shrink_to_fit();
  }
}

ShardWriter::ShardWriter(const fs::path& dir, const Metadata& meta, int rank, const WriteOptions& options)
    : path_(dir / rank_file_name(rank)), impl_(std::make_unique<Impl>()) {
  const Layout& layout = meta.layout;
  layout.validate();
  if (rank < 0 || rank >= layout.world_size) {
    throw UsageError(fmt::format("ShardWriter: rank {} outside world_size {}", rank, layout.world_size));
  }
  impl_->file = h5::file_create(path_);
  impl_->hash_threads = options.hash_threads;
  hid_t f = impl_->file.get();
  if (void* handle = nullptr; H5Fget_vfd_handle(f, H5P_DEFAULT, &handle) >= 0 && handle != nullptr) {
    impl_->fd = *static_cast<int*>(handle);
  } else {
    H5Eclear2(H5E_DEFAULT);
  }
  write_common_attrs(f, meta, path_);
  h5::write_attr(f, "rank", static_cast<int64_t>(rank), path_);
  h5::write_blob(f, "tensor_names", tensor_names_blob(layout), path_);
  h5::Handle buffers = h5::group_create(f, "buffers", path_);
  for (const BufferLayout& bl : layout.buffers) {
    h5::Handle group = h5::group_create(buffers.get(), bl.name.c_str(), path_);
    h5::write_attr(group.get(), "dtype", memory::dtype_name(bl.dtype), path_);
    const bool filtered = options.compression != Compression::kNone;
    Impl::Buffer b;
    b.elem_size = memory::dtype_size(bl.dtype);
    b.type = detail::h5_type(bl.dtype);
    std::vector<uint64_t> index;
    uint64_t offset = 0;
    for (const Segment& s : bl.ranks[static_cast<size_t>(rank)]) {
      // Note [Page phase]: unfiltered data of format 2 puts each large segment's first element at a
      // data offset congruent to its tensor offset, modulo a page.
      if (meta.version >= 2 && !filtered && s.count * b.elem_size >= kPagePhaseMinBytes &&
          kPageBytes % b.elem_size == 0) {
        const uint64_t page = kPageBytes / b.elem_size;
        offset += (s.begin % page + page - offset % page) % page;
      }
      b.seg_stream.push_back(b.stream_total);
      b.seg_data.push_back(offset);
      index.insert(index.end(), {s.tensor, s.begin, s.count, offset});
      offset += s.count;
      b.stream_total += s.count;
    }
    h5::write_u64_table(group.get(), "index", index, 4, path_);
    b.total = offset;
    const uint64_t chunk_bytes = options.chunk_bytes != 0 ? options.chunk_bytes : filtered ? 64u << 10 : 4u << 20;
    b.chunk = std::clamp<uint64_t>(chunk_bytes / b.elem_size, 1, std::max<uint64_t>(offset, 1));
    hsize_t dims = offset, maxdims = H5S_UNLIMITED, chunk = b.chunk;
    h5::Handle space(ZS_H5_CHECK(H5Screate_simple(1, &dims, &maxdims), path_, "data dataspace"), H5Sclose);
    h5::Handle dcpl = h5::plist_create(H5P_DATASET_CREATE);
    ZS_H5_CHECK(H5Pset_chunk(dcpl.get(), 1, &chunk), path_, "chunk size");
    if (options.compression == Compression::kZstd) {
      unsigned level = static_cast<unsigned>(options.zstd_level);
      ZS_H5_CHECK(H5Pset_filter(dcpl.get(), kZstdFilterId, H5Z_FLAG_MANDATORY, 1, &level), path_, "zstd filter");
    }
    b.checksum = options.checksum;
    b.direct = !filtered;
    b.block = detail::checksum_block_elements(b.chunk, b.elem_size, b.total);
    if (b.checksum) h5::write_attr(group.get(), "checksum", std::string_view(detail::kChecksumAlgorithm), path_);
    // Never write fill values: every element is written by append.
    ZS_H5_CHECK(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), path_, "fill time");
    ZS_H5_CHECK(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_INCR), path_, "alloc time");
    // No chunk cache: a chunk that fits HDF5's default 1 MiB cache is copied through it (a fresh
    // buffer per chunk) instead of going straight from the caller's memory to the file.
    h5::Handle dapl = h5::plist_create(H5P_DATASET_ACCESS);
    ZS_H5_CHECK(H5Pset_chunk_cache(dapl.get(), 0, 0, 1.0), path_, "chunk cache");
    b.dataset = h5::Handle(ZS_H5_CHECK(H5Dcreate2(group.get(), "data", b.type, space.get(), H5P_DEFAULT, dcpl.get(),
                                                  dapl.get()),
                                       path_, fmt::format("create of buffer '{}'", bl.name)),
                           H5Dclose);
    impl_->buffers.emplace(bl.name, std::move(b));
  }
}

ShardWriter::~ShardWriter() {
  // Not finished: an error (or the caller's) ended this save, and its staging file will be removed.
  if (impl_ != nullptr && impl_->file.valid()) {
    impl_->buffers.clear();
    h5::discard_file(impl_->file, path_);
  }
}

void ShardWriter::append(std::string_view buffer, std::span<const std::byte> bytes) {
  auto it = impl_->buffers.find(buffer);
  if (it == impl_->buffers.end()) {
    throw UsageError(fmt::format("ShardWriter::append: no buffer '{}' in the layout", buffer));
  }
  Impl::Buffer& b = it->second;
  if (bytes.size() % b.elem_size != 0) {
    throw UsageError(fmt::format("ShardWriter::append: {} bytes is not whole {}-byte elements of '{}'", bytes.size(),
                                 b.elem_size, buffer));
  }
  if (b.appended + bytes.size() / b.elem_size > b.stream_total) {
    throw UsageError(fmt::format("ShardWriter::append: buffer '{}' of rank file '{}' holds {} elements; appended past "
                                 "its end",
                                 buffer, path_.string(), b.stream_total));
  }
  // Segment by segment, a segment's gap (zeros, Note [Page phase]) before its first element.
  static constexpr std::byte kZeros[kPageBytes] = {};
  while (!bytes.empty()) {
    while (b.segment + 1 < b.seg_stream.size() && b.seg_stream[b.segment + 1] <= b.appended) ++b.segment;
    const uint64_t at = b.written + b.staging.size() / b.elem_size;
    const uint64_t in_segment = b.appended - b.seg_stream[b.segment];
    if (in_segment == 0 && at < b.seg_data[b.segment]) {
      impl_->push(b, path_, buffer, std::span<const std::byte>(kZeros, (b.seg_data[b.segment] - at) * b.elem_size));
    }
    const uint64_t segment_end =
        b.segment + 1 < b.seg_stream.size() ? b.seg_stream[b.segment + 1] : b.stream_total;
    const size_t take = std::min<size_t>(bytes.size(), (segment_end - b.appended) * b.elem_size);
    impl_->push(b, path_, buffer, bytes.first(take));
    b.appended += take / b.elem_size;
    bytes = bytes.subspan(take);
  }
}

void ShardWriter::finish() {
  for (auto& [name, b] : impl_->buffers) {
    if (b.written != b.total || b.appended != b.stream_total) {
      throw UsageError(fmt::format("ShardWriter::finish: buffer '{}' of '{}' got {} of its {} elements", name,
                                   path_.string(), b.appended, b.stream_total));
    }
    b.dataset.close(path_, fmt::format("buffer '{}'", name));
    if (b.checksum) {
      h5::Handle group = h5::group_open(impl_->file.get(), fmt::format("buffers/{}", name).c_str(), path_);
      h5::write_u64_table(group.get(), "checksums", b.sums, 1, path_);
      h5::Handle table = h5::dataset_open(group.get(), "checksums", path_);
      h5::write_attr(table.get(), "block_elements", static_cast<int64_t>(b.block), path_);
    }
  }
  ZS_H5_CHECK(H5Fflush(impl_->file.get(), H5F_SCOPE_GLOBAL), path_, "flush");
  impl_->file.close(path_, "file");
  fsync_path(path_);
}

void write_metadata(const fs::path& dir, const Metadata& meta) {
  meta.layout.validate();
  fs::path path = dir / kMetadataFile;
  {
    h5::Handle file = h5::file_create(path);
    try {
      hid_t f = file.get();
      write_common_attrs(f, meta, path);
      int64_t saved = meta.saved_unix_ns != 0
                          ? meta.saved_unix_ns
                          : std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
      h5::write_attr(f, "saved_unix_ns", saved, path);
      h5::write_blob(f, "layout_json", detail::layout_to_json(meta.layout), path);
      h5::write_blob(f, "config_json", meta.config_json, path);
      {
        h5::Handle scalars = h5::group_create(f, "scalars", path);
        for (const auto& [key, value] : meta.scalars) {
          std::visit([&](const auto& v) { h5::write_attr(scalars.get(), key.c_str(), v, path); }, value);
        }
      }
      ZS_H5_CHECK(H5Fflush(f, H5F_SCOPE_GLOBAL), path, "flush");
    } catch (...) {
      h5::discard_file(file, path);
      throw;
    }
    file.close(path, "file");
  }
  fsync_path(path);
}

namespace {

std::string staging_prefix() { return ".staging."; }

void write_latest(const fs::path& root, std::string_view tag) {
  // Named like a staging directory: a crash before the rename leaves it where the next save's
  // begin_save clears stale staging entries, and no tool or scan takes it for a tag (tags never
  // start with '.', and the tag "latest" is refused, so it never collides with a staging directory).
  fs::path tmp = root / (staging_prefix() + std::string(kLatestFile));
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << tag;
    out.close();
    if (!out) throw IoError(fmt::format("write of '{}' ({} bytes) failed: {}", tmp.string(), tag.size(), std::strerror(errno)));
  }
  fsync_path(tmp);
  fs::rename(tmp, root / kLatestFile);
  fsync_path(root);
}

}  // namespace

fs::path begin_save(const fs::path& root, std::string_view tag, std::span<const fs::path> in_use) {
  if (tag.empty() || tag.find('/') != std::string_view::npos || tag.front() == '.' || tag == kLatestFile) {
    throw UsageError(fmt::format("checkpoint tag '{}': must be a plain, non-hidden directory name", tag));
  }
  fs::path staging = root / (staging_prefix() + std::string(tag));
  try {
    fs::create_directories(root);
    // Staging directories left by crashed saves (any tag): only one save runs at a time per root. Not
    // those a background prune is removing: two remove_all on one tree race, and the loser fails with
    // ENOENT on a file the other removed (an asynchronous save's commit, made at the next save, starts
    // that prune just before this runs).
    for (const auto& entry : fs::directory_iterator(root)) {
      const fs::path name = entry.path().filename();
      if (name.string().rfind(staging_prefix(), 0) != 0) continue;
      // By name: the root may be spelled differently from the commit's (a trailing slash).
      if (std::any_of(in_use.begin(), in_use.end(), [&](const fs::path& p) { return p.filename() == name; })) continue;
      fs::remove_all(entry.path());
    }
    fs::create_directory(staging);
  } catch (const fs::filesystem_error& e) {
    throw IoError(fmt::format("checkpoint directory '{}': cannot create the save's staging directory '{}': {}",
                              root.string(), staging.string(), e.code().message()));
  }
  return staging;
}

namespace {

void commit_save_impl(const fs::path& root, std::string_view tag, int keep_last, std::vector<fs::path>* remove_later) {
  fs::path staging = root / (staging_prefix() + std::string(tag));
  for (const auto& entry : fs::directory_iterator(staging)) fsync_path(entry.path());
  fsync_path(staging);
  fs::path final_dir = root / std::string(tag);
  fs::path replaced = root / (std::string(tag) + ".replaced");
  if (fs::exists(final_dir)) {
    fs::remove_all(replaced);
    fs::rename(final_dir, replaced);
    fsync_path(root);
  }
  fs::rename(staging, final_dir);
  fsync_path(root);
  write_latest(root, tag);
  fs::remove_all(replaced);
  if (keep_last > 0) {
    std::vector<TagInfo> tags = list_tags(root);  // oldest first
    int excess = static_cast<int>(tags.size()) - keep_last;
    for (const TagInfo& t : tags) {
      if (excess <= 0) break;
      if (t.tag == tag) continue;
      // Renamed out of sight first (one atomic step), then removed: remove_all deletes file by file,
      // so a crash inside it left a tag directory missing its metadata or rank files under the tag's
      // name (the fault trials' checkpoint scenario caught it). A crash after the rename leaves a
      // staging directory, which the next begin_save removes. With `remove_later` the caller removes
      // the renamed directory's files later (the engine, on a background thread).
      fs::path doomed = root / (staging_prefix() + "pruned." + t.tag);
      fs::remove_all(doomed);
      fs::rename(root / t.tag, doomed);
      fsync_path(root);
      if (remove_later != nullptr) {
        remove_later->push_back(doomed);
      } else {
        fs::remove_all(doomed);
      }
      --excess;
    }
  }
}

}  // namespace

void commit_save(const fs::path& root, std::string_view tag, int keep_last, std::vector<fs::path>* remove_later) {
  try {
    commit_save_impl(root, tag, keep_last, remove_later);
  } catch (const fs::filesystem_error& e) {
    throw IoError(fmt::format("checkpoint directory '{}': commit of tag '{}' failed at '{}': {}", root.string(), tag,
                              e.path1().string(), e.code().message()));
  }
}

}  // namespace zs::checkpoint
