// The layout as JSON text (stored in the metadata file as the checksummed dataset "layout_json"), and
// the HDF5 memory type of a buffer dtype (bf16 and fp16 are stored as their uint16 bit patterns).
#pragma once

#include <hdf5.h>

#include <filesystem>
#include <string>
#include <string_view>

#include "checkpoint/format.h"

namespace zs::checkpoint::detail {

std::string layout_to_json(const Layout& layout);
// Throws CheckpointError naming `file` if the text is not a valid layout.
Layout layout_from_json(std::string_view text, const std::filesystem::path& file);

hid_t h5_type(DType dtype);
DType dtype_from_name(std::string_view name, const std::filesystem::path& file);

}  // namespace zs::checkpoint::detail
