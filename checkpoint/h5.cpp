// Note [HDF5 errors]: HDF5 pushes a stack of messages (API call outermost, the cause innermost) and,
// by default, prints it to stderr from whichever thread failed. We switch printing off once and read
// the stack at the failure instead, so the message reaches the user inside the CheckpointError that
// names our file and operation, and nothing is printed behind the caller's back.
#include "checkpoint/h5.h"

#include <fmt/format.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <mutex>
#include <span>

#include "checkpoint/format.h"
#include "checkpoint/zstd_filter.h"

namespace zs::checkpoint::h5 {

void init_library() {
  static std::once_flag once;
  std::call_once(once, [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    register_zstd_filter();
  });
}

namespace {

herr_t collect_error(unsigned n, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::vector<std::string>*>(data);
  if (n < 3 && err->desc != nullptr && err->desc[0] != '\0') out->emplace_back(err->desc);
  return 0;
}

}  // namespace

std::string error_stack_text() {
  std::vector<std::string> messages;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_error, &messages);
  H5Eclear2(H5E_DEFAULT);
  if (messages.empty()) return "no message from HDF5";
  return fmt::format("{}", fmt::join(messages, "; "));
}

// Note [Storage faults]: a full or read-only filesystem is the storage's fault, not the checkpoint's:
// HDF5's POSIX driver puts errno into its innermost message ("errno = 28, error message = 'No space
// left on device'"), and we raise that as an IoError naming the file, the operation (with its bytes)
// and the space left, so the user knows to free space or save elsewhere; the save stops before its
// commit, so `latest` still names the previous tag.
void throw_h5_error(const std::filesystem::path& file, std::string_view operation, const char* src, int line) {
  std::string stack = error_stack_text();
  auto has = [&](std::string_view s) { return stack.find(s) != std::string::npos; };
  if (has("errno = 28,") || has("errno = 122,")) {
    struct statvfs fs{};
    std::filesystem::path dir = file.has_parent_path() ? file.parent_path() : std::filesystem::path(".");
    std::string free_text = ::statvfs(dir.c_str(), &fs) == 0
                                ? fmt::format("{} bytes free", static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize)
                                : std::string("free space unknown");
    throw IoError(fmt::format("checkpoint file '{}': {} failed: no space left on the device ({} on the filesystem "
                              "of '{}'): free space or save elsewhere (hdf5: {}; at {}:{})",
                              file.string(), operation, free_text, dir.string(), stack, src, line));
  }
  if (has("errno = 13,") || has("errno = 30,") || has("errno = 1,")) {
    throw IoError(fmt::format("checkpoint file '{}': {} failed: the directory is not writable (permission denied or "
                              "a read-only filesystem) (hdf5: {}; at {}:{})",
                              file.string(), operation, stack, src, line));
  }
  throw CheckpointError(
      fmt::format("checkpoint file '{}': {} failed: {} (hdf5 at {}:{})", file.string(), operation, stack, src, line));
}

void Handle::close(const std::filesystem::path& file, std::string_view what) {
  if (id_ < 0) return;
  hid_t id = std::exchange(id_, H5I_INVALID_HID);
  ZS_H5_CHECK(close_(id), file, fmt::format("close of {}", what));
}

void discard_file(Handle& file, const std::filesystem::path& path) noexcept {
  if (!file.valid()) return;
  (void)::truncate(path.c_str(), 0);
  file.reset();
  H5Eclear2(H5E_DEFAULT);
}

Handle file_create(const std::filesystem::path& path) {
  init_library();
  // Format 1.8+ objects carry checksums on their metadata (superblock v2, object header v2), so a
  // flipped byte in an index or an attribute is caught as well as one in the chunked data.
  Handle fapl(ZS_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS), path, "file access list"), H5Pclose);
  ZS_H5_CHECK(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST), path, "set format bounds");
  // Large objects (the data chunks) on page boundaries: Note [Page phase] in format.h.
  ZS_H5_CHECK(H5Pset_alignment(fapl.get(), kPageAlignMinBytes, kPageBytes), path, "set alignment");
  return Handle(ZS_H5_CHECK(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl.get()), path, "create"),
                H5Fclose);
}

