// Per-chunk checksums of a buffer's data, computed by the writer while it streams and verified by the
// reader (Note [Chunk checksums]).
//
// Note [Chunk checksums]: HDF5's Fletcher32 filter made checksummed saves and loads CPU-bound at a
// fraction of plain file I/O: it is a byte-at-a-time loop, and as a filter it routes every chunk
// through freshly allocated buffers and copies (0.4x of plain write(), 0.2x of plain read()). We keep
// the data datasets unfiltered (or zstd only) and store, beside /buffers/<b>/data, a uint64 table
// /buffers/<b>/checksums (rows = chunks, 1 column): the XXH3-64 of each chunk's bytes as stored
// before compression, in the dataset's element order (the last chunk may be short). The group's
// attribute `checksum` = "xxh3-64" says the table must be there, so a file that lost it is refused
// rather than read unverified; the table's own attribute `chunk_elements` ties it to the data's chunk
// size. Whole chunks are hashed straight in the caller's memory (XXH3 runs at memory speed), so the
// data moves between file and caller with no extra copy. Stock h5py reads the data as before; the
// table can be checked with python3-xxhash (docs/checkpoints.md).
#pragma once

#include <cstddef>
#include <cstdint>

namespace zs::checkpoint::detail {

inline constexpr const char* kChecksumAlgorithm = "xxh3-64";

uint64_t chunk_checksum(const void* data, size_t bytes);

}  // namespace zs::checkpoint::detail
