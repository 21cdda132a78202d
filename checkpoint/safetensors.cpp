#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/errors.h"
#include "core/json.h"

namespace zs::checkpoint {

namespace fs = std::filesystem;
namespace json = boost::json;

// Note [safetensors checks]
// A file from elsewhere is checked whole before any tensor is read, as the safetensors library
// itself validates (its `validate` rejects the same cases): the header length must leave room in the
// file and stay under 100 MB (the library's own limit, so a corrupt length cannot make us parse
// gigabytes); every entry has a known dtype, a shape of non-negative integers and data_offsets
// [begin, end] with end - begin == numel x dtype size; sorted by begin, the entries tile the data
// section from 0 with no hole or overlap, and the last end is the data section's size, so a
// truncated or padded file is refused before a read lands past the mapping. Everything names the
// file and, where one is at fault, the tensor.

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeInfo {
  std::string_view name;
  size_t size;
  std::optional<DType> memory;
};

constexpr DTypeInfo kDTypes[] = {
    {"F32", 4, DType::kF32}, {"BF16", 2, DType::kBF16}, {"F16", 2, DType::kF16}, {"I32", 4, DType::kI32},
    {"F64", 8, {}},          {"I64", 8, {}},            {"U64", 8, {}},          {"U32", 4, {}},
    {"I16", 2, {}},          {"U16", 2, {}},            {"I8", 1, {}},           {"U8", 1, {}},
    {"BOOL", 1, {}},         {"F8_E5M2", 1, {}},        {"F8_E4M3", 1, {}},
};

const DTypeInfo* find_dtype(std::string_view name) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

[[noreturn]] void bad(const fs::path& path, std::string_view what) {
  throw CheckpointError(fmt::format("safetensors file '{}': {}", path.string(), what));
}

uint64_t checked_numel(std::span<const int64_t> shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

std::string shape_text(std::span<const int64_t> shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

SafetensorsTensor parse_entry(const fs::path& path, const std::string& name, const json::value& v) {
  const json::object* o = v.if_object();
  if (o == nullptr) bad(path, fmt::format("tensor '{}': header entry is not an object", printable(name)));
  SafetensorsTensor t;
  t.name = name;
  const json::value* dt = o->if_contains("dtype");
  const json::value* sh = o->if_contains("shape");
  const json::value* off = o->if_contains("data_offsets");
  if (dt == nullptr || !dt->is_string() || sh == nullptr || !sh->is_array() || off == nullptr || !off->is_array()) {
    bad(path, fmt::format("tensor '{}': an entry needs \"dtype\" (string), \"shape\" and \"data_offsets\" (arrays)",
                          printable(name)));
  }
  t.dtype = std::string(dt->as_string());
  const DTypeInfo* info = find_dtype(t.dtype);
  if (info == nullptr) bad(path, fmt::format("tensor '{}': unknown dtype '{}'", printable(name), printable(t.dtype)));
  uint64_t numel = 1;
  for (const json::value& d : sh->as_array()) {
    if (!d.is_int64() && !d.is_uint64()) bad(path, fmt::format("tensor '{}': shape holds a non-integer", printable(name)));
    const int64_t e = d.is_int64() ? d.as_int64() : static_cast<int64_t>(d.as_uint64());
    if (e < 0 || (e > 0 && numel > (uint64_t{1} << 62) / static_cast<uint64_t>(e))) {
      bad(path, fmt::format("tensor '{}': shape dimension {} out of range", printable(name), e));
    }
    numel *= static_cast<uint64_t>(e);
    t.shape.push_back(e);
  }
  const json::array& oa = off->as_array();
  if (oa.size() != 2 || !(oa[0].is_uint64() || oa[0].is_int64()) || !(oa[1].is_uint64() || oa[1].is_int64()) ||
      (oa[0].is_int64() && oa[0].as_int64() < 0) || (oa[1].is_int64() && oa[1].as_int64() < 0)) {
    bad(path, fmt::format("tensor '{}': data_offsets must be two non-negative integers", printable(name)));
  }
  t.begin = oa[0].to_number<uint64_t>();
  t.end = oa[1].to_number<uint64_t>();
  if (t.end < t.begin || t.end - t.begin != numel * info->size) {
    bad(path, fmt::format("tensor '{}': data_offsets [{}, {}] hold {} bytes but shape {} of {} needs {}", printable(name),
                          t.begin, t.end, t.end - t.begin, shape_text(t.shape), t.dtype, numel * info->size));
  }
  return t;
}

// Scoped descriptor.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

uint64_t SafetensorsTensor::numel() const { return checked_numel(shape); }
uint64_t SafetensorsSpec::numel() const { return checked_numel(shape); }

std::optional<DType> safetensors_dtype(std::string_view name) {
  const DTypeInfo* d = find_dtype(name);
  return d != nullptr ? d->memory : std::nullopt;
}

std::string_view safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kI32: return "I32";
  }
  ZS_ASSERT(false, "dtype {}", static_cast<int>(t));
}

// ---- SafetensorsFile -----------------------------------------------------------------------------

struct SafetensorsFile::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  const char* data = nullptr;  // the data section
  ~Mapping() {
    if (addr != nullptr) ::munmap(addr, size);
  }
};

