// Pre-tokenized data files: llm.c's token shards and Megatron's indexed dataset, memory-mapped.
//
// Note [token files]
// llm.c (dev/data/data_common.py, write_datafile): a header of 256 little-endian int32 - [0] the
// magic, [1] the version, [2] the number of tokens - then the tokens: magic 20240520 version 1 for
// uint16 tokens (GPT-2), magic 20240801 version 7 for uint32 tokens (LLaMA 3). The file is exactly
// 1024 + count x width bytes. A run's data are usually many shards (fineweb_train_000001.bin, ...),
// so data.path may be a glob, expanded in sorted order as llm.c's loader does; each shard is one
// segment: the format has no document index (documents are separated by an end-of-text token
// inside the stream), and llm.c's own loader reads windows across them too.
//
// Megatron-LM (megatron/core/datasets/indexed_dataset.py): PREFIX.idx holds b"MMIDIDX\x00\x00", the
// version (uint64, 1), the token dtype code (uint8: 1 uint8, 4 int32, 5 int64, 8 uint16; the others
// are not token types), the sequence count N and the document-index count D (uint64 each), then
// int32 sequence lengths [N], int64 byte pointers into PREFIX.bin [N] and int64 document indices [D]:
// document d is sequences [doc[d], doc[d+1]), doc[0] = 0 and doc[D-1] = N. PREFIX.bin is the
// sequences back to back. Every field is checked (the pointers must be the running sum of the
// lengths, the .bin exactly as long as they say), and each document is a segment: a window never
// spans two documents, and a document shorter than seq_len + 1 tokens is not sampled. Megatron's
// GPTDataset instead concatenates documents into samples; windows within one document keep the
// sampling a pure function of the global sample index without its index-building pass.
//
// Tokens are not scanned at open (a rank would read every byte of a corpus it samples a little of);
// each token a batch takes is checked against model.vocab_size as it is copied.
#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/errors.h"
#include "nn/data.h"
#include "nn/detail/mapped_file.h"

namespace zs::nn {

using detail::FdGuard;
using detail::MappedFile;

namespace {

constexpr int32_t kLlmcMagicU16 = 20240520, kLlmcVersionU16 = 1;
constexpr int32_t kLlmcMagicU32 = 20240801, kLlmcVersionU32 = 7;
constexpr uint64_t kLlmcHeaderBytes = 256 * 4;
constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
constexpr uint64_t kMegatronHeaderBytes = 9 + 8 + 1 + 8 + 8;

[[noreturn]] void corrupt(const std::string& file, std::string_view what) {
  throw ConfigError(fmt::format("data file '{}': {}", file, what));
}

std::shared_ptr<const MappedFile> map_file(const std::string& path) {
  FdGuard fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) {
    const int err = errno;
    throw IoError(fmt::format("data file '{}': cannot open it for reading: {}; check data.path", path,
                              zs::detail::errno_text(err)));
  }
  struct stat st {};
  ZS_SYS_CHECK(::fstat(fd.fd, &st), "data file '{}': fstat", path);
  if (!S_ISREG(st.st_mode)) throw IoError(fmt::format("data file '{}': not a regular file; check data.path", path));
  const auto size = static_cast<size_t>(st.st_size);
  if (size == 0) return std::make_shared<const MappedFile>(nullptr, 0);
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
  if (addr == MAP_FAILED) {
    const int err = errno;
    throw IoError(fmt::format("data file '{}': mmap of {} bytes failed: {}", path, size, zs::detail::errno_text(err)));
  }
  return std::make_shared<const MappedFile>(addr, size);
}

template <typename T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::vector<std::string> expand(const std::string& pattern) {
  if (pattern.find_first_of("*?[") == std::string::npos) return {pattern};
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  if (out.empty()) throw ConfigError(fmt::format("data.path: '{}' matches no file", pattern));
  std::sort(out.begin(), out.end());
  return out;
}

using Mappings = std::vector<std::shared_ptr<const MappedFile>>;

}  // namespace

