// File-system facts used in offload messages: the type of the file system holding a path, free
// space, and byte counts written for people.
#pragma once

#include <cstdint>
#include <string>

namespace zs::offload::detail {

// The name of the file system type holding `path` (statfs f_type): "ext4", "xfs", "btrfs", "tmpfs",
// "overlayfs", "ramfs", "nfs", ... or the magic number in hex ("0x65735546") for others; "unknown"
// when statfs fails.
std::string fs_type_name(const std::string& path);

// Bytes available to unprivileged users in the file system holding `path` (statvfs f_bavail *
// f_frsize); -1 (as int64) when statvfs fails, with errno set.
int64_t fs_free_bytes(const std::string& path);

// "1.50 GiB (1610612736 bytes)"; below 1 KiB just "512 bytes".
std::string human_bytes(uint64_t bytes);

// The directory part of `path` ("." when there is none).
std::string parent_dir(const std::string& path);

}  // namespace zs::offload::detail
