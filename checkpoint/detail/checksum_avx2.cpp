// block_checksum's AVX2 path (checksum.cpp): compiled with -mavx2, called only where the CPU has it.
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

namespace zs::checkpoint::detail {

uint64_t block_checksum_avx2(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

}  // namespace zs::checkpoint::detail
