// XXH3 from xxhash's header, inlined (the shared library is built for baseline SSE2): this file for
// any x86-64, checksum_avx2.cpp compiled for AVX2, which hashes about twice as fast. XXH3's value does
// not depend on the vector width, so files written on one machine verify on any other.
#include "engine/checkpoint/detail/checksum.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "memory/cpu_features.h"

namespace zs::checkpoint::detail {

uint64_t block_checksum_sse2(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

uint64_t block_checksum(const void* data, size_t bytes) {
  static const bool avx2 = memory::best_isa() >= memory::IsaLevel::kAvx2;
  return avx2 ? block_checksum_avx2(data, bytes) : block_checksum_sse2(data, bytes);
}

}  // namespace zs::checkpoint::detail
