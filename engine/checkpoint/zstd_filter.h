// Our HDF5 chunk filter for Zstandard, under the registered filter id 32015.
//
// Note [Zstandard filter]: Debian 12 ships no HDF5 zstd plugin (hdf5-filter-plugin has LZ4, BZip2 and
// Bitshuffle), so zeroshard registers this filter in-process. It uses the registered id and the
// chunk format of the reference plugin (one zstd frame per chunk, its content size in the frame
// header, cd_values[0] = the level), the same as python3-hdf5plugin's Zstd filter, so stock h5py reads
// our files after `import hdf5plugin` and h5dump does with HDF5_PLUGIN_PATH pointing at that
// package's plugin directory (docs/checkpoints.md). Frames carry zstd's own checksum as well.
#pragma once

namespace zs::checkpoint {

inline constexpr int kZstdFilterId = 32015;

// Registers the filter with HDF5 (idempotent; h5::init_library calls it).
void register_zstd_filter();

}  // namespace zs::checkpoint
