#include "checkpoint/reader.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <list>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/errors.h"
#include "core/parallel.h"
#include "checkpoint/detail/checksum.h"
#include "checkpoint/detail/direct_read.h"
#include "checkpoint/detail/serialize.h"
#include "checkpoint/h5.h"

namespace zs::checkpoint {

namespace fs = std::filesystem;

// Where one segment of a tensor lies: rank file, element range of the tensor, offset in the data. Not
// file-local: CheckpointReader::Impl holds them, and GCC warns of a member whose type is file-local
// where this file is compiled inside a unity batch (Note [Unity build] in CMakeLists.txt).
struct Piece {
  int rank;
  uint64_t begin;
  uint64_t count;
  uint64_t offset;
};

namespace {

constexpr size_t kMaxOpenFiles = 16;
constexpr uint64_t kReadPieceBytes = 4u << 20;  // conversion staging per read call
constexpr uint64_t kHotReadBytes = 256u << 10;  // verified reads: bytes per HDF5 read, hashed at once
constexpr uint64_t kUnverifiedSubBytes = 1u << 20;  // unverified reads on two threads: bytes per claim
// Verified runs of at least this many bytes are read on two threads (Note [Overlapped checksums]).
constexpr uint64_t kOverlapMinBytes = 2u << 20;
const bool kOverlap = std::thread::hardware_concurrency() > 1;

Metadata read_metadata_file(const fs::path& dir) {
  fs::path path = dir / kMetadataFile;
  h5::Handle file = h5::file_open(path);
  hid_t f = file.get();
  Metadata meta;
  meta.version = h5::read_attr_int(f, "format_version", path);
  if (meta.version < kMinFormatVersion || meta.version > kFormatVersion) {
    throw CheckpointError(fmt::format("checkpoint file '{}': format version {}, this zeroshard reads versions {} to {}",
                                      path.string(), meta.version, kMinFormatVersion, kFormatVersion));
  }
  meta.run_id = h5::read_attr_string(f, "run_id", path);
  meta.tag = h5::read_attr_string(f, "tag", path);
  meta.saved_unix_ns = h5::read_attr_int(f, "saved_unix_ns", path);
  meta.layout = detail::layout_from_json(h5::read_blob(f, "layout_json", path), path);
  int64_t world = h5::read_attr_int(f, "world_size", path);
  if (world != meta.layout.world_size) {
    throw CheckpointError(fmt::format("checkpoint file '{}': world_size {} but the layout has {} ranks", path.string(),
                                      world, meta.layout.world_size));
  }
  meta.config_json = h5::read_blob(f, "config_json", path);
  h5::Handle scalars = h5::group_open(f, "scalars", path);
  for (const std::string& key : h5::attr_names(scalars.get(), path)) {
    switch (h5::attr_class(scalars.get(), key.c_str(), path)) {
      case H5T_INTEGER: meta.scalars[key] = h5::read_attr_int(scalars.get(), key.c_str(), path); break;
      case H5T_FLOAT: meta.scalars[key] = h5::read_attr_double(scalars.get(), key.c_str(), path); break;
      default: meta.scalars[key] = h5::read_attr_string(scalars.get(), key.c_str(), path); break;
    }
  }
  return meta;
}

}  // namespace

struct CheckpointReader::Impl {
  // One buffer's data dataset in one rank file, with its per-block checksums (Note [Checksum
  // blocks] in detail/checksum.h; empty when the file was saved without them).
  struct Data {
    h5::Handle dataset;
    uint64_t length = 0;  // elements
    uint64_t block = 1;   // elements per checksum block
    size_t elem = 4;
    hid_t type = H5T_NATIVE_FLOAT;
    std::vector<uint64_t> sums;
    std::unique_ptr<detail::DirectReader> direct;  // null: every read through H5Dread
  };
  struct OpenFile {
    int rank;
    h5::Handle file;
    std::map<std::string, Data, std::less<>> datasets;
  };
  // buffer -> tensor id -> pieces sorted by begin
  std::map<std::string, std::vector<std::vector<Piece>>, std::less<>> pieces;
  std::list<OpenFile> open;  // most recently used first, at most kMaxOpenFiles
  std::vector<std::byte> staging;
  // The last checksum block read whole for a partial read of it, verified: neighbouring segments and
  // pieces share their boundary block, which is then read once.
  struct CachedBlock {
    int rank = -1;
    std::string buffer;
    uint64_t index = 0;
    std::unique_ptr<std::byte[]> bytes;  // not a vector: growing it would zero-fill a block
    size_t capacity = 0;
  } cached;

