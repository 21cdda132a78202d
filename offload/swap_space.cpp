#include "offload/swap_space.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <filesystem>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "core/errors.h"
#include "core/log.h"
#include "offload/detail/exit_cleanup.h"
#include "offload/detail/file_io.h"
#include "offload/detail/fs_info.h"

namespace zs::offload {

namespace {

constexpr std::string_view kPrefix = "zeroshard-swap-r";
constexpr const char* kWhere = "offload_optimizer.nvme_path / offload_param.nvme_path";

bool valid_name(const std::string& name) {
  if (name.empty()) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

std::string space_error(const std::string& dir, const std::string& file, uint64_t needed, int64_t free_bytes) {
  return fmt::format("nvme_path '{}' ({} file system) has {} free but the swap file '{}' needs {}: free space "
                     "there, or point {} at a file system with room (or offload less to NVMe)",
                     dir, detail::fs_type_name(dir), free_bytes < 0 ? "an unknown amount" : detail::human_bytes(
                                                                              static_cast<uint64_t>(free_bytes)),
                     file, detail::human_bytes(needed), kWhere);
}

// Parses "zeroshard-swap-r<rank>-<pid>-<name>.bin"; returns the pid or -1.
long swap_file_pid(std::string_view name) {
  if (!name.starts_with(kPrefix) || !name.ends_with(".bin")) return -1;
  name.remove_prefix(kPrefix.size());
  size_t dash = name.find('-');
  if (dash == std::string_view::npos) return -1;
  name.remove_prefix(dash + 1);
  dash = name.find('-');
  if (dash == std::string_view::npos || dash == 0) return -1;
  long pid = -1;
  auto [ptr, ec] = std::from_chars(name.data(), name.data() + dash, pid);
  if (ec != std::errc() || ptr != name.data() + dash) return -1;
  return pid;
}

}  // namespace

SwapSpace::FileGuard::~FileGuard() {
  if (created) detail::unregister_for_exit_cleanup(path);
  if (created && ::unlink(path.c_str()) != 0 && errno != ENOENT) {
    ZS_LOG_WARN("offload: could not remove swap file '{}': {}; remove it by hand", path,
                zs::detail::errno_text(errno));
  }
}

SwapSpace::SwapSpace(const std::string& nvme_path, int rank, const std::string& name, size_t bytes,
                     const AioConfig& aio, memory::MemoryTracker* tracker, memory::Category category)
    : path_{file_path(nvme_path, rank, name)},
      name_(name),
      rank_(rank),
      capacity_(preflight(nvme_path, path_.path, io_align_up(bytes))),
      file_(create_file(path_, nvme_path, capacity_, aio)),
      tracked_(tracker, category, memory::Tier::kNvme, capacity_) {
  warn_stale_files(nvme_path);
  ZS_LOG_DEBUG("offload: swap file '{}' ({}, {} I/O)", path_.path, detail::human_bytes(capacity_),
               file_.direct() ? "direct" : "buffered");
}

SwapSpace::~SwapSpace() = default;

size_t SwapSpace::bytes_for(std::span<const size_t> region_bytes) {
  size_t total = 0;
  for (size_t b : region_bytes) total += io_align_up(b);
  return total;
}

std::string SwapSpace::file_path(const std::string& nvme_path, int rank, const std::string& name) {
  if (!valid_name(name)) {
    throw ConfigError(fmt::format("swap space name '{}': use letters, digits, '_', '-' and '.' only (it becomes "
                                  "part of a file name)", name));
  }
  if (rank < 0) throw ConfigError(fmt::format("swap space '{}': rank must be >= 0, got {}", name, rank));
  return (std::filesystem::path(nvme_path) /
          fmt::format("{}{}-{}-{}.bin", kPrefix, rank, static_cast<long>(::getpid()), name))
      .string();
}

size_t SwapSpace::preflight(const std::string& dir, const std::string& file, size_t bytes) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) {
      throw IoError(fmt::format("nvme_path '{}' does not exist: create it (mkdir -p '{}') or point {} at an "
                                "existing directory, ideally on a local NVMe drive", dir, dir, kWhere));
    }
    throw IoError(fmt::format("nvme_path '{}' cannot be examined: {}; check it and its parent directories, or "
                              "point {} elsewhere", dir, zs::detail::errno_text(err), kWhere));
  }
  if (!S_ISDIR(st.st_mode)) {
    throw IoError(fmt::format("nvme_path '{}' is not a directory: point {} at a directory (zeroshard creates its "
                              "swap files inside it)", dir, kWhere));
  }
  // access() answers for the real uid and says yes to root almost everywhere; the probe below is the
  // real test (root cannot create files in /proc, nor anyone on a read-only mount).
  const std::string probe = file + ".probe";
  int err = 0;
  if (::access(dir.c_str(), W_OK) != 0) {
    err = errno;
  } else {
    const int fd = ::open(probe.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
    if (fd < 0) {
      err = errno;
    } else {
      ::close(fd);
      ::unlink(probe.c_str());
    }
  }
  if (err != 0) {
    throw IoError(fmt::format("nvme_path '{}' is not writable ({} creating '{}'): make it writable for this user "
                              "(chmod/chown, or remount read-write), or point {} at a writable directory",
                              dir, zs::detail::errno_text(err), probe, kWhere));
  }
  const int64_t free_bytes = detail::fs_free_bytes(dir);
  if (free_bytes < 0 || static_cast<uint64_t>(free_bytes) < bytes) {
    throw IoError(space_error(dir, file, bytes, free_bytes));
  }
  return bytes;
}

