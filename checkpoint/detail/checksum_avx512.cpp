// block_checksum's AVX-512 path (checksum.cpp): compiled with the avx512 flags, called only where
// the CPU has them.
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX512
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

namespace zs::checkpoint::detail {

uint64_t block_checksum_avx512(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

}  // namespace zs::checkpoint::detail
