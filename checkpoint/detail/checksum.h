// Checksums of a buffer's data in fixed blocks, computed by the writer while it streams and verified
// by the reader (Note [Checksum blocks]).
//
// Note [Checksum blocks]: HDF5's Fletcher32 filter made checksummed saves and loads CPU-bound at a
// fraction of plain file I/O: it is a byte-at-a-time loop, and as a filter it routes every chunk
// through freshly allocated buffers and copies (0.4x of plain write(), 0.2x of plain read()). We keep
// the data datasets unfiltered (or zstd only) and store, beside /buffers/<b>/data, a uint64 table
// /buffers/<b>/checksums (rows = blocks, 1 column): the XXH3-64 of each block's bytes as stored
// before compression, in the dataset's element order (the last block may be short). A block is
// kBlockBytes (64 KiB) inside the 4 MiB chunks of an unfiltered dataset, and the chunk itself when
// chunks are 64 KiB or less (zstd's): a read of any range then verifies every block it touches while
// reading at most one block beyond each end, where a checksum per 4 MiB chunk would read and copy a
// whole chunk for each small tensor. Whole blocks are hashed straight in the caller's memory (XXH3
// runs at memory speed), so the data moves between file and caller with no extra copy. The group's
// attribute `checksum` = "xxh3-64" says the table must be there, so a file that lost it is refused
// rather than read unverified; the table's attribute `block_elements` gives the block size. Stock
// h5py reads the data as before; the table can be checked with python3-xxhash (docs/checkpoints.md).
#pragma once

#include <cstddef>
#include <cstdint>

namespace zs::checkpoint::detail {

inline constexpr const char* kChecksumAlgorithm = "xxh3-64";
inline constexpr uint64_t kBlockBytes = 64u << 10;

// Elements per checksum block of a dataset of `total` elements of `elem_size` bytes in chunks of
// `chunk` elements: kBlockBytes where every chunk boundary is a block boundary (the writer writes
// whole chunks), else the chunk.
inline uint64_t checksum_block_elements(uint64_t chunk, size_t elem_size, uint64_t total) {
  const uint64_t block = kBlockBytes / elem_size;
  return chunk > block && (chunk % block == 0 || chunk >= total) ? block : chunk;
}

// XXH3-64 of `bytes` bytes (the widest vector path the CPU runs; every path gives the same value).
uint64_t block_checksum(const void* data, size_t bytes);
// The paths it picks from, for the tests: SSE2 (any x86-64), AVX2 and AVX-512 (only where
// memory::isa_supported says the CPU has them).
uint64_t block_checksum_sse2(const void* data, size_t bytes);
uint64_t block_checksum_avx2(const void* data, size_t bytes);
uint64_t block_checksum_avx512(const void* data, size_t bytes);

}  // namespace zs::checkpoint::detail