Handle file_open(const std::filesystem::path& path) {
  init_library();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw CheckpointError(fmt::format("checkpoint file '{}' is missing", path.string()));
  }
  htri_t is_h5 = H5Fis_hdf5(path.c_str());
  if (is_h5 <= 0) {
    H5Eclear2(H5E_DEFAULT);
    throw CheckpointError(
        fmt::format("checkpoint file '{}' is not an HDF5 file (truncated or overwritten)", path.string()));
  }
  return Handle(ZS_H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), path, "open (truncated or corrupt?)"),
                H5Fclose);
}

Handle group_create(hid_t loc, const char* name, const std::filesystem::path& file) {
  return Handle(ZS_H5_CHECK(H5Gcreate2(loc, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), file,
                            fmt::format("create of group '{}'", name)),
                H5Gclose);
}

Handle group_open(hid_t loc, const char* name, const std::filesystem::path& file) {
  if (!exists(loc, name, file)) {
    throw CheckpointError(fmt::format("checkpoint file '{}' has no group '{}'", file.string(), name));
  }
  return Handle(ZS_H5_CHECK(H5Gopen2(loc, name, H5P_DEFAULT), file, fmt::format("open of group '{}'", name)),
                H5Gclose);
}

Handle dataset_open(hid_t loc, const char* name, const std::filesystem::path& file) {
  if (!exists(loc, name, file)) {
    throw CheckpointError(fmt::format("checkpoint file '{}' has no dataset '{}'", file.string(), name));
  }
  Handle ds(ZS_H5_CHECK(H5Dopen2(loc, name, H5P_DEFAULT), file, fmt::format("open of dataset '{}'", name)), H5Dclose);
  check_chunk(ds.get(), name, file);
  return ds;
}

void check_chunk(hid_t dataset, std::string_view name, const std::filesystem::path& file) {
  Handle dcpl(ZS_H5_CHECK(H5Dget_create_plist(dataset), file, fmt::format("creation properties of '{}'", name)),
              H5Pclose);
  if (H5Pget_layout(dcpl.get()) != H5D_CHUNKED) return;
  hsize_t dims[H5S_MAX_RANK] = {};
  const int rank = ZS_H5_CHECK(H5Pget_chunk(dcpl.get(), H5S_MAX_RANK, dims), file, fmt::format("chunk of '{}'", name));
  Handle type(ZS_H5_CHECK(H5Dget_type(dataset), file, fmt::format("type of '{}'", name)), H5Tclose);
  unsigned __int128 bytes = H5Tget_size(type.get());
  for (int i = 0; i < rank; ++i) bytes *= dims[i];
  std::error_code ec;
  const uintmax_t file_bytes = std::filesystem::file_size(file, ec);
  if (ec || bytes > std::max<uintmax_t>(file_bytes, kMaxChunkBytes)) {
    throw CheckpointError(fmt::format("checkpoint file '{}': dataset '{}' has chunks of {} elements, more than the "
                                      "file's {} bytes (and than any chunk zeroshard writes): the file is corrupt",
                                      file.string(), name, fmt::join(std::span(dims, static_cast<size_t>(std::max(rank, 0))), " x "),
                                      ec ? 0 : file_bytes));
  }
  // HDF5 also allocates a filtered chunk's stored size, taken from the chunk index, before reading it:
  // every chunk must lie inside the file. Checked for datasets of up to kMaxCheckedChunks chunks (the
  // metadata's, and small buffers); H5Dget_chunk_info is a lookup per chunk.
  Handle space(ZS_H5_CHECK(H5Dget_space(dataset), file, fmt::format("dataspace of '{}'", name)), H5Sclose);
  hsize_t chunks = 0;
  ZS_H5_CHECK(H5Dget_num_chunks(dataset, space.get(), &chunks), file, fmt::format("chunks of '{}'", name));
  if (chunks > kMaxCheckedChunks) return;
  for (hsize_t i = 0; i < chunks; ++i) {
    hsize_t offset[H5S_MAX_RANK] = {};
    unsigned mask = 0;
    haddr_t addr = 0;
    hsize_t size = 0;
    ZS_H5_CHECK(H5Dget_chunk_info(dataset, space.get(), i, offset, &mask, &addr, &size), file,
                fmt::format("chunk {} of '{}'", i, name));
    if (addr == HADDR_UNDEF || size > file_bytes || addr > file_bytes - size) {
      throw CheckpointError(fmt::format("checkpoint file '{}': chunk {} of dataset '{}' ({} bytes at {}) lies outside the "
                                        "file's {} bytes: the file is corrupt",
                                        file.string(), i, name, size, addr, file_bytes));
    }
  }
}

