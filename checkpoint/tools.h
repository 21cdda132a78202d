// The storage-level tools behind `zeroshard checkpoint inspect|consolidate|compare` (single process).
// Each takes a checkpoint root (the directory holding `latest` and the tags) or a tag directory.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "checkpoint/reader.h"

namespace zs::checkpoint {

// Tags (latest marked), each tag's step, world size, buffers and bytes; the latest tag's tensors with
// shapes and dtypes; with `config_json`, the differences between the saved config and it, by JSON path.
std::string inspect(const std::filesystem::path& path, const std::optional<std::string>& config_json);

// A reader of DIR: a checkpoint root (the tag `latest` names) or one tag's directory.
CheckpointReader open_checkpoint(const std::filesystem::path& path);

// Writes every tensor's full fp32 values (buffer "fp32", else "params" converted) to `out` as one
// dataset per tensor name with its global shape, plus the scalars as attributes. Streams in pieces of
// `piece_bytes`: peak memory is that piece, whatever the model's size. Returns the tensors written.
size_t consolidate(const std::filesystem::path& path, const std::filesystem::path& out,
                   uint64_t piece_bytes = 64u << 20);

struct CompareResult {
  bool equal = true;
  std::string report;  // one line per difference, then a summary line
};
// Every buffer of every tensor, element by element in fp32 (|a-b| <= atol + rtol*|b|), the layouts'
// tensor names, shapes and buffers, and the scalars. World sizes, tp degrees, ZeRO stages and offload
// targets may differ: they are reported as "layout:" lines and do not make the checkpoints different
// (Note [compare: state and layout] in tools.cpp).
CompareResult compare(const std::filesystem::path& a, const std::filesystem::path& b, double rtol = 0.0,
                      double atol = 0.0);

}  // namespace zs::checkpoint
