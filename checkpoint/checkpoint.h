// checkpoint: checkpoint storage on HDF5 + zstd (docs/checkpoints.md).
//
// Writing (every rank its own file, rank 0 the metadata and the commit; writer.h):
//   auto dir = begin_save(root, tag);  ShardWriter w(dir, meta, rank, {});  w.append("fp32", bytes);
//   w.finish();  write_metadata(dir, meta);  commit_save(root, tag, keep_last);
// Reading any range of any tensor at any world size (reader.h):
//   CheckpointReader ckpt(root);  ckpt.read("fp32", "h.0.attn.w", begin, count, DType::kF32, out);
// Single-process tools: tools.h (inspect, consolidate, compare).
// Hugging Face's safetensors files, read memory-mapped and written in bounded memory: safetensors.h.
#pragma once

#include "checkpoint/format.h"
#include "checkpoint/reader.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/writer.h"
