#include "engine/detail/event_file.h"

#include <array>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "core/errors.h"

namespace zs::engine::detail {
namespace {

constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrcTable = make_crc_table();

uint32_t masked_crc(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// Protobuf wire format: varints, and fields as (number << 3 | wire type).
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_tag(std::string& out, int field, int wire_type) { put_varint(out, static_cast<uint64_t>(field << 3 | wire_type)); }
template <typename T>
void put_fixed(std::string& out, T v) {  // little-endian, as x86 and arm64 store it
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

std::string event_header(int64_t step, double wall_time) {
  std::string e;
  put_tag(e, 1, 1);
  put_fixed(e, wall_time);
  put_tag(e, 2, 0);
  put_varint(e, static_cast<uint64_t>(step));
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) c = kCrcTable[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

EventFile::EventFile(std::string path, std::string config_key)
    : path_(std::move(path)), config_key_(std::move(config_key)) {
  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr) {
    throw IoError(fmt::format("{}: cannot create the TensorBoard event file '{}': {}; set {} to a writable directory",
                              config_key_, path_, std::strerror(errno), config_key_));
  }
  std::string e = event_header(0, 0.0);
  put_bytes(e, 3, "brain.Event:2");
  write_record(e);
}

EventFile::~EventFile() {
  if (file_ != nullptr) std::fclose(file_);
}

void EventFile::add_scalars(int64_t step, double wall_time, const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes(v, 1, tag);
    put_tag(v, 2, 5);
    put_fixed(v, static_cast<float>(value));
    put_bytes(summary, 1, v);
  }
  std::string e = event_header(step, wall_time);
  put_bytes(e, 5, summary);
  write_record(e);
}

void EventFile::write_record(std::string_view data) {
  std::string r;
  const uint64_t length = data.size();
  put_fixed(r, length);
  put_fixed(r, masked_crc(r.data(), 8));
  r.append(data);
  put_fixed(r, masked_crc(data.data(), data.size()));
  if (std::fwrite(r.data(), 1, r.size(), file_) != r.size() || std::fflush(file_) != 0) {
    throw IoError(fmt::format("{}: cannot write the TensorBoard event file '{}': {}; check the disk and {}", config_key_,
                              path_, std::strerror(errno), config_key_));
  }
}

}  // namespace zs::engine::detail