struct TokenFiles {
  using File = Dataset::File;
  using Segment = Dataset::Segment;
  using TokenType = Dataset::TokenType;

  std::shared_ptr<Mappings> maps = std::make_shared<Mappings>();
  std::vector<File> files;
  std::vector<Segment> segments;

  void add_llmc(const std::string& path) {
    auto map = map_file(path);
    const uint64_t size = map->size();
    if (size < kLlmcHeaderBytes) {
      corrupt(path, fmt::format("{} bytes, shorter than llm.c's 1024-byte header (truncated, or not a token shard)", size));
    }
    const int32_t magic = load<int32_t>(map->data()), version = load<int32_t>(map->data() + 4);
    const int32_t count = load<int32_t>(map->data() + 8);
    TokenType type;
    if (magic == kLlmcMagicU16 && version == kLlmcVersionU16) {
      type = TokenType::kU16;
    } else if (magic == kLlmcMagicU32 && version == kLlmcVersionU32) {
      type = TokenType::kU32;
    } else {
      corrupt(path, fmt::format("header magic {} version {} is not llm.c's ({} version {}: uint16 tokens; {} version {}: "
                                "uint32 tokens); check data.format",
                                magic, version, kLlmcMagicU16, kLlmcVersionU16, kLlmcMagicU32, kLlmcVersionU32));
    }
    if (count < 0) corrupt(path, fmt::format("header token count {} is negative", count));
    const uint64_t width = type == TokenType::kU16 ? 2 : 4;
    const uint64_t want = kLlmcHeaderBytes + static_cast<uint64_t>(count) * width;
    if (size != want) {
      corrupt(path, fmt::format("{} bytes, but its header's {} tokens of {} bytes need {} ({})", size, count, width, want,
                                size < want ? "truncated" : "trailing bytes"));
    }
    files.push_back(File{reinterpret_cast<const unsigned char*>(map->data()) + kLlmcHeaderBytes, type, "'" + path + "'"});
    segments.push_back(Segment{static_cast<uint32_t>(files.size() - 1), 0, static_cast<uint64_t>(count)});
    maps->push_back(std::move(map));
  }

