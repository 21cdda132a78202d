// EventFile: a TensorBoard event file of scalar summaries, written without a protobuf dependency.
//
// Note [TensorBoard event file]
// The file is a TFRecord stream: each record is uint64 length (little-endian), the masked CRC32C of
// those 8 bytes, the data, the masked CRC32C of the data (mask: rotate right by 15, add 0xa282ead8).
// The data is a serialized tensorflow `Event`; this writer emits only the subset TensorBoard reads
// for scalars: wall_time (double, field 1), step (int64, field 2), file_version "brain.Event:2"
// (string, field 3; the first record alone), summary (field 5) = Summary { repeated Value (field 1)
// { tag (string, field 1), simple_value (float, field 2) } }. Hand-encoding these five fields is a
// few dozen lines; tests/engine/monitor_test.cpp reads the file back with its own decoder.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zs::engine::detail {

// CRC32C (Castagnoli), as TFRecord uses it.
uint32_t crc32c(const void* data, size_t n);

class EventFile {
 public:
  // Creates `path` (truncating) and writes the file_version record; throws IoError naming the path
  // and `config_key` when the file cannot be written.
  EventFile(std::string path, std::string config_key);
  ~EventFile();
  EventFile(const EventFile&) = delete;
  EventFile& operator=(const EventFile&) = delete;

  // One Event at `step` holding one scalar per (tag, value); flushed, so a reader sees it at once.
  void add_scalars(int64_t step, double wall_time, const std::vector<std::pair<std::string, double>>& scalars);
  const std::string& path() const { return path_; }

 private:
  void write_record(std::string_view data);

  std::string path_;
  std::string config_key_;
  std::FILE* file_ = nullptr;
};

}  // namespace zs::engine::detail
