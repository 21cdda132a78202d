// Writing safetensors in bounded memory: SafetensorsWriter and write_safetensors_model.
#include <fcntl.h>
#include <unistd.h>

#include <boost/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "checkpoint/safetensors.h"
#include "core/errors.h"

namespace zs::checkpoint {

namespace fs = std::filesystem;
namespace json = boost::json;

namespace {

constexpr size_t kBufferBytes = size_t{4} << 20;  // write-behind buffer: the writer's whole footprint

void write_all(int fd, const char* p, size_t n, const fs::path& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    ZS_SYS_CHECK(w < 0 ? -1 : 0, "write of '{}'", path.string());
    p += w;
    n -= static_cast<size_t>(w);
  }
}

std::string header_text(const std::vector<SafetensorsSpec>& tensors, const std::map<std::string, std::string>& metadata) {
  json::object h;
  if (!metadata.empty()) {
    json::object m;
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = std::move(m);
  }
  uint64_t at = 0;
  for (const SafetensorsSpec& s : tensors) {
    if (h.contains(s.name)) throw UsageError(fmt::format("safetensors: tensor '{}' given twice", s.name));
    json::array shape;
    for (int64_t d : s.shape) shape.push_back(d);
    h[s.name] = json::object{{"dtype", safetensors_dtype_name(s.dtype)},
                             {"shape", std::move(shape)},
                             {"data_offsets", json::array{at, at + s.bytes()}}};
    at += s.bytes();
  }
  std::string text = json::serialize(h);
  // Padded with spaces so the data section starts 8-byte aligned (as the safetensors library does).
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

SafetensorsWriter::SafetensorsWriter(fs::path path, std::vector<SafetensorsSpec> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), tmp_(path_.string() + ".tmp"), tensors_(std::move(tensors)) {
  for (const SafetensorsSpec& s : tensors_) {
    for (int64_t d : s.shape) {
      if (d < 0) throw UsageError(fmt::format("safetensors: tensor '{}' has a negative dimension {}", s.name, d));
    }
  }
  const std::string header = header_text(tensors_, metadata);
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int err = errno;
    throw IoError(fmt::format("safetensors file '{}': cannot create it: {}", tmp_.string(), zs::detail::errno_text(err)));
  }
  buffer_.reserve(kBufferBytes);
  unsigned char len[8];
  uint64_t n = header.size();
  for (unsigned char& b : len) {
    b = static_cast<unsigned char>(n & 0xff);
    n >>= 8;
  }
  write_bytes(len, 8);
  write_bytes(header.data(), header.size());
  while (current_ < tensors_.size() && tensors_[current_].numel() == 0) ++current_;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    std::error_code ec;
    fs::remove(tmp_, ec);
  }
}

void SafetensorsWriter::write_bytes(const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  if (buffer_.size() + n > kBufferBytes) {
    write_all(fd_, buffer_.data(), buffer_.size(), tmp_);
    buffer_.clear();
  }
  if (n >= kBufferBytes) {
    write_all(fd_, p, n, tmp_);
    return;
  }
  buffer_.insert(buffer_.end(), p, p + n);
}

void SafetensorsWriter::append(const void* src, DType src_dtype, uint64_t count) {
  const auto* s = static_cast<const char*>(src);
  constexpr uint64_t kPiece = 16384;
  alignas(64) char tmp[kPiece * 4];
  while (count > 0) {
    if (current_ >= tensors_.size()) {
      throw UsageError(fmt::format("safetensors file '{}': {} elements appended past the last tensor", path_.string(), count));
    }
    const SafetensorsSpec& t = tensors_[current_];
    const uint64_t n = std::min({count, t.numel() - written_, kPiece});
    memory::convert(s, src_dtype, tmp, t.dtype, n);
    write_bytes(tmp, n * memory::dtype_size(t.dtype));
    s += n * memory::dtype_size(src_dtype);
    count -= n;
    written_ += n;
    total_written_ += n;
    if (written_ == t.numel()) {
      written_ = 0;
      ++current_;
      while (current_ < tensors_.size() && tensors_[current_].numel() == 0) ++current_;
    }
  }
}

void SafetensorsWriter::finish() {
  if (current_ < tensors_.size()) {
    throw UsageError(fmt::format("safetensors file '{}': tensor '{}' has {} of its {} elements written", path_.string(),
                                 tensors_[current_].name, written_, tensors_[current_].numel()));
  }
  write_all(fd_, buffer_.data(), buffer_.size(), tmp_);
  buffer_.clear();
  ZS_SYS_CHECK(::fsync(fd_), "fsync of '{}'", tmp_.string());
  const int fd = fd_;
  fd_ = -1;
  ZS_SYS_CHECK(::close(fd), "close of '{}'", tmp_.string());
  std::error_code ec;
  fs::rename(tmp_, path_, ec);
  if (ec) throw IoError(fmt::format("safetensors file '{}': rename from '{}': {}", path_.string(), tmp_.string(), ec.message()));
}

std::vector<fs::path> write_safetensors_model(const fs::path& dir, const std::vector<SafetensorsSpec>& specs,
                                              const std::map<std::string, std::string>& metadata,
                                              uint64_t max_shard_bytes,
                                              const std::function<void(const SafetensorsSpec&, SafetensorsWriter&)>& fill) {
  // Greedy split in spec order, as transformers' shard_checkpoint does.
  std::vector<std::vector<SafetensorsSpec>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (const SafetensorsSpec& s : specs) {
    if (!shards.back().empty() && in_shard + s.bytes() > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(s);
    in_shard += s.bytes();
    total += s.bytes();
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError(fmt::format("safetensors model '{}': cannot create the directory: {}", dir.string(), ec.message()));
  std::vector<fs::path> written;
  json::object weight_map;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = shards.size() == 1 ? std::string("model.safetensors")
                                                : fmt::format("model-{:05}-of-{:05}.safetensors", i + 1, shards.size());
    SafetensorsWriter w(dir / name, shards[i], metadata);
    uint64_t expected = 0;
    for (const SafetensorsSpec& s : shards[i]) {
      fill(s, w);
      expected += s.numel();
      if (w.elements_written() != expected) {
        throw UsageError(fmt::format("safetensors file '{}': tensor '{}' was given {} elements, not {}", w.path().string(),
                                     s.name, w.elements_written() - (expected - s.numel()), s.numel()));
      }
      weight_map[s.name] = name;
    }
    w.finish();
    written.push_back(dir / name);
  }
  if (shards.size() > 1) {
    json::object index{{"metadata", json::object{{"total_size", total}}}, {"weight_map", std::move(weight_map)}};
    const fs::path p = dir / "model.safetensors.index.json";
    const std::string text = json::serialize(index) + "\n";
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      const int err = errno;
      throw IoError(fmt::format("safetensors index '{}': cannot create it: {}", p.string(), zs::detail::errno_text(err)));
    }
    write_all(fd, text.data(), text.size(), p);
    ZS_SYS_CHECK(::close(fd), "close of '{}'", p.string());
    written.push_back(p);
  }
  return written;
}

}  // namespace zs::checkpoint
