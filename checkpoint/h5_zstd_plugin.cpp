// libzs_h5zstd.so: our zstd filter (zstd_filter.h) as an HDF5 dynamic filter plugin, for programs that
// do not link zeroshard: h5py, h5dump. HDF5 finds it through HDF5_PLUGIN_PATH.
#include <H5PLextern.h>

#include "checkpoint/zstd_filter.h"

extern "C" H5PL_type_t H5PLget_plugin_type() { return H5PL_TYPE_FILTER; }
extern "C" const void* H5PLget_plugin_info() { return zs::checkpoint::zstd_filter_class(); }
