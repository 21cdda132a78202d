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
// shape, listed in the buffer that holds them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "memory/dtype.h"

namespace zs::checkpoint {

using memory::DType;

// Format version written into every file; a reader accepts exactly the versions it knows.
inline constexpr int64_t kFormatVersion = 1;
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
