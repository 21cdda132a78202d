// Writing a checkpoint: one ShardWriter per rank file, streaming; write_metadata; an atomic Save.
//
//   Layout layout = ...;                          // the same on every rank (the engine's flat layout)
//   Metadata meta{.run_id = id, .tag = "global_step100", .layout = layout, ...};  // id equal on all ranks
//   std::filesystem::path dir = begin_save(root, meta.tag);       // rank 0, then a barrier
//   ShardWriter w(dir, meta, rank, WriteOptions{});
//   w.append("fp32", bytes_of_piece);              // in pieces: any size, in segment order per buffer
//   w.finish();                                    // every rank, then a barrier
//   write_metadata(dir, meta, WriteOptions{});     // rank 0
//   commit_save(root, meta.tag, /*keep_last=*/3);  // rank 0: fsync, rename, `latest`, prune
//
// Note [Atomic save]: everything is written under <root>/.staging.<tag>, each file fsync'd, then the
// directory is fsync'd and renamed to <root>/<tag>, the root fsync'd, and only then is `latest`
// replaced (written to .staging.latest, fsync'd, renamed, root fsync'd). A crash before the tag rename
// leaves a staging directory the next save removes; a crash after it leaves `latest` naming the
// previous tag, which is untouched. Re-saving an existing tag first renames the old one to
// <tag>.replaced (the reader falls back to it while <tag> is absent), so no instant lacks a loadable
// copy of the tag `latest` names. Pruning (keep_last) renames a tag to .staging.pruned.<tag> before
// removing it, so a crash while pruning never leaves part of a tag under its name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "checkpoint/format.h"

namespace zs::checkpoint {

enum class Compression { kNone, kZstd };

struct WriteOptions {
  Compression compression = Compression::kNone;
  int zstd_level = 3;
  // An XXH3-64 checksum per 64 KiB block, computed while streaming and stored beside the data (Note [Chunk
  // checksums] in detail/checksum.h): flipped data bytes are caught on load, with or without zstd
  // (zstd frames have their own checksum as well).
  bool checksum = true;
  // Chunk size of the data datasets (the unit of writes, reads, checksums and compression); 0 picks:
  // 64 KiB with zstd, below glibc's 128 KiB mmap threshold, so the buffers HDF5's filter allocates
  // per chunk come from the heap rather than fresh mmaps that fault every page (256 KiB chunks ran
  // 10-20x slower); 4 MiB without, where HDF5 moves whole chunks straight between file and caller and
  // fewer chunks cost less (benchmarks/checkpoint_bench --chunk).
  uint64_t chunk_bytes = 0;
  // Threads for unfiltered data with checksums: at 2 or more, each piece is hashed on a worker-pool
  // thread while it is written (Note [Write then hash] in writer.cpp). For a save that holds its
  // caller anyway; a background writer keeps 1 and leaves the other cores to training.
  int hash_threads = 1;
};

// Writes one rank's file. Memory: with zstd, one chunk of staging per buffer being appended
// (chunk_bytes); without, one checksum block (64 KiB); and 8 bytes of checksum per 64 KiB written.
// Not thread-safe; one writer per file.
class ShardWriter {
 public:
  ShardWriter(const std::filesystem::path& dir, const Metadata& meta, int rank, const WriteOptions& options);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends the next `bytes` of buffer `buffer` (its dtype's bytes, whole elements, in this rank's
  // segment order). Buffers may be interleaved. Throws UsageError past the buffer's length.
  void append(std::string_view buffer, std::span<const std::byte> bytes);
  // Checks every buffer is complete (UsageError otherwise), flushes, closes and fsyncs the file.
  void finish();

  const std::filesystem::path& path() const { return path_; }

 private:
  struct Impl;
  std::filesystem::path path_;
  std::unique_ptr<Impl> impl_;
};

void write_metadata(const std::filesystem::path& dir, const Metadata& meta);

// Rank 0 (the coordinator): creates <root>/.staging.<tag> afresh (removing stale staging directories
// of crashed saves, except those in `in_use`: tags a commit pruned that a background thread is still
// removing, see commit_save) and returns it.
std::filesystem::path begin_save(const std::filesystem::path& root, std::string_view tag,
                                 std::span<const std::filesystem::path> in_use = {});
// Rank 0, once every rank's file and the metadata are written: see Note [Atomic save]. Then removes
// all but the newest `keep_last` tags (by save time; 0 keeps all; the tag `latest` names is kept).
// With `remove_later`, those tags are only renamed out of sight (to hidden staging names, which a
// crash leaves for the next begin_save to clear) and their paths appended there, for the caller to
// remove off its critical path: removing a 37 MiB rank file took 15-50 ms on this project's VM disk
// (ext4 mounted with discard), the largest part of an asynchronous save's commit.
void commit_save(const std::filesystem::path& root, std::string_view tag, int keep_last,
                 std::vector<std::filesystem::path>* remove_later = nullptr);

// fsync of a file or directory; IoError naming it.
void fsync_path(const std::filesystem::path& path);

}  // namespace zs::checkpoint