AsyncFile SwapSpace::create_file(FileGuard& guard, const std::string& dir, size_t bytes, const AioConfig& aio) {
  const int fd = ::open(guard.path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    throw IoError(fmt::format("cannot create swap file '{}': {}{}", guard.path, zs::detail::errno_text(err),
                              err == EEXIST ? "; a file of that name exists (two swap spaces with the same name and "
                                              "rank in one process?) and zeroshard never overwrites one"
                                            : ""));
  }
  guard.created = true;
  detail::register_for_exit_cleanup(guard.path);
  detail::UniqueFd owned(fd);
  if (bytes > 0 && ::fallocate(fd, 0, 0, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    if (err == ENOSPC || err == EDQUOT) {
      throw IoError(space_error(dir, guard.path, bytes, detail::fs_free_bytes(dir)) +
                    fmt::format(" (fallocate: {})", zs::detail::errno_text(err)));
    }
    if (err != EOPNOTSUPP) {
      throw IoError(fmt::format("cannot preallocate {} for swap file '{}': {}", detail::human_bytes(bytes),
                                guard.path, zs::detail::errno_text(err)));
    }
    // No fallocate on this file system: a sparse file of the right size; blocks are found on write.
    ZS_SYS_CHECK(::ftruncate(fd, static_cast<off_t>(bytes)), "resizing swap file '{}' to {} bytes", guard.path,
                 bytes);
  }
  owned.reset();
  return AsyncFile(guard.path, aio, OpenMode::kExisting);
}

void SwapSpace::warn_stale_files(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> stale;
  uintmax_t stale_bytes = 0;
  const long self = static_cast<long>(::getpid());
  for (auto it = std::filesystem::directory_iterator(dir, ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    const std::string fname = it->path().filename().string();
    const long pid = swap_file_pid(fname);
    if (pid <= 0 || pid == self) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    stale.push_back(fname);
    std::error_code size_ec;
    const uintmax_t size = std::filesystem::file_size(it->path(), size_ec);
    if (!size_ec) stale_bytes += size;
  }
  if (stale.empty()) return;
  std::string names;
  for (size_t i = 0; i < stale.size() && i < 5; ++i) names += (i ? ", " : "") + stale[i];
  if (stale.size() > 5) names += fmt::format(", ... ({} more)", stale.size() - 5);
  ZS_LOG_WARN("offload: '{}' holds {} swap file(s) ({}) of processes no longer running on this host, left by killed "
              "runs: {}. zeroshard never deletes them; remove them if no other node uses this directory.",
              dir, stale.size(), detail::human_bytes(stale_bytes), names);
}

SwapRegion SwapSpace::allocate(size_t bytes) {
  const size_t need = io_align_up(bytes);
  if (need > capacity_ - used_) {
    throw OutOfMemoryError(fmt::format("swap space '{}' ({}): a region of {} does not fit, {} of {} left; reserve "
                                       "SwapSpace::bytes_for(all region sizes)", name_, path_.path,
                                       detail::human_bytes(need), detail::human_bytes(capacity_ - used_),
                                       detail::human_bytes(capacity_)));
  }
  SwapRegion r{.space = this, .offset = used_, .bytes = bytes};
  used_ += need;
  return r;
}

void SwapSpace::check_range(const SwapRegion& r, uint64_t offset, size_t len, const char* what) const {
  ZS_ASSERT(r.space == this, "{} of a region of another swap space on '{}'", what, path_.path);
  ZS_ASSERT(offset <= r.reserved_bytes() && len <= r.reserved_bytes() - offset,
            "{} of {} bytes at offset {} of a {}-byte region of '{}'", what, len, offset, r.reserved_bytes(),
            path_.path);
}

Ticket SwapSpace::read_async(const SwapRegion& r, uint64_t offset, std::span<std::byte> dst) {
  check_range(r, offset, dst.size(), "read");
  return file_.read_async(r.offset + offset, dst);
}

Ticket SwapSpace::write_async(const SwapRegion& r, uint64_t offset, std::span<const std::byte> src) {
  check_range(r, offset, src.size(), "write");
  return file_.write_async(r.offset + offset, src);
}

void unlink_swap_files_now() noexcept { detail::unlink_registered_files(); }

}  // namespace zs::offload
