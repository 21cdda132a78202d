// What a checkpoint holds: its layout (tensors, buffers, which rank holds which ranges) and metadata.
//
// Note [Checkpoint layout]: a tag directory holds zs_metadata.h5 and one zs_rank_{r:05}.h5 per rank.
// Model states are stored by tensor NAME, never only by flat offset: every state buffer (the training
// dtype parameters "params", the fp32 master "fp32", each optimizer state under its own name such as
// "exp_avg") is, in each rank file, one chunked 1-D dataset /buffers/<buffer>/data of the buffer's
// dtype, the concatenation of that rank's segments in order, next to an /buffers/<buffer>/index table
// (tensor name, begin, count, offset): elements [begin, begin+count) of the tensor's row-major
// flattening lie at [offset, offset+count) of data. The metadata file holds the same table for every
// rank, so a reader finds any element range of any tensor with one hyperslab read per overlapping
// segment (no whole-file load), whatever the reader's world size, ZeRO stage or expert-parallel size.
// Experts are tensors under their global names ("layers.3.moe.experts.5.w1"): an ep_size change is a
// different set of requested names per rank, nothing more. States that are not element-aligned with a
// parameter (CAdam's per-block scales, say) are tensors of their own ("<param>.scales") with their own
// shape, listed in the buffer that holds them. A tensor is always the whole tensor of the tp = 1
// model: a tensor-parallel rank writes its slice's runs at their places in it (Note [tensor-parallel
// checkpoints] in engine/engine_checkpoint_items.cpp), so neither the files nor this layer know the
// tp degree that wrote them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "memory/dtype.h"

namespace zs::checkpoint {

using memory::DType;

// Format version written into every file; a reader accepts the versions it knows, [kMinFormatVersion,
// kFormatVersion]. Version 2 added the gaps of Note [Page phase]; a version 1 file has none (its
// index offsets are the running sum of the counts).
inline constexpr int64_t kFormatVersion = 2;
inline constexpr int64_t kMinFormatVersion = 1;

// Note [Page phase]: the kernel copies a read out of the page cache fastest when the destination
// and the file offset fall at nearly the same place in their pages ((destination - offset) mod 4096
// in [1, 63], which a malloc'd buffer, at a page plus 16 bytes, meets for a page-aligned offset): on
// this project's Zen VM 5-15% faster than other phases (docs/checkpoints.md, "Benchmarks"). Callers
// read a tensor's elements into memory where the tensor's element 0 is at a fixed page phase (a
// tensor's own allocation, a staging buffer filled from a tensor offset), whatever the world size
// that wrote the file, so a format 2 rank file keeps the tensor's phase: in an unfiltered data
// dataset, a segment of at least kPagePhaseMinBytes starts at a data offset congruent to its `begin`
// modulo a page's worth of elements, after a gap of zeros (less than a page; the index's offset
// column says where each segment starts, and the checksums cover the gaps as stored). The files are
// written with HDF5's alignment (h5::file_create: objects of kPageAlignMinBytes or more, so every
// 4 MiB data chunk, start on a page), so element e of such a tensor lies at a file offset congruent to
// e * element size modulo a page. Small segments and zstd data carry no gaps (their reads are short,
// or not direct copies). The waste: below one page per large segment, at most 1/64 of the data.
inline constexpr uint64_t kPageBytes = 4096;
inline constexpr uint64_t kPagePhaseMinBytes = 256u << 10;
inline constexpr uint64_t kPageAlignMinBytes = 256u << 10;
inline constexpr const char* kMetadataFile = "zs_metadata.h5";
inline constexpr const char* kLatestFile = "latest";

struct TensorInfo {
  std::string name;             // hierarchical parameter name, unique
  std::vector<uint64_t> shape;  // global shape; {} is a scalar (one element)
  DType dtype = DType::kF32;    // the training dtype of the parameter
  uint64_t numel() const;
};

// Elements [begin, begin + count) of tensor `tensor` (an index into Layout::tensors).
struct Segment {
  uint32_t tensor = 0;
  uint64_t begin = 0;
  uint64_t count = 0;
};

// One state buffer: its element dtype and, per rank, the segments that rank's file holds, in file
// order (their counts add up to the rank's dataset length). A rank may hold nothing.
struct BufferLayout {
  std::string name;  // "params", "fp32", "exp_avg", ...: [A-Za-z0-9_.-]+
  DType dtype = DType::kF32;
  std::vector<std::vector<Segment>> ranks;  // ranks.size() == Layout::world_size
  uint64_t rank_elements(int rank) const;
};

struct Layout {
  int world_size = 1;
  std::vector<TensorInfo> tensors;
  std::vector<BufferLayout> buffers;

  // Throws UsageError naming the first broken rule: unique names, segments inside their tensor, no
  // two segments of one buffer overlapping. (Buffers need not cover every tensor: a state only some
  // parameters have is fine.)
  void validate() const;
  const BufferLayout* find_buffer(std::string_view name) const;  // nullptr if absent
  int find_tensor(std::string_view name) const;                  // -1 if absent
};

// A scalar in the extensible key/value state: step counters, loss scale, scheduler state, RNG state,
// data position ("global_step", "loss_scaler.scale", "rng.state", ...).
using Scalar = std::variant<int64_t, double, std::string>;

struct Metadata {
  int64_t version = kFormatVersion;
  std::string run_id;  // the same in every file of one save: a shard from another save is refused
  std::string tag;
  int64_t saved_unix_ns = 0;  // orders tags for keep_last
  Layout layout;
  std::map<std::string, Scalar> scalars;
  std::string config_json;  // the config the run used, verbatim
};

// "zs_rank_00003.h5"
std::string rank_file_name(int rank);
// A fresh random run id (128 bits, hex).
std::string new_run_id();

}  // namespace zs::checkpoint