  void add_megatron(std::string prefix) {
    for (const char* ext : {".bin", ".idx"}) {
      if (prefix.size() > 4 && prefix.ends_with(ext)) prefix.resize(prefix.size() - 4);
    }
    const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
    const auto idx = map_file(idx_path);
    const char* p = idx->data();
    const uint64_t isize = idx->size();
    if (isize < kMegatronHeaderBytes || std::memcmp(p, kMegatronMagic, 9) != 0) {
      corrupt(idx_path, "does not start with Megatron's index magic MMIDIDX\\x00\\x00 (not an indexed dataset, or truncated)");
    }
    const auto version = load<uint64_t>(p + 9);
    if (version != 1) corrupt(idx_path, fmt::format("index version {}; Megatron's indexed dataset is version 1", version));
    const auto code = static_cast<uint8_t>(p[17]);
    TokenType type;
    uint64_t width;
    switch (code) {
      case 1: type = TokenType::kU8; width = 1; break;
      case 4: type = TokenType::kI32; width = 4; break;
      case 5: type = TokenType::kI64; width = 8; break;
      case 8: type = TokenType::kU16; width = 2; break;
      default:
        corrupt(idx_path, fmt::format("token dtype code {} is not a token type read here (1 uint8, 4 int32, 5 int64, 8 "
                                      "uint16)", code));
    }
    const auto n = load<uint64_t>(p + 18), d = load<uint64_t>(p + 26);
    const unsigned __int128 want = kMegatronHeaderBytes + static_cast<unsigned __int128>(n) * 12 +
                                   static_cast<unsigned __int128>(d) * 8;
    if (want != isize) {
      corrupt(idx_path, fmt::format("{} bytes, but {} sequences and {} document indices need {} ({}; a multimodal index "
                                    "is not read)",
                                    isize, n, d, static_cast<uint64_t>(want), isize < want ? "truncated" : "trailing bytes"));
    }
    const char* lengths = p + kMegatronHeaderBytes;
    const char* pointers = lengths + 4 * n;
    const char* docs = pointers + 8 * n;
    // Sequence i starts at token starts[i]: the pointers must be the running sum of the lengths.
    std::vector<uint64_t> starts(n + 1, 0);
    for (uint64_t i = 0; i < n; ++i) {
      const auto len = load<int32_t>(lengths + 4 * i);
      const auto ptr = load<int64_t>(pointers + 8 * i);
      if (len < 0) corrupt(idx_path, fmt::format("sequence {} has length {}", i, len));
      if (ptr < 0 || static_cast<uint64_t>(ptr) != starts[i] * width) {
        corrupt(idx_path, fmt::format("sequence {} points at byte {} of the .bin, where the lengths before it end at {}",
                                      i, ptr, starts[i] * width));
      }
      starts[i + 1] = starts[i] + static_cast<uint64_t>(len);
    }
    if (d == 0 || load<int64_t>(docs) != 0 || load<int64_t>(docs + 8 * (d - 1)) != static_cast<int64_t>(n)) {
      corrupt(idx_path, fmt::format("the document indices must run from 0 to the sequence count {}", n));
    }
    auto bin = map_file(bin_path);
    if (bin->size() != starts[n] * width) {
      corrupt(bin_path, fmt::format("{} bytes, but its index '{}' gives {} tokens of {} bytes = {} ({})", bin->size(),
                                    idx_path, starts[n], width, starts[n] * width,
                                    bin->size() < starts[n] * width ? "truncated" : "trailing bytes"));
    }
    files.push_back(File{reinterpret_cast<const unsigned char*>(bin->data()), type, "'" + bin_path + "'"});
    const auto f = static_cast<uint32_t>(files.size() - 1);
    for (uint64_t k = 0; k + 1 < d; ++k) {
      const auto s0 = load<int64_t>(docs + 8 * k), s1 = load<int64_t>(docs + 8 * (k + 1));
      if (s1 < s0 || s1 > static_cast<int64_t>(n)) {
        corrupt(idx_path, fmt::format("document index {} is {} after {}: not increasing within [0, {}]", k + 1, s1, s0, n));
      }
      const uint64_t b = starts[static_cast<uint64_t>(s0)], e = starts[static_cast<uint64_t>(s1)];
      if (e > b) segments.push_back(Segment{f, b, e - b});
    }
    maps->push_back(std::move(bin));
  }
};

Dataset Dataset::open_tokens(DataFormat format, const std::string& path, int64_t seq_len, int64_t vocab_size) {
  ZS_ASSERT(format != DataFormat::kText, "open_tokens for a text");
  if (seq_len <= 0) throw ConfigError(fmt::format("dataset '{}': seq_len must be > 0, got {}", path, seq_len));
  if (vocab_size <= 0) throw ConfigError(fmt::format("dataset '{}': vocab_size must be > 0, got {}", path, vocab_size));
  TokenFiles t;
  if (format == DataFormat::kLlmc) {
    for (const std::string& f : expand(path)) t.add_llmc(f);
  } else {
    t.add_megatron(path);
  }
  uint64_t longest = 0;
  for (const Segment& s : t.segments) longest = std::max(longest, s.size);
  Dataset ds(t.maps, std::move(t.files), std::move(t.segments), format, seq_len, vocab_size, "'" + path + "'");
  if (ds.num_windows() == 0) {
    throw ConfigError(fmt::format("dataset '{}' ({}): no {} holds a window of seq_len + 1 = {} tokens (the longest has "
                                  "{}); use a smaller model.seq_len or more data",
                                  path, data_format_name(format), format == DataFormat::kLlmc ? "shard" : "document",
                                  seq_len + 1, longest));
  }
  return ds;
}

