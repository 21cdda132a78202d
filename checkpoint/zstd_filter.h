// Our HDF5 chunk filter for Zstandard, under the registered filter id 32015.
//
// Note [Zstandard filter]: Debian 12 ships no HDF5 zstd plugin (hdf5-filter-plugin has LZ4, BZip2 and
// Bitshuffle), so zeroshard registers this filter in-process. It uses the registered id and the
// chunk format of the reference plugin (one zstd frame per chunk, its content size in the frame
// header, cd_values[0] = the level), the same as hdf5plugin's Zstd filter (pip's hdf5plugin bundles it;
// Debian's python3-hdf5plugin does not, it uses the system plugin directory). For other programs
// (h5py, h5dump) the build also makes the same code a dynamic HDF5 plugin, libzs_h5zstd.so, loaded
// through HDF5_PLUGIN_PATH (docs/checkpoints.md). Frames carry zstd's own checksum as well.
#pragma once

namespace zs::checkpoint {

inline constexpr int kZstdFilterId = 32015;

// Registers the filter with HDF5 (idempotent; h5::init_library calls it).
void register_zstd_filter();

// The filter's class, also exported by the dynamic plugin (h5_zstd_plugin.cpp).
const void* zstd_filter_class();

}  // namespace zs::checkpoint
