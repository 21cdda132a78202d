// Language-model data: a byte-level tokenizer and a dataset of fixed-length windows over a text.
//
//   auto ds = zs::nn::Dataset::open("data/shakespeare.txt", /*seq_len=*/256);  // memory-mapped
//   auto ds = zs::nn::Dataset::builtin(256);                                     // embedded corpus
//   zs::nn::Batch batch;
//   ds.fill_batch(batch, seed, step, /*first_global_sample=*/rank * micro_batch, micro_batch);
//
// Sampling is a pure function: sample g of step s starts at window_start(seed, s, g), drawn by the
// counter-based RNG (core/rng.h). A rank that owns global samples [first, first + n) of a step fills
// exactly those windows, so the global batch is the same for every world size and accumulation
// setting. inputs[b][t] = text[start + t] and targets[b][t] = text[start + t + 1], t in [0, seq_len).
//
// Thread-safety: a Dataset is immutable after construction; fill_batch may run concurrently on
// different Batch objects. Copies share the underlying bytes (the mapping lives until the last copy).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "nn/model.h"

namespace zs::nn {

// Bytes are tokens: id = (unsigned char)byte, vocabulary 256.
class ByteTokenizer {
 public:
  static constexpr int64_t kVocabSize = 256;
  static std::vector<int32_t> encode(std::string_view text);
  // Throws ConfigError for an id outside [0, 256).
  static std::string decode(std::span<const int32_t> ids);
};

// Text compiled into the library at build time (README.md, docs/*.md and some of zeroshard's own
// sources), so a model can train with no data file. At least 100 KB.
std::string_view builtin_corpus();

class Dataset {
 public:
  // Memory-maps `path` read-only. Throws IoError naming the path when it cannot be opened or
  // mapped, and ConfigError when it has fewer than seq_len + 1 bytes (the message gives the size
  // needed). seq_len must be > 0.
  static Dataset open(const std::string& path, int64_t seq_len);
  // A dataset over a copy of `text`; `origin` names it in messages. Same size rule as open().
  static Dataset from_bytes(std::string_view text, int64_t seq_len, std::string origin = "<in-memory text>");
  // builtin_corpus(), without a copy.
  static Dataset builtin(int64_t seq_len);
  // Bytes [begin, end) of this dataset as a dataset of its own (sharing the bytes, no copy), named
  // `origin`: a held-out split. Same size rule as open() (ConfigError naming `origin`).
  Dataset slice(uint64_t begin, uint64_t end, std::string origin) const;

  std::string_view bytes() const { return bytes_; }
  int64_t seq_len() const { return seq_len_; }
  const std::string& origin() const { return origin_; }
  // Number of distinct window starts: size - seq_len (each window needs seq_len + 1 bytes).
  uint64_t num_windows() const { return bytes_.size() - static_cast<uint64_t>(seq_len_); }

  // Start offset of global sample `global_sample` of step `step`, in [0, num_windows()).
  uint64_t window_start(uint64_t seed, uint64_t step, uint64_t global_sample) const;

  // Fills batch.inputs and batch.targets, DType::kI32 (batch_size, seq_len), with global samples
  // [first_global_sample, first_global_sample + batch_size) of `step`. Reuses the tensors when they
  // already have that shape and dtype; otherwise allocates owning host tensors.
  void fill_batch(Batch& batch, uint64_t seed, uint64_t step, uint64_t first_global_sample, int64_t batch_size) const;
  // The same with samples of `length` tokens (1 <= length <= seq_len): each sample is the first
  // `length` tokens of the window above, so (batch_size, length) tensors.
  void fill_batch(Batch& batch, uint64_t seed, uint64_t step, uint64_t first_global_sample, int64_t batch_size,
                  int64_t length) const;
  // Varying sequence lengths (`data.min_seq_len`): the length of every sample of `step`, uniform in
  // [min_len, seq_len], a pure function of (seed, step), so every rank and micro-batch of a step
  // agrees. min_len == seq_len gives seq_len. Precondition: 1 <= min_len <= seq_len.
  int64_t seq_len_at(uint64_t seed, uint64_t step, int64_t min_len) const;

 private:
  Dataset(std::shared_ptr<const void> owner, std::string_view bytes, int64_t seq_len, std::string origin);
  std::shared_ptr<const void> owner_;
  std::string_view bytes_;
  int64_t seq_len_;
  std::string origin_;
};

}  // namespace zs::nn