Handle dataspace_simple(const std::vector<hsize_t>& dims) {
  if (dims.empty()) return Handle(ZS_H5_CHECK(H5Screate(H5S_SCALAR), "", "scalar dataspace"), H5Sclose);
  return Handle(ZS_H5_CHECK(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), "", "dataspace"),
                H5Sclose);
}

Handle dataset_space(hid_t dataset, const std::filesystem::path& file, std::string_view name) {
  return Handle(ZS_H5_CHECK(H5Dget_space(dataset), file, fmt::format("dataspace of '{}'", name)), H5Sclose);
}

Handle plist_create(hid_t cls) {
  return Handle(ZS_H5_CHECK(H5Pcreate(cls), "", "property list"), H5Pclose);
}

bool exists(hid_t loc, const char* name, const std::filesystem::path& file) {
  return ZS_H5_CHECK(H5Lexists(loc, name, H5P_DEFAULT), file, fmt::format("lookup of '{}'", name)) > 0;
}

namespace {

void write_attr_raw(hid_t loc, const char* name, hid_t type, const void* value, const std::filesystem::path& file) {
  Handle space = dataspace_simple({});
  Handle attr(ZS_H5_CHECK(H5Acreate2(loc, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT), file,
                          fmt::format("create of attribute '{}'", name)),
              H5Aclose);
  ZS_H5_CHECK(H5Awrite(attr.get(), type, value), file, fmt::format("write of attribute '{}'", name));
}

Handle open_attr(hid_t loc, const char* name, const std::filesystem::path& file) {
  if (!has_attr(loc, name, file)) {
    throw CheckpointError(fmt::format("checkpoint file '{}' has no attribute '{}'", file.string(), name));
  }
  return Handle(ZS_H5_CHECK(H5Aopen(loc, name, H5P_DEFAULT), file, fmt::format("open of attribute '{}'", name)),
                H5Aclose);
}

void expect_class(hid_t attr, H5T_class_t want, const char* name, const std::filesystem::path& file) {
  Handle type(ZS_H5_CHECK(H5Aget_type(attr), file, fmt::format("type of attribute '{}'", name)), H5Tclose);
  if (H5Tget_class(type.get()) != want) {
    throw CheckpointError(fmt::format("checkpoint file '{}': attribute '{}' has the wrong type", file.string(), name));
  }
}

}  // namespace

void write_attr(hid_t loc, const char* name, int64_t value, const std::filesystem::path& file) {
  write_attr_raw(loc, name, H5T_NATIVE_INT64, &value, file);
}
void write_attr(hid_t loc, const char* name, double value, const std::filesystem::path& file) {
  write_attr_raw(loc, name, H5T_NATIVE_DOUBLE, &value, file);
}
void write_attr(hid_t loc, const char* name, std::string_view value, const std::filesystem::path& file) {
  // Fixed-length (not variable-length) strings: their bytes sit in the object header, which carries a
  // checksum, where a variable-length string's would sit in the unchecksummed global heap.
  Handle type(ZS_H5_CHECK(H5Tcopy(H5T_C_S1), file, "string type"), H5Tclose);
  ZS_H5_CHECK(H5Tset_size(type.get(), std::max<size_t>(1, value.size())), file, "string type size");
  ZS_H5_CHECK(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), file, "string type padding");
  ZS_H5_CHECK(H5Tset_cset(type.get(), H5T_CSET_UTF8), file, "string type charset");
  std::string copy(value);
  copy.resize(std::max<size_t>(1, value.size()), '\0');
  write_attr_raw(loc, name, type.get(), copy.data(), file);
}

