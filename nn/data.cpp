#include "nn/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "core/errors.h"
#include "core/rng.h"

namespace zs::nn {

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

// A read-only private mapping of a whole file, unmapped when the last Dataset copy goes.
class MappedFile {
 public:
  MappedFile(void* addr, size_t size) : addr_(addr), size_(size) {}
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() { ::munmap(addr_, size_); }
  const char* data() const { return static_cast<const char*>(addr_); }

 private:
  void* addr_;
  size_t size_;
};

// Closes a descriptor on every path out of open().
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

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

Dataset::Dataset(std::shared_ptr<const void> owner, std::string_view bytes, int64_t seq_len, std::string origin)
    : owner_(std::move(owner)), bytes_(bytes), seq_len_(seq_len), origin_(std::move(origin)) {}

Dataset Dataset::open(const std::string& path, int64_t seq_len) {
  const std::string origin = "'" + path + "'";
  check_seq_len(seq_len, origin);
  FdGuard fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) {
    const int err = errno;
    throw IoError(fmt::format("dataset '{}': cannot open it for reading: {}; check data.path", path,
                              detail::errno_text(err)));
  }
  struct stat st {};
  ZS_SYS_CHECK(::fstat(fd.fd, &st), "dataset '{}': fstat", path);
  if (!S_ISREG(st.st_mode)) throw IoError(fmt::format("dataset '{}': not a regular file; point data.path at a text file", path));
  check_size(static_cast<uint64_t>(st.st_size), seq_len, origin);
  const auto size = static_cast<size_t>(st.st_size);
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
  if (addr == MAP_FAILED) {
    const int err = errno;
    throw IoError(fmt::format("dataset '{}': mmap of {} bytes failed: {}", path, size, detail::errno_text(err)));
  }
  auto mapping = std::make_shared<const MappedFile>(addr, size);
  std::string_view bytes(mapping->data(), size);
  return Dataset(std::move(mapping), bytes, seq_len, origin);
}

Dataset Dataset::from_bytes(std::string_view text, int64_t seq_len, std::string origin) {
  check_seq_len(seq_len, origin);
  check_size(text.size(), seq_len, origin);
  auto copy = std::make_shared<const std::string>(text);
  std::string_view bytes(*copy);
  return Dataset(std::move(copy), bytes, seq_len, std::move(origin));
}

Dataset Dataset::slice(uint64_t begin, uint64_t end, std::string origin) const {
  ZS_ASSERT(begin <= end && end <= bytes_.size(), "slice [{}, {}) of {} bytes", begin, end, bytes_.size());
  check_size(end - begin, seq_len_, origin);
  return Dataset(owner_, bytes_.substr(begin, end - begin), seq_len_, std::move(origin));
}

Dataset Dataset::builtin(int64_t seq_len) {
  const std::string origin = "<built-in corpus>";
  check_seq_len(seq_len, origin);
  check_size(builtin_corpus().size(), seq_len, origin);
  return Dataset(nullptr, builtin_corpus(), seq_len, origin);
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
  const auto* text = reinterpret_cast<const unsigned char*>(bytes_.data());
  for (int64_t b = 0; b < batch_size; ++b) {
    const unsigned char* w = text + window_start(seed, step, first_global_sample + static_cast<uint64_t>(b));
    int32_t* ib = in + b * length;
    int32_t* tb = tg + b * length;
    for (int64_t t = 0; t < length; ++t) {
      ib[t] = w[t];
      tb[t] = w[t + 1];
    }
  }
}

}  // namespace zs::nn
