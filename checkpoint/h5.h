// The one wrapper of the HDF5 1.10 C API: ZS_H5_CHECK and RAII handles.
//
// HDF5 reports failure with a negative return and an error stack it would otherwise print to stderr.
// H5Library (constructed once per process, before any call) turns the automatic printing off;
// ZS_H5_CHECK turns a negative return into a CheckpointError naming the file and the operation, with
// the innermost messages of HDF5's error stack folded into ours; an IoError instead when the cause is
// the storage (a full device, a read-only or forbidden directory: Note [Storage faults] in h5.cpp).
//
//   H5Handle file(ZS_H5_CHECK(H5Fopen(p.c_str(), H5F_ACC_RDONLY, fapl.get()), p, "open"), H5Fclose);
//   ZS_H5_CHECK(H5Dread(ds.get(), type, mem, file_space, H5P_DEFAULT, out), p, "read of /buffers/fp32");
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/errors.h"

namespace zs::checkpoint::h5 {

// Turns off HDF5's error printing and registers the zstd filter (zstd_filter.h); idempotent and
// thread-safe. Every entry point of this module calls it first.
void init_library();

// The text of HDF5's current error stack (innermost first, '; '-joined), cleared afterwards.
std::string error_stack_text();

[[noreturn]] void throw_h5_error(const std::filesystem::path& file, std::string_view operation, const char* src,
                                 int line);

// A move-only owner of one hid_t with its close function (H5Fclose, H5Gclose, H5Dclose, H5Sclose,
// H5Pclose, H5Aclose, H5Tclose).
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer close) : id_(id), close_(close) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), close_(o.close_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      close_ = o.close_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset() {
    if (id_ >= 0 && close_ != nullptr) close_(id_);  // close errors in a destructor cannot be reported
    id_ = H5I_INVALID_HID;
  }
  // Closes now and reports a failure (a file close flushes: its error matters).
  void close(const std::filesystem::path& file, std::string_view what);

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer close_ = nullptr;
};

// Closes a file being written that an error made worthless (a failed save's staging file): truncates
// it first, so HDF5's closing flush of its few KiB of metadata finds space even on the device that
// just filled up. (A file whose close fails stays half-open inside HDF5 1.10, which then crashes in
// its exit handler.) Never throws.
void discard_file(Handle& file, const std::filesystem::path& path) noexcept;

// Typed constructors: each checks the id and names the file and the object on failure.
Handle file_create(const std::filesystem::path& path);
Handle file_open(const std::filesystem::path& path);
Handle group_create(hid_t loc, const char* name, const std::filesystem::path& file);
Handle group_open(hid_t loc, const char* name, const std::filesystem::path& file);
Handle dataset_open(hid_t loc, const char* name, const std::filesystem::path& file);
// Refuses (CheckpointError) a chunked dataset whose chunk holds more bytes than the file and than
// kMaxChunkBytes: HDF5 allocates a whole chunk before it reads a byte, so a corrupt chunk shape would ask
// for up to 2^64 bytes (found by tests/fuzz/checkpoint_fuzz.cpp). dataset_open checks it; a reader that
// opens datasets itself calls it.
inline constexpr uint64_t kMaxChunkBytes = uint64_t{256} << 20;
inline constexpr uint64_t kMaxCheckedChunks = 4096;
void check_chunk(hid_t dataset, std::string_view name, const std::filesystem::path& file);
Handle dataspace_simple(const std::vector<hsize_t>& dims);
Handle dataset_space(hid_t dataset, const std::filesystem::path& file, std::string_view name);
Handle plist_create(hid_t cls);

bool exists(hid_t loc, const char* name, const std::filesystem::path& file);

// Attributes on `loc` (a file, group or dataset): scalars of int64, double and UTF-8 strings.
void write_attr(hid_t loc, const char* name, int64_t value, const std::filesystem::path& file);
void write_attr(hid_t loc, const char* name, double value, const std::filesystem::path& file);
void write_attr(hid_t loc, const char* name, std::string_view value, const std::filesystem::path& file);
bool has_attr(hid_t loc, const char* name, const std::filesystem::path& file);
// The attribute's class (H5T_INTEGER, H5T_FLOAT, H5T_STRING); throws CheckpointError if absent.
H5T_class_t attr_class(hid_t loc, const char* name, const std::filesystem::path& file);
int64_t read_attr_int(hid_t loc, const char* name, const std::filesystem::path& file);
double read_attr_double(hid_t loc, const char* name, const std::filesystem::path& file);
std::string read_attr_string(hid_t loc, const char* name, const std::filesystem::path& file);
// Names of the attributes on `loc`, in creation order.
std::vector<std::string> attr_names(hid_t loc, const std::filesystem::path& file);

// Small checksummed datasets (chunked, Fletcher32): a byte string (JSON text, a config) as a 1-D
// uint8 dataset, and a table of uint64 as a 2-D (rows, cols) dataset.
void write_blob(hid_t loc, const char* name, std::string_view bytes, const std::filesystem::path& file);
std::string read_blob(hid_t loc, const char* name, const std::filesystem::path& file);
void write_u64_table(hid_t loc, const char* name, const std::vector<uint64_t>& values, hsize_t cols,
                     const std::filesystem::path& file);
std::vector<uint64_t> read_u64_table(hid_t loc, const char* name, hsize_t cols, const std::filesystem::path& file);

}  // namespace zs::checkpoint::h5

// ZS_H5_CHECK(expr, file, operation): the value of `expr` (an hid_t, herr_t or htri_t), or a
// CheckpointError "<file>: <operation> failed: <HDF5's messages>" when it is negative.
#define ZS_H5_CHECK(expr, file, operation)                                          \
  ([&]() {                                                                          \
    auto zs_h5_r_ = (expr);                                                         \
    if (zs_h5_r_ < 0) [[unlikely]] {                                                \
      ::zs::checkpoint::h5::throw_h5_error((file), (operation), __FILE__, __LINE__); \
    }                                                                               \
    return zs_h5_r_;                                                                \
  }())
