// Language-model data: a byte-level tokenizer and a dataset of fixed-length windows over a text or
// over pre-tokenized token files.
//
//   auto ds = zs::nn::Dataset::open("data/shakespeare.txt", /*seq_len=*/256);  // memory-mapped
//   auto ds = zs::nn::Dataset::builtin(256);                                     // embedded corpus
//   auto ds = zs::nn::Dataset::open_tokens(DataFormat::kLlmc, "fineweb_train_*.bin", 1024, 50257);
//   auto ds = zs::nn::Dataset::open_tokens(DataFormat::kMegatron, "corpus_text_document", 1024, 50257);
//   zs::nn::Batch batch;
//   ds.fill_batch(batch, seed, step, /*first_global_sample=*/rank * micro_batch, micro_batch);
//
// Sampling is a pure function: sample g of step s starts at window_start(seed, s, g), drawn by the
// counter-based RNG (core/rng.h). A rank that owns global samples [first, first + n) of a step fills
// exactly those windows, so the global batch is the same for every world size and accumulation
// setting. inputs[b][t] = text[start + t] and targets[b][t] = text[start + t + 1], t in [0, seq_len).
//
// A dataset is a list of segments, token ranges no window crosses: a text is one; each llm.c shard
// is one (the format has no document index); each document of a Megatron indexed dataset is one
// (Note [token files] in token_files.cpp). Window w of the dataset is a start in the segment whose
// windows it falls in, segments in order; a segment shorter than seq_len + 1 tokens holds none.
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

// How `data.path` is read (the `data.format` key).
enum class DataFormat {
  kText,      // bytes are tokens (ByteTokenizer)
  kLlmc,      // llm.c's token shards: a file or a glob of files (256 x int32 header, uint16/uint32 tokens)
  kMegatron,  // Megatron's indexed dataset: a path prefix naming PREFIX.bin and PREFIX.idx
};
// "text", "llmc", "megatron".
std::string_view data_format_name(DataFormat f);

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

// Writes llm.c's token shard format, what Dataset::open_tokens(DataFormat::kLlmc, ...) reads:
// uint16 tokens (magic 20240520, version 1, as llm.c writes GPT-2's) when vocab_size <= 65536, else
// uint32 tokens (magic 20240801, version 7, llm.c's LLaMA 3 form). Streamed: tokens go to the file as
// they come, and finish() writes the header's count and renames `<path>.tmp` onto `path`; destroyed
// unfinished, the partial file is removed. The format counts tokens in an int32: at most 2^31 - 1.
//
//   LlmcShardWriter w("train_000000.bin", sp.GetPieceSize());  w.append(ids);  w.finish();
class LlmcShardWriter {
 public:
  LlmcShardWriter(std::string path, int64_t vocab_size);
  ~LlmcShardWriter();
  LlmcShardWriter(const LlmcShardWriter&) = delete;
  LlmcShardWriter& operator=(const LlmcShardWriter&) = delete;
  // ConfigError for a token outside [0, vocab_size) or past the format's count limit.
  void append(std::span<const int32_t> tokens);
  uint64_t tokens() const { return count_; }
  const std::string& path() const { return path_; }
  void finish();
  static constexpr uint64_t kMaxTokens = (uint64_t{1} << 31) - 1;

 private:
  std::string path_, tmp_;
  int64_t vocab_size_;
  int fd_ = -1;
  uint64_t count_ = 0;
  std::vector<char> buffer_;
};

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
  // Pre-tokenized files (kLlmc or kMegatron), memory-mapped; every header is checked at open (a bad
  // magic, version or dtype, a size that disagrees with the header, an index inconsistent with its
  // .bin: CheckpointError naming the file) and every token a batch takes is checked against
  // vocab_size (>= vocab_size or negative: ConfigError naming the file and the token's position).
  // ConfigError naming the path when no segment holds a window of seq_len + 1 tokens.
  static Dataset open_tokens(DataFormat format, const std::string& path, int64_t seq_len, int64_t vocab_size);
  // Tokens [begin, end) of this dataset (positions in its segments laid end to end) as a dataset of
  // its own (sharing the mapping, no copy), named `origin`: a held-out split. ConfigError naming
  // `origin` when the part holds no window.
  Dataset slice(uint64_t begin, uint64_t end, std::string origin) const;

  // The text of a text dataset (kText: one segment of bytes). Precondition: format() == kText.
  std::string_view bytes() const;
  DataFormat format() const { return format_; }
  int64_t seq_len() const { return seq_len_; }
  const std::string& origin() const { return origin_; }
  // Tokens in all segments.
  uint64_t num_tokens() const { return num_tokens_; }
  // Segments, and those long enough to hold a window.
  uint64_t num_segments() const { return segments_.size(); }
  uint64_t num_sampled_segments() const;
  // Number of distinct windows (each needs seq_len + 1 tokens of one segment); for a text,
  // size - seq_len.
  uint64_t num_windows() const { return window_ends_.empty() ? 0 : window_ends_.back(); }

  // The window of global sample `global_sample` of step `step`, in [0, num_windows()); for a text,
  // its start offset.
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
  // Internal: token storage (token_files.cpp builds these).
  friend struct TokenFiles;
  enum class TokenType : uint8_t { kU8, kU16, kU32, kI32, kI64 };
  struct File {
    const unsigned char* tokens = nullptr;  // the first token
    TokenType type = TokenType::kU8;
    std::string name;  // for messages
  };
  struct Segment {
    uint32_t file = 0;
    uint64_t begin = 0, size = 0;  // tokens of the file
  };
  Dataset(std::shared_ptr<const void> owner, std::vector<File> files, std::vector<Segment> segments, DataFormat format,
          int64_t seq_len, int64_t vocab_size, std::string origin);
  // The segment and offset in it of window `w`.
  std::pair<const Segment*, uint64_t> locate(uint64_t w) const;
  int32_t token(const File& f, uint64_t i) const;

  std::shared_ptr<const void> owner_;  // the mappings
  std::vector<File> files_;
  std::vector<Segment> segments_;
  std::vector<uint64_t> window_ends_;  // cumulative windows: segment i holds [ends[i-1], ends[i])
  DataFormat format_ = DataFormat::kText;
  int64_t seq_len_;
  int64_t vocab_size_ = 0;  // token files: every token must be below it; 0 for a text
  uint64_t num_tokens_ = 0;
  std::string origin_;
};

}  // namespace zs::nn
