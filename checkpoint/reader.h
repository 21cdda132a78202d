// Reading a checkpoint: any element range of any tensor from whichever rank files hold it.
//
//   CheckpointReader ckpt(root);                 // the tag `latest` names; checks every file
//   const TensorInfo& t = ...;                   // ckpt.metadata().layout.tensors
//   std::vector<float> mine(count);
//   ckpt.read("fp32", "layers.0.attn.w", begin, count, DType::kF32, mine.data());
//
// Opening reads the metadata and every rank file's header and index (not its data) and refuses,
// with a CheckpointError naming the file and the field, a bad format version, a missing or truncated
// rank file, a shard of another save (run id), another world size, a rank file whose index does not
// match the metadata. A read is one read per overlapping segment (a pread of unfiltered data at its
// chunk's address, Note [Direct reads] in detail/direct_read.h; else H5Dread), converted on the way in
// small pieces: memory is bounded by the caller's output plus one chunk, never a whole file. Flipped
// data bytes fail the chunk's XXH3 checksum on read (Note [Checksum blocks] in detail/checksum.h).
// A verified read of 2 MiB or more is read and verified in 256 KiB pieces by the calling thread and
// one thread of the worker pool (core/parallel.h; Note [Overlapped checksums] in reader.cpp): call
// it from outside the pool's parallel regions (inside one it runs on the caller alone).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/format.h"

namespace zs::checkpoint {

struct TagInfo {
  std::string tag;
  int64_t saved_unix_ns = 0;
};

// Complete tags under `root` (directories holding a readable metadata file), oldest save first.
std::vector<TagInfo> list_tags(const std::filesystem::path& root);
// The tag the `latest` file names; CheckpointError if there is none.
std::string read_latest(const std::filesystem::path& root);
// The directory of `tag` under `root` (<tag>, or <tag>.replaced while a re-save of it is committing).
std::filesystem::path tag_dir(const std::filesystem::path& root, std::string_view tag);

class CheckpointReader {
 public:
  // `tag` empty: the tag `latest` names.
  explicit CheckpointReader(const std::filesystem::path& root, std::string_view tag = {});
  // A tag directory itself (the one holding zs_metadata.h5).
  static CheckpointReader open_dir(const std::filesystem::path& dir);
  ~CheckpointReader();
  CheckpointReader(CheckpointReader&&) noexcept;
  CheckpointReader& operator=(CheckpointReader&&) noexcept;

  const Metadata& metadata() const { return meta_; }
  const std::filesystem::path& dir() const { return dir_; }

  // Whether `buffer` holds every element of `tensor`.
  bool holds(std::string_view buffer, std::string_view tensor) const;
  // Elements [begin, begin + count) of `tensor` in `buffer`, converted to `out_dtype` (float dtypes
  // convert among themselves), into `out` (count * dtype_size(out_dtype) bytes). CheckpointError if
  // the checkpoint lacks some of them; UsageError for an unknown buffer or tensor or a range past the
  // tensor's end.
  void read(std::string_view buffer, std::string_view tensor, uint64_t begin, uint64_t count, DType out_dtype,
            void* out);
  // Bytes of the tag's files on disk.
  uint64_t stored_bytes() const;

 private:
  struct Impl;
  explicit CheckpointReader(const std::filesystem::path& dir, int);
  std::filesystem::path dir_;
  Metadata meta_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zs::checkpoint
