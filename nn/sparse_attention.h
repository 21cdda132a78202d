// Block-sparse causal attention layouts: DeepSpeed's `sparse_attention` section (its
// ops/sparse_attention/sparsity_config.py), computed on the fused attention (nn/fused_attention.h),
// which skips the 64 x 64 blocks a layout masks in its forward and backward.
//
//   nn::SparseAttentionConfig c{.mode = nn::SparsityMode::kFixed, .block = 16};
//   auto layout = std::make_shared<const nn::SparseLayout>(c, /*n_head=*/8, /*max_seq_len=*/1024);
//   attn.set_sparsity(layout);   // nn::CausalSelfAttention; the GPT and LLaMA models take it from their config
//
// A layout is (heads, nb, nb) bits over blocks of `block` positions, nb = ceil(max_seq_len / block):
// query block r may attend to key block c where the bit is set. It is made once for the longest
// sequence; a shorter one uses its top-left corner, as DeepSpeed slices its master layout. The
// built-in models are causal: position q attends to k only where k <= q AND the layout allows the
// blocks, so blocks above the diagonal never matter, whatever `attention` says (`unidirectional`
// still changes which earlier blocks BigBird draws as random ones). Every layout here allows each
// row's diagonal block, so every position attends at least to itself. Note [sparse layouts] in
// sparse_attention.cpp has the layouts.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace zs::nn {

// "dense" (every block: the causal attention), "fixed", "bigbird", "bslongformer". DeepSpeed's
// "variable" is not built (refused by name at parsing).
enum class SparsityMode : uint8_t { kDense, kFixed, kBigBird, kBsLongformer };
const char* sparsity_mode_name(SparsityMode m);

// The `sparse_attention` section, DeepSpeed's keys and defaults (runtime/constants.py). Which keys a
// mode reads: fixed: num_local_blocks, num_global_blocks, attention, horizontal_global_attention,
// num_different_global_patterns; bigbird: num_random_blocks, num_sliding_window_blocks,
// num_global_blocks, attention; bslongformer: num_sliding_window_blocks, global_block_indices,
// global_block_end_indices, attention. All modes: block, different_layout_per_head.
struct SparseAttentionConfig {
  SparsityMode mode = SparsityMode::kFixed;
  int64_t block = 16;  // divides 64 or is a multiple of 64 (the fused kernel's block), Note [sparse tiles]
  bool different_layout_per_head = false;
  int64_t num_local_blocks = 4;
  int64_t num_global_blocks = 1;
  bool unidirectional = false;  // attention: "unidirectional" (true) or "bidirectional" (DeepSpeed's default)
  bool horizontal_global_attention = false;
  int64_t num_different_global_patterns = 1;
  int64_t num_random_blocks = 0;
  int64_t num_sliding_window_blocks = 3;
  std::vector<int64_t> global_block_indices = {0};
  std::vector<int64_t> global_block_end_indices{};  // empty: DeepSpeed's None
  uint64_t seed = 0;  // BigBird's random blocks (not a DeepSpeed key: the run's seed, so every rank agrees)
};

// Throws ConfigError naming `sparse_attention.<key>` for what DeepSpeed's constructors refuse and for
// a block the fused kernel does not take.
void validate(const SparseAttentionConfig& c);

class SparseLayout {
 public:
  // n_head: the model's heads (all of them, also under tensor parallelism). Throws ConfigError naming
  // the key where the layout does not fit max_seq_len's nb blocks (DeepSpeed's make_layout errors).
  SparseLayout(const SparseAttentionConfig& c, int64_t n_head, int64_t max_seq_len);

  int64_t block() const { return block_; }
  int64_t num_blocks() const { return nb_; }
  int64_t n_head() const { return n_head_; }
  const SparseAttentionConfig& config() const { return cfg_; }
  // Whether query block r of head h may attend to key block c (the layout bit; causality aside).
  bool block_allowed(int64_t head, int64_t r, int64_t c) const {
    return bits_[static_cast<size_t>(((heads_ == 1 ? 0 : head) * nb_ + r) * nb_ + c)] != 0;
  }
  // Position-level: k <= q and the blocks allowed.
  bool allows(int64_t head, int64_t q, int64_t k) const { return k <= q && block_allowed(head, q / block_, k / block_); }

  // A kernel tile of query positions [q0, q0 + rows) x key positions [k0, k0 + cols): kEmpty when no
  // causal position of it is allowed, kFull when every causal position is (the dense kernel's path),
  // else kPartial.
  enum class Tile : uint8_t { kEmpty, kFull, kPartial };
  Tile tile(int64_t head, int64_t q0, int64_t rows, int64_t k0, int64_t cols) const;
  // The fraction of the causal block pairs (c <= r) of a seq_len-long sequence that head 0's layout
  // allows: for logs ("fixed, block 16: 23% of the causal blocks").
  double density(int64_t seq_len) const;
  std::string describe(int64_t seq_len) const;

 private:
  void set(int64_t h, int64_t r, int64_t c) { bits_[static_cast<size_t>((h * nb_ + r) * nb_ + c)] = 1; }
  void make_fixed(int64_t h);
  void make_bigbird(int64_t h, uint64_t seed);
  void make_bslongformer(int64_t h);

  SparseAttentionConfig cfg_;
  int64_t n_head_ = 0, block_ = 0, nb_ = 0, heads_ = 0;  // heads_: layouts kept (1 when shared)
  std::vector<uint8_t> bits_;                            // (heads_, nb_, nb_)
};

// The layout of a model of n_head heads and max_seq_len positions, shared by its layers; null for none.
std::shared_ptr<const SparseLayout> make_sparse_layout(const std::optional<SparseAttentionConfig>& c, int64_t n_head,
                                                       int64_t max_seq_len);

// What the fused attention kernel needs: the layout and the model head of the kernel's query head 0
// (a tensor-parallel rank holds heads first_head...). layout null: dense causal attention.
struct BlockSparsity {
  const SparseLayout* layout = nullptr;
  int64_t first_head = 0;
};

}  // namespace zs::nn
