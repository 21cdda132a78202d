// Safetensors: Hugging Face's weight files, read memory-mapped and written in bounded memory.
//
//   SafetensorsReader model("hf/gpt2");              // model.safetensors, or the index's shards
//   model.expect("wte.weight", {50257, 768});         // CheckpointError naming file and tensor
//   model.read("wte.weight", begin, count, DType::kF32, out);   // only these bytes are touched
//
//   write_safetensors_model(dir, specs, {{"format", "pt"}}, 5 << 30,
//       [&](const SafetensorsSpec& s, SafetensorsWriter& w) { w.append(values, DType::kF32, n); });
//
// The format (https://github.com/huggingface/safetensors): 8 bytes, the header's length N as a
// little-endian uint64; N bytes of JSON, an object mapping each tensor name to {"dtype", "shape",
// "data_offsets": [begin, end]} (byte offsets into the data section that follows the header) plus an
// optional "__metadata__" object of strings; then the data section, each tensor row-major and
// little-endian. A sharded model is several such files and `model.safetensors.index.json`, whose
// "weight_map" names the file of every tensor.
//
// Reading checks the whole header against the file before any data is read (Note [safetensors
// checks] in safetensors.cpp): a header past the file's end, offsets out of range, overlapping or
// leaving holes, a byte count that is not shape x dtype, a truncated data section: each a
// CheckpointError naming the file and the tensor. Files are mapped read-only; a read converts
// exactly the elements asked for, so a rank reading its shard of a tensor touches only those pages.
//
// Thread-safety: readers are immutable after construction; read() may run concurrently.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "memory/dtype.h"

namespace zs::checkpoint {

using memory::DType;

// One tensor of a file's header.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;            // as the file spells it: "F32", "BF16", "F16", "I64", "U8", ...
  std::vector<int64_t> shape;   // row-major; {} is a scalar
  uint64_t begin = 0, end = 0;  // data_offsets: bytes [begin, end) of the data section
  uint64_t numel() const;
};

// The memory dtype of a safetensors dtype name ("F32", "BF16", "F16", "I32"); nullopt for the others
// (they can be listed, not read).
std::optional<DType> safetensors_dtype(std::string_view name);
// "F32", "BF16", "F16", "I32".
std::string_view safetensors_dtype_name(DType t);

// One .safetensors file, memory-mapped. Throws IoError when it cannot be opened and CheckpointError
// naming the file (and the tensor) when its header is malformed or does not match its size.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;

  const std::filesystem::path& path() const { return path_; }
  // In data order.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsTensor* find(std::string_view name) const;
  // Elements [first, first + count) of `t` (one of tensors()), converted to `out_dtype`, into `out`.
  // CheckpointError naming the file and tensor for a dtype that cannot be read as `out_dtype`;
  // UsageError for a range past the tensor's end.
  void read(const SafetensorsTensor& t, uint64_t first, uint64_t count, DType out_dtype, void* out) const;

 private:
  struct Mapping;
  std::filesystem::path path_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
  std::unique_ptr<Mapping> map_;
};

// A model's weights: one file, or the shards an index names.
class SafetensorsReader {
 public:
  // `path`: a .safetensors file; an index (*.json with a "weight_map"); or a directory holding
  // model.safetensors.index.json or model.safetensors (the index first, as transformers looks).
  // Opens every file the index names and checks that each file holds exactly the tensors the index
  // gives it (CheckpointError naming the file and tensor otherwise).
  explicit SafetensorsReader(const std::filesystem::path& path);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&&) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&&) noexcept;

  // What the reader was opened on (for messages).
  const std::filesystem::path& origin() const { return origin_; }
  // Every tensor name, sorted.
  std::vector<std::string> names() const;
  bool contains(std::string_view name) const;
  // CheckpointError naming the model for a name it does not hold.
  const SafetensorsTensor& tensor(std::string_view name) const;
  const SafetensorsFile& file_of(std::string_view name) const;
  // The tensor exists, has `shape` and a dtype read() can convert to floats; else CheckpointError
  // naming the file, the tensor, and what it has.
  void expect(std::string_view name, std::span<const int64_t> shape) const;
  // Elements [first, first + count) of the row-major tensor `name`, converted to `out_dtype`.
  void read(std::string_view name, uint64_t first, uint64_t count, DType out_dtype, void* out) const;

 private:
  std::filesystem::path origin_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t, std::less<>> where_;  // tensor name -> index into files_
};

// A tensor to write.
struct SafetensorsSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t numel() const;
  uint64_t bytes() const { return numel() * memory::dtype_size(dtype); }
};

// Writes one file in bounded memory: the header first (every tensor's place follows from the specs),
// then each tensor's elements in spec order, appended in pieces of any size. The file is written as
// `<path>.tmp` and renamed onto `path` by finish(); destroyed unfinished, the partial file is removed.
class SafetensorsWriter {
 public:
  SafetensorsWriter(std::filesystem::path path, std::vector<SafetensorsSpec> tensors,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The next `count` elements of the current tensor (continuing into the next ones in spec order),
  // given as `src_dtype` and converted to each tensor's dtype. UsageError past the last tensor.
  void append(const void* src, DType src_dtype, uint64_t count);
  // Every element written: flushes, fsyncs and renames. UsageError if elements are missing.
  void finish();
  const std::filesystem::path& path() const { return path_; }
  // Elements appended so far, over all tensors.
  uint64_t elements_written() const { return total_written_; }

 private:
  void write_bytes(const void* data, size_t n);
  std::filesystem::path path_, tmp_;
  std::vector<SafetensorsSpec> tensors_;
  size_t current_ = 0;       // tensor being written
  uint64_t written_ = 0;     // elements of it written
  uint64_t total_written_ = 0;
  int fd_ = -1;
  std::vector<char> buffer_;  // write-behind, bounded
};

// Writes a model under `dir`: `model.safetensors` when it fits in max_shard_bytes, else shards of at
// most max_shard_bytes each (a tensor is never split; one larger than the limit gets a file of its
// own) named model-0000i-of-0000n.safetensors and the index model.safetensors.index.json (Hugging
// Face's names and layout). fill(spec, writer) is called once per tensor, in spec order, and must
// append exactly spec.numel() elements. Returns the files written (data files, then the index).
std::vector<std::filesystem::path> write_safetensors_model(
    const std::filesystem::path& dir, const std::vector<SafetensorsSpec>& specs,
    const std::map<std::string, std::string>& metadata, uint64_t max_shard_bytes,
    const std::function<void(const SafetensorsSpec&, SafetensorsWriter&)>& fill);

}  // namespace zs::checkpoint
