// XXH3 from xxhash's header, inlined (the shared library is built for baseline SSE2): this file for
// any x86-64, checksum_avx2.cpp and checksum_avx512.cpp compiled for wider vectors (on this project's
// Zen VM, 64 KiB blocks in cache: SSE2 6.5 GB/s, AVX2 9-13, AVX-512 11-16). XXH3's value does not
// depend on the vector width, so files written on one machine verify on any other.
#include "checkpoint/detail/checksum.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "memory/cpu_features.h"

namespace zs::checkpoint::detail {

uint64_t block_checksum_sse2(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

uint64_t block_checksum(const void* data, size_t bytes) {
  static const memory::IsaLevel isa = memory::best_isa();
  if (isa >= memory::IsaLevel::kAvx512) return block_checksum_avx512(data, bytes);
  if (isa >= memory::IsaLevel::kAvx2) return block_checksum_avx2(data, bytes);
  return block_checksum_sse2(data, bytes);
}

}  // namespace zs::checkpoint::detail