namespace {

void write_all(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    ZS_SYS_CHECK(w < 0 ? -1 : 0, "write of '{}'", path);
    p += w;
    n -= static_cast<size_t>(w);
  }
}

constexpr size_t kWriteBuffer = size_t{1} << 20;

}  // namespace

LlmcShardWriter::LlmcShardWriter(std::string path, int64_t vocab_size)
    : path_(std::move(path)), tmp_(path_ + ".tmp"), vocab_size_(vocab_size) {
  if (vocab_size <= 0 || vocab_size > (int64_t{1} << 32)) {
    throw ConfigError(fmt::format("token shard '{}': vocab_size {} out of range", path_, vocab_size));
  }
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int err = errno;
    throw IoError(fmt::format("token shard '{}': cannot create it: {}", tmp_, zs::detail::errno_text(err)));
  }
  buffer_.reserve(kWriteBuffer);
  buffer_.resize(kLlmcHeaderBytes, '\0');  // the header, completed by finish()
}

LlmcShardWriter::~LlmcShardWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    std::remove(tmp_.c_str());
  }
}

void LlmcShardWriter::append(std::span<const int32_t> tokens) {
  ZS_ASSERT(fd_ >= 0, "append after finish");
  if (count_ + tokens.size() > kMaxTokens) {
    throw ConfigError(fmt::format("token shard '{}': more than {} tokens, the most llm.c's header can count; write "
                                  "several shards (zeroshard tokenize --shard-tokens)", path_, kMaxTokens));
  }
  const bool narrow = vocab_size_ <= 65536;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens[i];
    if (t < 0 || t >= vocab_size_) {
      throw ConfigError(fmt::format("token shard '{}': token {} outside [0, {})", path_, t, vocab_size_));
    }
    if (buffer_.size() + 4 > kWriteBuffer) {
      write_all(fd_, buffer_.data(), buffer_.size(), tmp_);
      buffer_.clear();
    }
    char b[4];
    if (narrow) {
      const auto v = static_cast<uint16_t>(t);
      std::memcpy(b, &v, 2);
      buffer_.insert(buffer_.end(), b, b + 2);
    } else {
      const auto v = static_cast<uint32_t>(t);
      std::memcpy(b, &v, 4);
      buffer_.insert(buffer_.end(), b, b + 4);
    }
  }
  count_ += tokens.size();
}

void LlmcShardWriter::finish() {
  ZS_ASSERT(fd_ >= 0, "finish twice");
  write_all(fd_, buffer_.data(), buffer_.size(), tmp_);
  buffer_.clear();
  int32_t header[256] = {};
  const bool narrow = vocab_size_ <= 65536;
  header[0] = narrow ? kLlmcMagicU16 : kLlmcMagicU32;
  header[1] = narrow ? kLlmcVersionU16 : kLlmcVersionU32;
  header[2] = static_cast<int32_t>(count_);
  const char* h = reinterpret_cast<const char*>(header);
  for (size_t done = 0; done < sizeof(header);) {
    const ssize_t w = ::pwrite(fd_, h + done, sizeof(header) - done, static_cast<off_t>(done));
    if (w < 0 && errno == EINTR) continue;
    ZS_SYS_CHECK(w < 0 ? -1 : 0, "write of '{}'", tmp_);
    done += static_cast<size_t>(w);
  }
  ZS_SYS_CHECK(::fsync(fd_), "fsync of '{}'", tmp_);
  const int fd = fd_;
  fd_ = -1;
  ZS_SYS_CHECK(::close(fd), "close of '{}'", tmp_);
  ZS_SYS_CHECK(std::rename(tmp_.c_str(), path_.c_str()), "rename of '{}' to '{}'", tmp_, path_);
}

}  // namespace zs::nn