  OpenFile& file(const fs::path& dir, int rank) {
    for (auto it = open.begin(); it != open.end(); ++it) {
      if (it->rank == rank) {
        open.splice(open.begin(), open, it);
        return open.front();
      }
    }
    if (open.size() >= kMaxOpenFiles) open.pop_back();
    open.push_front(OpenFile{rank, h5::file_open(dir / rank_file_name(rank)), {}});
    return open.front();
  }

  Data& dataset(OpenFile& f, const fs::path& path, std::string_view buffer, DType dtype) {
    auto it = f.datasets.find(buffer);
    if (it != f.datasets.end()) return it->second;
    std::string group_name = fmt::format("buffers/{}", buffer);
    h5::Handle group = h5::group_open(f.file.get(), group_name.c_str(), path);
    std::string name = group_name + "/data";
    if (!h5::exists(group.get(), "data", path)) {
      throw CheckpointError(fmt::format("checkpoint file '{}' has no dataset '{}'", path.string(), name));
    }
    // No chunk cache: HDF5 then moves unfiltered data straight between the file and the caller's
    // memory (a cache sized for two chunks made whole-range loads 8x slower); partial checksum blocks
    // at the ends of a read go through `cached` instead.
    h5::Handle dapl = h5::plist_create(H5P_DATASET_ACCESS);
    ZS_H5_CHECK(H5Pset_chunk_cache(dapl.get(), 0, 0, 1.0), path, "chunk cache");
    Data d;
    d.dataset = h5::Handle(
        ZS_H5_CHECK(H5Dopen2(group.get(), "data", dapl.get()), path, fmt::format("open of '{}'", name)), H5Dclose);
    h5::check_chunk(d.dataset.get(), name, path);
    d.elem = memory::dtype_size(dtype);
    d.type = detail::h5_type(dtype);
    d.direct = detail::DirectReader::open(d.dataset.get(), d.type, path, name);
    h5::Handle space = h5::dataset_space(d.dataset.get(), path, name);
    d.length = static_cast<uint64_t>(
        ZS_H5_CHECK(H5Sget_simple_extent_npoints(space.get()), path, fmt::format("length of '{}'", name)));
    if (h5::has_attr(group.get(), "checksum", path)) {
      std::string algorithm = h5::read_attr_string(group.get(), "checksum", path);
      if (algorithm != detail::kChecksumAlgorithm) {
        throw CheckpointError(fmt::format("checkpoint file '{}': buffer '{}' has checksums of kind '{}', this "
                                          "zeroshard knows '{}'",
                                          path.string(), buffer, printable(algorithm), detail::kChecksumAlgorithm));
      }
      d.sums = h5::read_u64_table(group.get(), "checksums", 1, path);
      h5::Handle table = h5::dataset_open(group.get(), "checksums", path);
      int64_t block = h5::read_attr_int(table.get(), "block_elements", path);
      uint64_t blocks = block > 0 ? (d.length + static_cast<uint64_t>(block) - 1) / static_cast<uint64_t>(block) : 0;
      if (block <= 0 || d.sums.size() != blocks) {
        throw CheckpointError(fmt::format("checkpoint file '{}': the checksum table of buffer '{}' does not match its "
                                          "data ({} checksums for {} elements in blocks of {})",
                                          path.string(), buffer, d.sums.size(), d.length, block));
      }
      d.block = static_cast<uint64_t>(block);
    }
    return f.datasets.emplace(std::string(buffer), std::move(d)).first->second;
  }