SafetensorsFile::SafetensorsFile(const fs::path& path) : path_(path), map_(std::make_unique<Mapping>()) {
  Fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) {
    const int err = errno;
    throw IoError(fmt::format("safetensors file '{}': cannot open it for reading: {}", path.string(), zs::detail::errno_text(err)));
  }
  struct stat st {};
  ZS_SYS_CHECK(::fstat(fd.fd, &st), "fstat of '{}'", path.string());
  if (!S_ISREG(st.st_mode)) bad(path, "not a regular file");
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < 8) bad(path, fmt::format("{} bytes: too short for the 8-byte header length (truncated?)", size));
  map_->size = size;
  map_->addr = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.fd, 0);
  if (map_->addr == MAP_FAILED) {
    map_->addr = nullptr;
    const int err = errno;
    throw IoError(fmt::format("safetensors file '{}': mmap of {} bytes failed: {}", path.string(), size, zs::detail::errno_text(err)));
  }
  const auto* base = static_cast<const unsigned char*>(map_->addr);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | base[i];
  if (n > kMaxHeaderBytes || n > size - 8) {
    bad(path, fmt::format("header length {} is out of range (file of {} bytes, limit {}): not a safetensors file or "
                          "truncated", n, size, kMaxHeaderBytes));
  }
  json::value header;
  try {
    header = parse_json_text(std::string_view(reinterpret_cast<const char*>(base) + 8, n), path.string());
  } catch (const ConfigError& e) {
    bad(path, fmt::format("header is not valid JSON: {}", e.what()));
  }
  if (!header.is_object()) bad(path, "header is not a JSON object");
  for (const auto& [key, value] : header.as_object()) {
    const std::string name(key);
    if (name == "__metadata__") {
      if (!value.is_object()) bad(path, "__metadata__ is not an object");
      for (const auto& [mk, mv] : value.as_object()) {
        if (!mv.is_string()) bad(path, fmt::format("__metadata__.{}: values must be strings", printable(std::string(mk))));
        metadata_[std::string(mk)] = std::string(mv.as_string());
      }
      continue;
    }
    tensors_.push_back(parse_entry(path, name, value));
  }
  std::sort(tensors_.begin(), tensors_.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const uint64_t data_size = size - 8 - n;
  uint64_t at = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const SafetensorsTensor& t = tensors_[i];
    if (t.begin != at) {
      bad(path, fmt::format("tensor '{}': data_offsets start at {} where the previous tensor ends at {} ({})",
                            printable(t.name), t.begin, at, t.begin < at ? "overlap" : "hole"));
    }
    if (t.end > data_size) {
      bad(path, fmt::format("tensor '{}': data_offsets end at {} past the data section's {} bytes (truncated file?)",
                            printable(t.name), t.end, data_size));
    }
    at = t.end;
    index_.emplace(t.name, i);
  }
  if (at != data_size) {
    bad(path, fmt::format("the data section has {} bytes but its tensors cover {}", data_size, at));
  }
  map_->data = reinterpret_cast<const char*>(base) + 8 + n;
}

SafetensorsFile::~SafetensorsFile() = default;
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsFile::read(const SafetensorsTensor& t, uint64_t first, uint64_t count, DType out_dtype, void* out) const {
  const std::optional<DType> src = safetensors_dtype(t.dtype);
  if (!src || ((*src == DType::kI32) != (out_dtype == DType::kI32))) {
    bad(path_, fmt::format("tensor '{}': dtype {} cannot be read as {}", printable(t.name), t.dtype,
                           memory::dtype_name(out_dtype)));
  }
  if (first > t.numel() || count > t.numel() - first) {
    throw UsageError(fmt::format("safetensors file '{}': tensor '{}': elements [{}, {}) past its {} elements",
                                 path_.string(), printable(t.name), first, first + count, t.numel()));
  }
  const size_t es = memory::dtype_size(*src);
  const char* p = map_->data + t.begin + first * es;
  // The data section need not be aligned for the element type (the header's length is any number):
  // convert an unaligned range through an aligned bounce buffer, in pieces.
  if (reinterpret_cast<uintptr_t>(p) % es == 0) {
    memory::convert(p, *src, out, out_dtype, count);
    return;
  }
  constexpr size_t kPiece = 4096;
  alignas(64) char tmp[kPiece * 4];
  auto* o = static_cast<char*>(out);
  for (uint64_t i = 0; i < count; i += kPiece) {
    const size_t m = static_cast<size_t>(std::min<uint64_t>(kPiece, count - i));
    std::memcpy(tmp, p + i * es, m * es);
    memory::convert(tmp, *src, o + i * memory::dtype_size(out_dtype), out_dtype, m);
  }
}