bool has_attr(hid_t loc, const char* name, const std::filesystem::path& file) {
  return ZS_H5_CHECK(H5Aexists(loc, name), file, fmt::format("lookup of attribute '{}'", name)) > 0;
}

H5T_class_t attr_class(hid_t loc, const char* name, const std::filesystem::path& file) {
  Handle attr = open_attr(loc, name, file);
  Handle type(ZS_H5_CHECK(H5Aget_type(attr.get()), file, fmt::format("type of attribute '{}'", name)), H5Tclose);
  return H5Tget_class(type.get());
}

int64_t read_attr_int(hid_t loc, const char* name, const std::filesystem::path& file) {
  Handle attr = open_attr(loc, name, file);
  expect_class(attr.get(), H5T_INTEGER, name, file);
  int64_t value = 0;
  ZS_H5_CHECK(H5Aread(attr.get(), H5T_NATIVE_INT64, &value), file, fmt::format("read of attribute '{}'", name));
  return value;
}

double read_attr_double(hid_t loc, const char* name, const std::filesystem::path& file) {
  Handle attr = open_attr(loc, name, file);
  expect_class(attr.get(), H5T_FLOAT, name, file);
  double value = 0;
  ZS_H5_CHECK(H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &value), file, fmt::format("read of attribute '{}'", name));
  return value;
}

std::string read_attr_string(hid_t loc, const char* name, const std::filesystem::path& file) {
  Handle attr = open_attr(loc, name, file);
  expect_class(attr.get(), H5T_STRING, name, file);
  Handle type(ZS_H5_CHECK(H5Aget_type(attr.get()), file, fmt::format("type of attribute '{}'", name)), H5Tclose);
  if (H5Tis_variable_str(type.get()) > 0) {
    throw CheckpointError(fmt::format("checkpoint file '{}': attribute '{}' is a variable-length string (not written "
                                      "by zeroshard)",
                                      file.string(), name));
  }
  std::string value(H5Tget_size(type.get()), '\0');
  ZS_H5_CHECK(H5Aread(attr.get(), type.get(), value.data()), file, fmt::format("read of attribute '{}'", name));
  value.resize(value.find_last_not_of('\0') + 1);  // npos + 1 == 0 for an all-NUL value
  return value;
}

namespace {
herr_t collect_attr(hid_t, const char* name, const H5A_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> attr_names(hid_t loc, const std::filesystem::path& file) {
  std::vector<std::string> names;
  hsize_t idx = 0;
  ZS_H5_CHECK(H5Aiterate2(loc, H5_INDEX_NAME, H5_ITER_INC, &idx, collect_attr, &names), file, "list of attributes");
  return names;
}

}  // namespace zs::checkpoint::h5

namespace zs::checkpoint::h5 {
namespace {

void write_small(hid_t loc, const char* name, hid_t type, const std::vector<hsize_t>& dims, const void* data,
                 const std::filesystem::path& file) {
  std::vector<hsize_t> max(dims.size(), H5S_UNLIMITED);
  Handle space(ZS_H5_CHECK(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), max.data()), file,
                           fmt::format("dataspace of '{}'", name)),
               H5Sclose);
  Handle dcpl = plist_create(H5P_DATASET_CREATE);
  std::vector<hsize_t> chunk(dims);
  for (hsize_t& c : chunk) c = std::clamp<hsize_t>(c, 1, 1 << 20);
  ZS_H5_CHECK(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), file, "chunk size");
  ZS_H5_CHECK(H5Pset_fletcher32(dcpl.get()), file, "fletcher32");
  Handle ds(ZS_H5_CHECK(H5Dcreate2(loc, name, type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), file,
                        fmt::format("create of dataset '{}'", name)),
            H5Dclose);
  bool empty = std::any_of(dims.begin(), dims.end(), [](hsize_t d) { return d == 0; });
  if (!empty) {
    ZS_H5_CHECK(H5Dwrite(ds.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), file,
                fmt::format("write of dataset '{}'", name));
  }
}