  // Elements [start, start + n) of `d` as stored, into `into`, each checksum block verified: runs of
  // whole blocks straight into `into`, a partial block at either end read whole through `cached`.
  void read_range(int rank, Data& d, const fs::path& path, std::string_view buffer, uint64_t start, uint64_t n,
                  std::byte* into) {
    if (d.sums.empty()) {
      // Unverified reads of a large run on two threads as well, in sub-runs of kUnverifiedSubBytes:
      // one thread's pread ran at 0.60-0.62x of a plain read() of the same bytes from a page cache of
      // huge pages (5.5 against 8.8 GB/s), where the verified path's two threads ran at 0.86-0.91x
      // (docs/checkpoints.md, "Benchmarks").
      if (kOverlap && n * d.elem >= kOverlapMinBytes && d.direct != nullptr && d.direct->resolve(start, n)) {
        const uint64_t sub = std::max<uint64_t>(1, kUnverifiedSubBytes / d.elem);
        read_subs_overlapped(start, start + n, sub, [&](uint64_t s) {
          raw_read(d, path, buffer, s, std::min(sub, start + n - s), into + (s - start) * d.elem);
        });
      } else {
        raw_read(d, path, buffer, start, n, into);
      }
      return;
    }
    const uint64_t end = start + n;
    for (uint64_t pos = start; pos < end;) {
      uint64_t c = pos / d.block, block_begin = c * d.block, block_end = std::min(block_begin + d.block, d.length);
      if (pos == block_begin && block_end <= end) {
        uint64_t run_end = end == d.length ? end : block_begin + (end - block_begin) / d.block * d.block;
        // In sub-runs of 256 KiB, each hashed right after it is read, while it is likely still in
        // the CPU's cache rather than after a 64 MiB read has pushed it out (64 KiB to 1 MiB
        // sub-runs measured the same).
        const uint64_t sub = std::max<uint64_t>(1, kHotReadBytes / (d.block * d.elem)) * d.block;
        auto read_sub = [&](uint64_t s) {
          uint64_t n_sub = std::min(sub, run_end - s);
          std::byte* dst = into + (s - start) * d.elem;
          raw_read(d, path, buffer, s, n_sub, dst);
          for (uint64_t e = 0; e < n_sub; e += d.block) {
            verify(d, path, buffer, (s + e) / d.block, dst + e * d.elem, std::min(d.block, n_sub - e));
          }
        };
        if (kOverlap && (run_end - pos) * d.elem >= kOverlapMinBytes && d.direct != nullptr &&
            d.direct->resolve(pos, run_end - pos)) {
          read_subs_overlapped(pos, run_end, sub, read_sub);
        } else {
          for (uint64_t s = pos; s < run_end; s += sub) read_sub(s);
        }
        pos = run_end;
      } else {
        if (cached.rank != rank || cached.buffer != buffer || cached.index != c) {
          cached.rank = -1;
          if (cached.capacity < d.block * d.elem) {
            cached.bytes.reset(new std::byte[d.block * d.elem]);
            cached.capacity = d.block * d.elem;
          }
          raw_read(d, path, buffer, block_begin, block_end - block_begin, cached.bytes.get());
          verify(d, path, buffer, c, cached.bytes.get(), block_end - block_begin);
          cached.rank = rank;
          cached.buffer = std::string(buffer);
          cached.index = c;
        }
        uint64_t take = std::min(block_end, end) - pos;
        std::memcpy(into + (pos - start) * d.elem, cached.bytes.get() + (pos - block_begin) * d.elem, take * d.elem);
        pos += take;
      }
    }
  }

  // Note [Overlapped checksums]: the sub-runs [pos, end) of `sub` elements, each read and verified by
  // read_sub, claimed one at a time by two threads of the worker pool (core/parallel.h), so one
  // thread's hash runs while the other's read copies: the hash of each sub-run stays right after its
  // read, in cache. The calling thread claims sub-runs too, so a worker slow to wake (a busy second
  // core) delays nothing: at worst the caller reads them all, in order, as the serial path does. The
  // reads are direct (pread at resolved addresses): no HDF5 call runs on two threads. Of several
  // failures, the one of the lowest sub-run is thrown, as the serial path would.
  template <typename ReadSub>
  static void read_subs_overlapped(uint64_t pos, uint64_t end, uint64_t sub, const ReadSub& read_sub) {
    const uint64_t subs = (end - pos + sub - 1) / sub;
    std::atomic<uint64_t> next{0};
    std::atomic<uint64_t> failed_at{subs};
    std::mutex mu;
    std::exception_ptr error;
    parallel_for_threads(2, 2, 1, [&](int64_t, int64_t, int) {
      for (uint64_t i = next.fetch_add(1); i < subs && i < failed_at.load(); i = next.fetch_add(1)) {
        try {
          read_sub(pos + i * sub);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          if (i < failed_at.load()) {
            failed_at.store(i);
            error = std::current_exception();
          }
        }
      }
    });
    if (error) std::rethrow_exception(error);
  }