// ---- SafetensorsReader ---------------------------------------------------------------------------

namespace {

constexpr std::string_view kIndexName = "model.safetensors.index.json";
constexpr std::string_view kSingleName = "model.safetensors";

}  // namespace

SafetensorsReader::SafetensorsReader(const fs::path& path) : origin_(path) {
  fs::path index, single;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(path / kIndexName, ec)) {
      index = path / kIndexName;
    } else if (fs::exists(path / kSingleName, ec)) {
      single = path / kSingleName;
    } else {
      throw CheckpointError(fmt::format("safetensors model '{}': the directory holds neither {} nor {}", path.string(),
                                        kIndexName, kSingleName));
    }
  } else if (path.extension() == ".json") {
    index = path;
  } else {
    single = path;
  }
  if (!single.empty()) {
    files_.emplace_back(single);
    for (const SafetensorsTensor& t : files_.back().tensors()) where_.emplace(t.name, 0);
    return;
  }
  json::value doc;
  try {
    doc = parse_json_file(index);
  } catch (const ConfigError& e) {
    throw CheckpointError(fmt::format("safetensors index '{}': {}", index.string(), e.what()));
  }
  const json::value* wm = doc.is_object() ? doc.as_object().if_contains("weight_map") : nullptr;
  if (wm == nullptr || !wm->is_object()) {
    throw CheckpointError(fmt::format("safetensors index '{}': no \"weight_map\" object", index.string()));
  }
  std::map<std::string, size_t> file_index;
  std::map<std::string, std::string> expected;  // tensor -> file name
  for (const auto& [name, file] : wm->as_object()) {
    if (!file.is_string()) {
      throw CheckpointError(fmt::format("safetensors index '{}': weight_map.{} is not a file name", index.string(),
                                        printable(std::string(name))));
    }
    const std::string f(file.as_string());
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
      throw CheckpointError(fmt::format("safetensors index '{}': weight_map.{}: '{}' is not a file beside the index",
                                        index.string(), printable(std::string(name)), printable(f)));
    }
    if (!file_index.contains(f)) {
      file_index.emplace(f, files_.size());
      files_.emplace_back(index.parent_path() / f);
    }
    where_.emplace(std::string(name), file_index.at(f));
    expected.emplace(std::string(name), f);
  }
  // Each file holds exactly what the index gives it.
  for (const auto& [name, fi] : where_) {
    if (files_[fi].find(name) == nullptr) {
      throw CheckpointError(fmt::format("safetensors file '{}': tensor '{}' is missing (the index '{}' places it there)",
                                        files_[fi].path().string(), printable(name), index.string()));
    }
  }
  for (size_t fi = 0; fi < files_.size(); ++fi) {
    for (const SafetensorsTensor& t : files_[fi].tensors()) {
      auto it = where_.find(t.name);
      if (it == where_.end() || it->second != fi) {
        throw CheckpointError(fmt::format("safetensors file '{}': tensor '{}' is not in the index '{}' for this file",
                                          files_[fi].path().string(), printable(t.name), index.string()));
      }
    }
  }
}

SafetensorsReader::~SafetensorsReader() = default;
SafetensorsReader::SafetensorsReader(SafetensorsReader&&) noexcept = default;
SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&&) noexcept = default;

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, fi] : where_) out.push_back(name);
  return out;
}

bool SafetensorsReader::contains(std::string_view name) const { return where_.find(name) != where_.end(); }

const SafetensorsFile& SafetensorsReader::file_of(std::string_view name) const {
  auto it = where_.find(name);
  if (it == where_.end()) {
    throw CheckpointError(fmt::format("safetensors model '{}': tensor '{}' is missing", origin_.string(), printable(name)));
  }
  return files_[it->second];
}

const SafetensorsTensor& SafetensorsReader::tensor(std::string_view name) const { return *file_of(name).find(name); }

void SafetensorsReader::expect(std::string_view name, std::span<const int64_t> shape) const {
  const SafetensorsFile& f = file_of(name);
  const SafetensorsTensor& t = *f.find(name);
  if (!std::equal(t.shape.begin(), t.shape.end(), shape.begin(), shape.end())) {
    bad(f.path(), fmt::format("tensor '{}': shape {} where the model needs {}", printable(name), shape_text(t.shape),
                              shape_text(shape)));
  }
  const std::optional<DType> d = safetensors_dtype(t.dtype);
  if (!d || *d == DType::kI32) {
    bad(f.path(), fmt::format("tensor '{}': dtype {} where the model needs F32, BF16 or F16", printable(name), t.dtype));
  }
}

void SafetensorsReader::read(std::string_view name, uint64_t first, uint64_t count, DType out_dtype, void* out) const {
  const SafetensorsFile& f = file_of(name);
  f.read(*f.find(name), first, count, out_dtype, out);
}

}  // namespace zs::checkpoint
