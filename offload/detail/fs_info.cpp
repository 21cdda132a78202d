#include "offload/detail/fs_info.h"

#include <sys/statfs.h>
#include <sys/statvfs.h>

#include <filesystem>

#include <fmt/format.h>

namespace zs::offload::detail {

std::string fs_type_name(const std::string& path) {
  struct statfs s {};
  if (::statfs(path.c_str(), &s) != 0) return "unknown";
  // Magic numbers from linux/magic.h (not all are exported by glibc's headers).
  switch (static_cast<uint64_t>(static_cast<uint32_t>(s.f_type))) {
    case 0xEF53: return "ext4";  // ext2/3/4 share the magic
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x01021994: return "tmpfs";
    case 0x794C7630: return "overlayfs";
    case 0x858458F6: return "ramfs";
    case 0x6969: return "nfs";
    case 0xFE534D42: return "smb2";
    case 0xFF534D42: return "cifs";
    case 0x2FC12FC1: return "zfs";
    case 0xF2F52010: return "f2fs";
    case 0x65735546: return "fuse";
    case 0x0BD00BD0: return "lustre";
    case 0x47504653: return "gpfs";
    case 0x9FA0: return "proc";
    case 0x62656572: return "sysfs";
    case 0x73717368: return "squashfs";
    default: return fmt::format("0x{:x}", static_cast<uint32_t>(s.f_type));
  }
}

int64_t fs_free_bytes(const std::string& path) {
  struct statvfs s {};
  if (::statvfs(path.c_str(), &s) != 0) return -1;
  return static_cast<int64_t>(s.f_bavail) * static_cast<int64_t>(s.f_frsize);
}

std::string human_bytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{} bytes", bytes);
  double v = static_cast<double>(bytes);
  int u = -1;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  return fmt::format("{:.2f} {} ({} bytes)", v, kUnits[u], bytes);
}

std::string parent_dir(const std::string& path) {
  std::filesystem::path p(path);
  return p.has_parent_path() ? p.parent_path().string() : std::string(".");
}

}  // namespace zs::offload::detail