  static void raw_read(Data& d, const fs::path& path, std::string_view buffer, uint64_t start, uint64_t n,
                       std::byte* into) {
    if (d.direct != nullptr && d.direct->read(start, n, into)) return;  // Note [Direct reads]
    hsize_t first = start, count = n;
    h5::Handle file_space = h5::dataset_space(d.dataset.get(), path, buffer);
    ZS_H5_CHECK(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &first, nullptr, &count, nullptr), path,
                "select hyperslab");
    h5::Handle mem = h5::dataspace_simple({count});
    ZS_H5_CHECK(H5Dread(d.dataset.get(), d.type, mem.get(), file_space.get(), H5P_DEFAULT, into), path,
                fmt::format("read of buffer '{}' elements [{}, {}) (a failed checksum means a corrupt file)", buffer,
                            start, start + n));
  }

  static void verify(const Data& d, const fs::path& path, std::string_view buffer, uint64_t block,
                     const std::byte* bytes, uint64_t elements) {
    if (detail::block_checksum(bytes, elements * d.elem) != d.sums[block]) [[unlikely]] {
      throw CheckpointError(fmt::format("checkpoint file '{}': buffer '{}' block {} (elements [{}, {})) fails its {} "
                                        "checksum: the file is corrupt",
                                        path.string(), buffer, block, block * d.block, block * d.block + elements,
                                        detail::kChecksumAlgorithm));
    }
  }
};

std::vector<TagInfo> list_tags(const fs::path& root) {
  std::vector<TagInfo> tags;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return tags;
  for (const auto& entry : fs::directory_iterator(root)) {
    std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.empty() || name[0] == '.') continue;
    if (!fs::exists(entry.path() / kMetadataFile)) continue;
    try {
      fs::path path = entry.path() / kMetadataFile;
      h5::Handle file = h5::file_open(path);
      tags.push_back(TagInfo{name, h5::read_attr_int(file.get(), "saved_unix_ns", path)});
    } catch (const CheckpointError&) {
      continue;  // not a complete tag: never listed, never pruned
    }
  }
  std::sort(tags.begin(), tags.end(),
            [](const TagInfo& a, const TagInfo& b) { return a.saved_unix_ns < b.saved_unix_ns; });
  return tags;
}

std::string read_latest(const fs::path& root) {
  std::ifstream in(root / kLatestFile);
  if (!in) {
    throw CheckpointError(
        fmt::format("checkpoint directory '{}' has no '{}' file: no checkpoint was saved there (or give a tag)",
                    root.string(), kLatestFile));
  }
  std::stringstream text;
  text << in.rdbuf();
  std::string tag = text.str();
  while (!tag.empty() && (tag.back() == '\n' || tag.back() == ' ')) tag.pop_back();
  if (tag.empty()) throw CheckpointError(fmt::format("'{}' is empty", (root / kLatestFile).string()));
  return tag;
}

fs::path tag_dir(const fs::path& root, std::string_view tag) {
  // A tag is one directory entry under root. The `latest` file's text arrives here unchecked, and a
  // name the file system refuses (too long: ENAMETOOLONG) threw filesystem_error, not CheckpointError
  // (found by tests/fuzz/checkpoint_fuzz.cpp).
  if (tag.empty() || tag == "." || tag == ".." || tag.size() > 200 || tag.find_first_of(std::string_view("/\0", 2)) != std::string_view::npos) {
    throw CheckpointError(fmt::format("checkpoint tag '{}' under '{}' is not a tag name (one directory name of at most "
                                      "200 bytes); if it came from '{}', that file is corrupt",
                                      printable(tag.substr(0, 80)), root.string(), (root / kLatestFile).string()));
  }
  std::error_code ec;
  fs::path dir = root / std::string(tag);
  if (fs::is_directory(dir, ec)) return dir;
  fs::path replaced = root / (std::string(tag) + ".replaced");
  if (fs::is_directory(replaced, ec)) return replaced;
  // The tag may be the `latest` file's bytes: quoted printable (a corrupt byte shows as \xNN).
  throw CheckpointError(fmt::format("checkpoint tag '{}' not found in '{}'", printable(tag), root.string()));
}

