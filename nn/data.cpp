#include "nn/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/errors.h"
#include "core/rng.h"
#include "nn/detail/mapped_file.h"

namespace zs::nn {

using detail::FdGuard;
using detail::MappedFile;
using memory::DType;
using memory::Tensor;

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) {
  std::string s(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= kVocabSize) {
      throw ConfigError(fmt::format("byte tokenizer: id {} at position {} is not a byte (0..255)", ids[i], i));
    }
    s[i] = static_cast<char>(static_cast<unsigned char>(ids[i]));
  }
  return s;
}

namespace {

void check_seq_len(int64_t seq_len, const std::string& origin) {
  if (seq_len <= 0) throw ConfigError(fmt::format("dataset {}: seq_len must be > 0, got {}", origin, seq_len));
}

void check_size(uint64_t size, int64_t seq_len, const std::string& origin) {
  const uint64_t need = static_cast<uint64_t>(seq_len) + 1;
  if (size < need) {
    throw ConfigError(fmt::format("dataset {}: has {} bytes but a window of seq_len {} needs at least {} bytes; use a "
                                  "longer text or a smaller seq_len",
                                  origin, size, seq_len, need));
  }
}

}  // namespace

std::string_view data_format_name(DataFormat f) {
  switch (f) {
    case DataFormat::kText: return "text";
    case DataFormat::kLlmc: return "llmc";
    case DataFormat::kMegatron: return "megatron";
  }
  return "?";
}

Dataset::Dataset(std::shared_ptr<const void> owner, std::vector<File> files, std::vector<Segment> segments,
                 DataFormat format, int64_t seq_len, int64_t vocab_size, std::string origin)
    : owner_(std::move(owner)),
      files_(std::move(files)),
      segments_(std::move(segments)),
      format_(format),
      seq_len_(seq_len),
      vocab_size_(vocab_size),
      origin_(std::move(origin)) {
  window_ends_.reserve(segments_.size());
  uint64_t windows = 0;
  for (const Segment& s : segments_) {
    num_tokens_ += s.size;
    if (s.size > static_cast<uint64_t>(seq_len_)) windows += s.size - static_cast<uint64_t>(seq_len_);
    window_ends_.push_back(windows);
  }
}

Dataset Dataset::open(const std::string& path, int64_t seq_len) {
  const std::string origin = "'" + path + "'";
  check_seq_len(seq_len, origin);
  FdGuard fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) {
    const int err = errno;
    throw IoError(fmt::format("dataset '{}': cannot open it for reading: {}; check data.path", path,
                              zs::detail::errno_text(err)));
  }
  struct stat st {};
  ZS_SYS_CHECK(::fstat(fd.fd, &st), "dataset '{}': fstat", path);
  if (!S_ISREG(st.st_mode)) throw IoError(fmt::format("dataset '{}': not a regular file; point data.path at a text file", path));
  check_size(static_cast<uint64_t>(st.st_size), seq_len, origin);
  const auto size = static_cast<size_t>(st.st_size);
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
  if (addr == MAP_FAILED) {
    const int err = errno;
    throw IoError(fmt::format("dataset '{}': mmap of {} bytes failed: {}", path, size, zs::detail::errno_text(err)));
  }
  auto mapping = std::make_shared<const MappedFile>(addr, size);
  std::string_view bytes(mapping->data(), size);
  return Dataset(std::move(mapping), {File{reinterpret_cast<const unsigned char*>(bytes.data()), TokenType::kU8, origin}},
                 {Segment{0, 0, size}}, DataFormat::kText, seq_len, 0, origin);
}

Dataset Dataset::from_bytes(std::string_view text, int64_t seq_len, std::string origin) {
  check_seq_len(seq_len, origin);
  check_size(text.size(), seq_len, origin);
  auto copy = std::make_shared<const std::string>(text);
  const auto* p = reinterpret_cast<const unsigned char*>(copy->data());
  return Dataset(std::move(copy), {File{p, TokenType::kU8, origin}}, {Segment{0, 0, text.size()}}, DataFormat::kText,
                 seq_len, 0, std::move(origin));
}

Dataset Dataset::slice(uint64_t begin, uint64_t end, std::string origin) const {
  ZS_ASSERT(begin <= end && end <= num_tokens_, "slice [{}, {}) of {} tokens", begin, end, num_tokens_);
  if (format_ == DataFormat::kText) check_size(end - begin, seq_len_, origin);
  std::vector<Segment> part;
  uint64_t at = 0;  // position of the segment's first token
  for (const Segment& s : segments_) {
    const uint64_t b = std::max(begin, at), e = std::min(end, at + s.size);
    if (b < e) part.push_back(Segment{s.file, s.begin + (b - at), e - b});
    at += s.size;
  }
  Dataset d(owner_, files_, std::move(part), format_, seq_len_, vocab_size_, std::move(origin));
  if (d.num_windows() == 0) {
    throw ConfigError(fmt::format("dataset {}: tokens [{}, {}) hold no segment of seq_len + 1 = {} tokens", d.origin_,
                                  begin, end, seq_len_ + 1));
  }
  return d;
}

Dataset Dataset::builtin(int64_t seq_len) {
  const std::string origin = "<built-in corpus>";
  check_seq_len(seq_len, origin);
  check_size(builtin_corpus().size(), seq_len, origin);
  const auto* p = reinterpret_cast<const unsigned char*>(builtin_corpus().data());
  return Dataset(nullptr, {File{p, TokenType::kU8, origin}}, {Segment{0, 0, builtin_corpus().size()}}, DataFormat::kText,
                 seq_len, 0, origin);
}

