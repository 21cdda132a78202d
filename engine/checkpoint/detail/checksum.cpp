#include "engine/checkpoint/detail/checksum.h"

#include <xxhash.h>

namespace zs::checkpoint::detail {

uint64_t chunk_checksum(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

}  // namespace zs::checkpoint::detail
