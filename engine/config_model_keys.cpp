// The DeepSpeed sections that configure the model rather than the engine: `sparse_attention` and
// `progressive_layer_drop`. DeepSpeed parses them and hands them to the user's model; so does
// zeroshard (EngineConfig), and the built-in models use them (run/run_config.cpp).
#include <fmt/format.h>

#include "engine/detail/config_readers.h"

namespace zs::engine::detail {

void read_sparse_attention(ObjectReader& r, EngineConfig& cfg) {
  nn::SparseAttentionConfig c;
  std::string mode = "fixed";
  r.read_choice("mode", mode, {"fixed", "bigbird", "bslongformer", "dense", "variable"});
  if (mode == "variable") {
    throw ConfigError(fmt::format("{}: DeepSpeed's \"variable\" layout is not supported by zeroshard yet; use \"fixed\", "
                                  "\"bigbird\", \"bslongformer\" or \"dense\"",
                                  r.path_of("mode")));
  }
  c.mode = mode == "fixed"    ? nn::SparsityMode::kFixed
           : mode == "bigbird" ? nn::SparsityMode::kBigBird
           : mode == "dense"   ? nn::SparsityMode::kDense
                               : nn::SparsityMode::kBsLongformer;
  r.read("block", c.block, IntRange{1, 1 << 20});
  r.read("different_layout_per_head", c.different_layout_per_head);
  r.read("num_local_blocks", c.num_local_blocks, IntRange{1, 1 << 20});
  r.read("num_global_blocks", c.num_global_blocks, IntRange{0, 1 << 20});
  std::string attention = "bidirectional";
  r.read_choice("attention", attention, {"bidirectional", "unidirectional"});
  c.unidirectional = attention == "unidirectional";
  r.read("horizontal_global_attention", c.horizontal_global_attention);
  r.read("num_different_global_patterns", c.num_different_global_patterns, IntRange{1, 1 << 20});
  r.read("num_random_blocks", c.num_random_blocks, IntRange{0, 1 << 20});
  r.read("num_sliding_window_blocks", c.num_sliding_window_blocks, IntRange{1, 1 << 20});
  r.read("global_block_indices", c.global_block_indices, IntRange{0, 1 << 20});
  // DeepSpeed's default is None (null in JSON): no end indices.
  if (const boost::json::value* v = r.find("global_block_end_indices"); v != nullptr && !v->is_null()) {
    from_json(*v, r.path_of("global_block_end_indices"), c.global_block_end_indices);
    check_range(r.path_of("global_block_end_indices"), c.global_block_end_indices, IntRange{1, 1 << 20});
  }
  // The variable layout's key: DeepSpeed's tutorial config sets every mode's keys; each mode reads its own.
  std::vector<int64_t> local_window_blocks;
  if (r.read("local_window_blocks", local_window_blocks)) {
    cfg.notes.push_back(fmt::format("{}: accepted; read only by DeepSpeed's \"variable\" layout, not by \"{}\"",
                                    r.path_of("local_window_blocks"), nn::sparsity_mode_name(c.mode)));
  }
  nn::validate(c);
  cfg.sparse_attention = c;
}

void read_progressive_layer_drop(ObjectReader& r, EngineConfig& cfg) {
  nn::ProgressiveLayerDrop& p = cfg.progressive_layer_drop;
  r.read("enabled", p.enabled);
  r.read("theta", p.theta, RealRange{0.0, 1.0, true, false});
  r.read("gamma", p.gamma, RealRange::non_negative());
}

}  // namespace zs::engine::detail