std::string_view Dataset::bytes() const {
  ZS_ASSERT(format_ == DataFormat::kText && segments_.size() == 1, "bytes() of a {} dataset", data_format_name(format_));
  const Segment& s = segments_[0];
  return {reinterpret_cast<const char*>(files_[s.file].tokens + s.begin), s.size};
}

uint64_t Dataset::num_sampled_segments() const {
  uint64_t n = 0;
  for (const Segment& s : segments_) n += s.size > static_cast<uint64_t>(seq_len_) ? 1 : 0;
  return n;
}

std::pair<const Dataset::Segment*, uint64_t> Dataset::locate(uint64_t w) const {
  // The first segment whose cumulative end is past w.
  const auto it = std::upper_bound(window_ends_.begin(), window_ends_.end(), w);
  ZS_ASSERT(it != window_ends_.end(), "window {} of {}", w, num_windows());
  const auto i = static_cast<size_t>(it - window_ends_.begin());
  return {&segments_[i], w - (i == 0 ? 0 : window_ends_[i - 1])};
}

int32_t Dataset::token(const File& f, uint64_t i) const {
  int64_t v = 0;
  switch (f.type) {
    case TokenType::kU8: v = f.tokens[i]; break;
    case TokenType::kU16: { uint16_t x; std::memcpy(&x, f.tokens + 2 * i, 2); v = x; break; }
    case TokenType::kU32: { uint32_t x; std::memcpy(&x, f.tokens + 4 * i, 4); v = x; break; }
    case TokenType::kI32: { int32_t x; std::memcpy(&x, f.tokens + 4 * i, 4); v = x; break; }
    case TokenType::kI64: std::memcpy(&v, f.tokens + 8 * i, 8); break;
  }
  if ((v < 0 || v >= vocab_size_) && vocab_size_ > 0) [[unlikely]] {
    throw ConfigError(fmt::format("dataset {}: token {} at token position {} is outside [0, model.vocab_size = {}); "
                                  "the data were tokenized for another vocabulary: set model.vocab_size or re-tokenize",
                                  f.name, v, i, vocab_size_));
  }
  return static_cast<int32_t>(v);
}

uint64_t Dataset::window_start(uint64_t seed, uint64_t step, uint64_t global_sample) const {
  // Key by (seed, step); the counter is the global sample index. Stream 2 keeps these draws apart
  // from the uniform/normal streams used for parameter initialisation.
  const CounterRng rng(splitmix64(seed) ^ splitmix64(step ^ 0x6461746173616d70ull));  // "datasamp"
  const PhiloxCounter w = rng.block(global_sample, 2);
  const uint64_t r = (static_cast<uint64_t>(w[1]) << 32) | w[0];
  // Multiply-shift maps 64 random bits onto [0, n) with negligible bias and no division.
  return static_cast<uint64_t>((static_cast<unsigned __int128>(r) * num_windows()) >> 64);
}

int64_t Dataset::seq_len_at(uint64_t seed, uint64_t step, int64_t min_len) const {
  ZS_ASSERT(min_len >= 1 && min_len <= seq_len_, "min_len {} outside [1, {}]", min_len, seq_len_);
  if (min_len == seq_len_) return seq_len_;
  // Its own key ("seqlen") and stream 3: apart from the window draws and the initialisation streams.
  const CounterRng rng(splitmix64(seed) ^ splitmix64(step ^ 0x7365716c656eull));
  const PhiloxCounter w = rng.block(0, 3);
  const uint64_t r = (static_cast<uint64_t>(w[1]) << 32) | w[0];
  const auto span = static_cast<uint64_t>(seq_len_ - min_len + 1);
  return min_len + static_cast<int64_t>((static_cast<unsigned __int128>(r) * span) >> 64);
}

void Dataset::fill_batch(Batch& batch, uint64_t seed, uint64_t step, uint64_t first_global_sample,
                         int64_t batch_size) const {
  fill_batch(batch, seed, step, first_global_sample, batch_size, seq_len_);
}

void Dataset::fill_batch(Batch& batch, uint64_t seed, uint64_t step, uint64_t first_global_sample, int64_t batch_size,
                         int64_t length) const {
  ZS_ASSERT(batch_size > 0, "fill_batch with batch_size {}", batch_size);
  ZS_ASSERT(length >= 1 && length <= seq_len_, "fill_batch with length {} outside [1, {}]", length, seq_len_);
  const memory::Shape shape{batch_size, length};
  auto ready = [&](const Tensor& t) {
    return t.raw() != nullptr && t.dtype() == DType::kI32 && t.shape() == shape && t.is_contiguous();
  };
  if (!ready(batch.inputs)) batch.inputs = Tensor::empty(shape, DType::kI32);
  if (!ready(batch.targets)) batch.targets = Tensor::empty(shape, DType::kI32);
  int32_t* in = batch.inputs.data<int32_t>();
  int32_t* tg = batch.targets.data<int32_t>();
  for (int64_t b = 0; b < batch_size; ++b) {
    const auto [seg, offset] = locate(window_start(seed, step, first_global_sample + static_cast<uint64_t>(b)));
    const File& f = files_[seg->file];
    const uint64_t first = seg->begin + offset;
    int32_t* ib = in + b * length;
    int32_t* tb = tg + b * length;
    if (f.type == TokenType::kU8 && vocab_size_ == 0) {  // a text: bytes are tokens
      const unsigned char* w = f.tokens + first;
      for (int64_t t = 0; t < length; ++t) {
        ib[t] = w[t];
        tb[t] = w[t + 1];
      }
      continue;
    }
    ib[0] = token(f, first);
    for (int64_t t = 0; t < length; ++t) {
      tb[t] = token(f, first + static_cast<uint64_t>(t) + 1);
      if (t + 1 < length) ib[t + 1] = tb[t];
    }
  }
}

}  // namespace zs::nn
