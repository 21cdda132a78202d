// The readers of the config's larger sections, shared by engine/config.cpp (parse_config) and
// engine/config_zero.cpp (zero_optimization, checkpoint), with the helpers both use (Note [DeepSpeed
// keys by verdict] in engine/config.cpp). Internal: parse_config is the only caller.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/json.h"
#include "engine/config.h"

namespace zs::engine::detail {

// Lines for EngineConfig::notes, collected while parsing (logged once, by the program, on rank 0).
using Notes = std::vector<std::string>;

// A DeepSpeed switch whose `false` (its default, or off) is what zeroshard does.
inline void read_false_only(ObjectReader& r, std::string_view key) { r.unsupported_if_true(key); }

// A DeepSpeed switch whose `true` asks for what zeroshard does anyway, by its own means: both values are
// accepted; `true` gets a note saying how (`how`), `false` nothing.
inline void read_true_is_done(ObjectReader& r, std::string_view key, Notes& notes, std::string_view how) {
  bool on = false;
  if (r.read(key, on) && on) notes.push_back(fmt::format("{}: accepted; {}", r.path_of(key), how));
}

// A DeepSpeed key accepted with any value of type T and without effect; `why` is said in the note.
template <typename T>
void read_hint(ObjectReader& r, std::string_view key, Notes& notes, std::string_view why) {
  T value{};
  if (r.read(key, value)) notes.push_back(fmt::format("{}: accepted; has no effect in zeroshard: {}", r.path_of(key), why));
}

// zero_optimization: the stage, buckets, stage-3 keys, offload (with DeepSpeed's older spellings).
void read_zero(ObjectReader& r, ZeroConfig& z, Notes& notes);
// checkpoint: DeepSpeed's tag_validation and zeroshard's own keys.
void read_checkpoint(ObjectReader& r, CheckpointConfig& c, Notes& notes);
// sparse_attention (engine/config_model_keys.cpp): DeepSpeed's layouts for the model's attention.
void read_sparse_attention(ObjectReader& r, EngineConfig& cfg);
// progressive_layer_drop (engine/config_model_keys.cpp): enabled, theta, gamma.
void read_progressive_layer_drop(ObjectReader& r, EngineConfig& cfg);

}  // namespace zs::engine::detail