CheckpointReader::CheckpointReader(const fs::path& root, std::string_view tag)
    : CheckpointReader(tag_dir(root, tag.empty() ? read_latest(root) : std::string(tag)), 0) {}

CheckpointReader CheckpointReader::open_dir(const fs::path& dir) { return CheckpointReader(dir, 0); }

CheckpointReader::~CheckpointReader() = default;
CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&&) noexcept = default;

CheckpointReader::CheckpointReader(const fs::path& dir, int) : dir_(dir), impl_(std::make_unique<Impl>()) {
  meta_ = read_metadata_file(dir_);
  const Layout& layout = meta_.layout;
  std::string names;
  for (const TensorInfo& t : layout.tensors) names += t.name + '\n';
  for (const BufferLayout& b : layout.buffers) impl_->pieces[b.name].resize(layout.tensors.size());

  for (int r = 0; r < layout.world_size; ++r) {
    fs::path path = dir_ / rank_file_name(r);
    h5::Handle file = h5::file_open(path);
    hid_t f = file.get();
    auto mismatch = [&](std::string_view what) {
      return CheckpointError(fmt::format("checkpoint file '{}': {} does not match '{}'", path.string(), what,
                                         (dir_ / kMetadataFile).string()));
    };
    int64_t version = h5::read_attr_int(f, "format_version", path);
    if (version != meta_.version) {
      throw CheckpointError(fmt::format("checkpoint file '{}': format version {}, the metadata's is {}", path.string(),
                                        version, meta_.version));
    }
    std::string run_id = h5::read_attr_string(f, "run_id", path);
    if (run_id != meta_.run_id) {
      throw CheckpointError(fmt::format("checkpoint file '{}' is from another save (run id {}, the metadata's is {}): "
                                        "a shard copied from another checkpoint?",
                                        path.string(), run_id, meta_.run_id));
    }
    if (h5::read_attr_int(f, "rank", path) != r) throw mismatch("its rank");
    if (h5::read_attr_int(f, "world_size", path) != layout.world_size) throw mismatch("its world_size");
    if (h5::read_blob(f, "tensor_names", path) != names) throw mismatch("its tensor names");
    for (const BufferLayout& b : layout.buffers) {
      std::string group = fmt::format("buffers/{}", b.name);
      h5::Handle g = h5::group_open(f, group.c_str(), path);
      if (h5::read_attr_string(g.get(), "dtype", path) != memory::dtype_name(b.dtype)) {
        throw mismatch(fmt::format("the dtype of buffer '{}'", b.name));
      }
      std::vector<uint64_t> index = h5::read_u64_table(g.get(), "index", 4, path);
      const auto& segs = b.ranks[static_cast<size_t>(r)];
      if (index.size() != segs.size() * 4) throw mismatch(fmt::format("the index of buffer '{}'", b.name));
      // Segments in order, end to end; format 2 allows a gap of less than a page before each (Note
      // [Page phase] in format.h).
      const uint64_t max_gap = version >= 2 ? kPageBytes / memory::dtype_size(b.dtype) : 1;
      uint64_t offset = 0;
      for (size_t i = 0; i < segs.size(); ++i) {
        const Segment& s = segs[i];
        const uint64_t at = index[4 * i + 3];
        if (index[4 * i] != s.tensor || index[4 * i + 1] != s.begin || index[4 * i + 2] != s.count || at < offset ||
            at - offset >= max_gap) {
          throw mismatch(fmt::format("the index of buffer '{}' (row {})", b.name, i));
        }
        impl_->pieces[b.name][s.tensor].push_back(Piece{r, s.begin, s.count, at});
        offset = at + s.count;
      }
      h5::Handle ds = h5::dataset_open(g.get(), "data", path);
      h5::Handle space = h5::dataset_space(ds.get(), path, "data");
      hssize_t n = ZS_H5_CHECK(H5Sget_simple_extent_npoints(space.get()), path, "data length");
      if (static_cast<uint64_t>(n) != offset) {
        throw mismatch(fmt::format("the length of buffer '{}' ({} elements, the layout says {})", b.name, n, offset));
      }
    }
  }
  for (auto& [name, per_tensor] : impl_->pieces) {
    for (auto& ps : per_tensor) {
      std::sort(ps.begin(), ps.end(), [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
    }
  }
}

bool CheckpointReader::holds(std::string_view buffer, std::string_view tensor) const {
  auto it = impl_->pieces.find(buffer);
  int t = meta_.layout.find_tensor(tensor);
  if (it == impl_->pieces.end() || t < 0) return false;
  uint64_t covered = 0;
  for (const Piece& p : it->second[static_cast<size_t>(t)]) covered += p.count;
  return covered == meta_.layout.tensors[static_cast<size_t>(t)].numel();
}

void CheckpointReader::read(std::string_view buffer, std::string_view tensor, uint64_t begin, uint64_t count,
                            DType out_dtype, void* out) {
  auto it = impl_->pieces.find(buffer);
  if (it == impl_->pieces.end()) {
    throw UsageError(fmt::format("checkpoint '{}' has no buffer '{}'", dir_.string(), buffer));
  }
  int t = meta_.layout.find_tensor(tensor);
  if (t < 0) throw UsageError(fmt::format("checkpoint '{}' has no tensor '{}'", dir_.string(), tensor));
  uint64_t numel = meta_.layout.tensors[static_cast<size_t>(t)].numel();
  if (begin + count > numel) {
    throw UsageError(fmt::format("read of '{}' [{}, {}): the tensor has {} elements", tensor, begin, begin + count, numel));
  }
  const DType stored = meta_.layout.find_buffer(buffer)->dtype;
  const size_t in_size = memory::dtype_size(stored), out_size = memory::dtype_size(out_dtype);
  auto* dst = static_cast<std::byte*>(out);
  uint64_t covered = 0;
  // The pieces are sorted by begin and disjoint: start at the last non-empty one that begins at or
  // before `begin` (a tensor-parallel slice's load reads one run per row of a row-parallel weight,
  // among as many pieces: no scan from the tensor's first piece per read).
  const std::vector<Piece>& pieces = it->second[static_cast<size_t>(t)];
  auto from = std::upper_bound(pieces.begin(), pieces.end(), begin,
                               [](uint64_t b, const Piece& p) { return b < p.begin; });
  while (from != pieces.begin()) {
    if ((--from)->count > 0) break;
  }
  for (auto pi = from; pi != pieces.end() && pi->begin < begin + count; ++pi) {
    const Piece& p = *pi;
    uint64_t lo = std::max(begin, p.begin), hi = std::min(begin + count, p.begin + p.count);
    if (lo >= hi) continue;
    fs::path path = dir_ / rank_file_name(p.rank);
    Impl::OpenFile& f = impl_->file(dir_, p.rank);
    Impl::Data& d = impl_->dataset(f, path, buffer, stored);
    const uint64_t first = p.offset + (lo - p.begin), last = p.offset + (hi - p.begin);  // in the data
    if (stored == out_dtype) {
      impl_->read_range(p.rank, d, path, buffer, first, last - first, dst + (lo - begin) * out_size);
    } else {
      // Converted in pieces that end on checksum block boundaries, so no block is read twice.
      const uint64_t step = std::max<uint64_t>(d.block, kReadPieceBytes / in_size);
      for (uint64_t s = first; s < last;) {
        uint64_t stop = std::min(last, std::max(s + 1, (s + step) / d.block * d.block));
        impl_->staging.resize((stop - s) * in_size);
        impl_->read_range(p.rank, d, path, buffer, s, stop - s, impl_->staging.data());
        memory::convert(impl_->staging.data(), stored, dst + (lo - begin + (s - first)) * out_size, out_dtype, stop - s);
        s = stop;
      }
    }
    covered += hi - lo;
  }
  if (covered != count) {
    throw CheckpointError(fmt::format("checkpoint '{}': buffer '{}' holds {} of the {} requested elements [{}, {}) of "
                                      "'{}'",
                                      dir_.string(), buffer, covered, count, begin, begin + count, tensor));
  }
}

uint64_t CheckpointReader::stored_bytes() const {
  uint64_t total = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    if (entry.is_regular_file()) total += entry.file_size();
  }
  return total;
}

}  // namespace zs::checkpoint