std::vector<hsize_t> read_dims(hid_t ds, const char* name, int rank, const std::filesystem::path& file) {
  Handle space = dataset_space(ds, file, name);
  int n = ZS_H5_CHECK(H5Sget_simple_extent_ndims(space.get()), file, fmt::format("rank of '{}'", name));
  if (n != rank) {
    throw CheckpointError(fmt::format("checkpoint file '{}': dataset '{}' has {} dimensions, expected {}", file.string(),
                                      name, n, rank));
  }
  std::vector<hsize_t> dims(static_cast<size_t>(n));
  ZS_H5_CHECK(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), file, fmt::format("shape of '{}'", name));
  return dims;
}

// The small datasets (write_small) are stored uncompressed, so their elements cannot outnumber the
// file's bytes. A corrupt shape would otherwise ask for an allocation of up to 2^64 bytes before HDF5
// could notice anything (found by tests/fuzz/checkpoint_fuzz.cpp).
void check_small_shape(const std::vector<hsize_t>& dims, size_t element_bytes, const char* name,
                       const std::filesystem::path& file) {
  std::error_code ec;
  const uintmax_t file_bytes = std::filesystem::file_size(file, ec);
  unsigned __int128 bytes = element_bytes;
  for (hsize_t d : dims) bytes *= d;
  if (ec || bytes > file_bytes) {
    throw CheckpointError(fmt::format("checkpoint file '{}': dataset '{}' claims {} elements, more than the file's {} bytes "
                                      "hold (the file is corrupt)",
                                      file.string(), name, fmt::join(dims, " x "), ec ? 0 : file_bytes));
  }
}

}  // namespace

void write_blob(hid_t loc, const char* name, std::string_view bytes, const std::filesystem::path& file) {
  write_small(loc, name, H5T_NATIVE_UINT8, {bytes.size()}, bytes.data(), file);
}

std::string read_blob(hid_t loc, const char* name, const std::filesystem::path& file) {
  Handle ds = dataset_open(loc, name, file);
  std::vector<hsize_t> dims = read_dims(ds.get(), name, 1, file);
  check_small_shape(dims, 1, name, file);
  std::string out(dims[0], '\0');
  if (!out.empty()) {
    ZS_H5_CHECK(H5Dread(ds.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), file,
                fmt::format("read of dataset '{}' (corrupt?)", name));
  }
  return out;
}

void write_u64_table(hid_t loc, const char* name, const std::vector<uint64_t>& values, hsize_t cols,
                     const std::filesystem::path& file) {
  write_small(loc, name, H5T_NATIVE_UINT64, {values.size() / cols, cols}, values.data(), file);
}

std::vector<uint64_t> read_u64_table(hid_t loc, const char* name, hsize_t cols, const std::filesystem::path& file) {
  Handle ds = dataset_open(loc, name, file);
  std::vector<hsize_t> dims = read_dims(ds.get(), name, 2, file);
  if (dims[1] != cols) {
    throw CheckpointError(fmt::format("checkpoint file '{}': table '{}' has {} columns, expected {}", file.string(),
                                      name, dims[1], cols));
  }
  check_small_shape(dims, sizeof(uint64_t), name, file);
  std::vector<uint64_t> out(dims[0] * dims[1]);
  if (!out.empty()) {
    ZS_H5_CHECK(H5Dread(ds.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), file,
                fmt::format("read of table '{}' (corrupt?)", name));
  }
  return out;
}

}  // namespace zs::checkpoint::h5
