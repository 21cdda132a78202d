#include "nn/sparse_attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "core/errors.h"

// Note [sparse layouts]
// The layouts follow DeepSpeed's sparsity_config.py (FixedSparsityConfig, BigBirdSparsityConfig,
// BSLongformerSparsityConfig), written from its description, over nb blocks:
//  - fixed (Sparse Transformers): local windows of num_local_blocks blocks, each block attending
//    within its window (up to itself when unidirectional); and global columns: in each full window
//    the num_global_blocks blocks starting at num_local_blocks - (1 + h % num_different_global_patterns)
//    * num_global_blocks are attended by every later row (every row when bidirectional), and with
//    horizontal_global_attention attend to every column; a last short window gets its global blocks
//    at the same offset, clamped to the end.
//  - bigbird: num_random_blocks random columns per row (among all blocks, or the row's own and
//    earlier ones when unidirectional), a sliding window of num_sliding_window_blocks centred on the
//    row, and the first num_global_blocks rows and columns.
//  - bslongformer: the sliding window, and the blocks of global_block_indices (or the ranges
//    [global_block_indices[i], global_block_end_indices[i])) as whole rows and columns.
// unidirectional keeps the lower triangle only (bigbird, bslongformer); the built-in models are
// causal anyway (sparse_attention.h). DeepSpeed draws BigBird's random blocks with Python's random
// module, different on every rank and run; here they come from a counter-based generator keyed by
// the run's seed, the head and the row, so every rank (and a resumed run) has the same layout. Where
// DeepSpeed's random.sample would fail (a unidirectional row with fewer earlier blocks than
// num_random_blocks), the row takes all of them. One layout serves every layer (DeepSpeed draws one
// per layer's SparseSelfAttention).

namespace zs::nn {
namespace {

[[noreturn]] void bad(std::string_view key, const std::string& why) {
  throw ConfigError(fmt::format("sparse_attention.{}: {}", key, why));
}

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

const char* sparsity_mode_name(SparsityMode m) {
  switch (m) {
    case SparsityMode::kDense: return "dense";
    case SparsityMode::kFixed: return "fixed";
    case SparsityMode::kBigBird: return "bigbird";
    case SparsityMode::kBsLongformer: return "bslongformer";
  }
  return "?";
}

void validate(const SparseAttentionConfig& c) {
  // Note [sparse tiles] in fused_attention.cpp: a block that divides 64 or a multiple of 64 lines its
  // edges up with the kernel's 64 x 64 tiles.
  if (c.block < 1 || (64 % c.block != 0 && c.block % 64 != 0)) {
    bad("block", fmt::format("{} does not line up with the fused attention's 64-position blocks; use a divisor of 64 "
                             "(16, 32, 64: DeepSpeed's default is 16) or a multiple of 64 (128, 256)",
                             c.block));
  }
  if (c.mode == SparsityMode::kFixed) {
    if (c.num_local_blocks < 1) bad("num_local_blocks", fmt::format("{} must be at least 1", c.num_local_blocks));
    if (c.num_global_blocks < 1) bad("num_global_blocks", fmt::format("{} must be at least 1", c.num_global_blocks));
    if (c.num_local_blocks % c.num_global_blocks != 0) {
      bad("num_global_blocks", fmt::format("{} must divide num_local_blocks ({}), as DeepSpeed requires",
                                           c.num_global_blocks, c.num_local_blocks));
    }
    if (c.unidirectional && c.horizontal_global_attention) {
      bad("horizontal_global_attention", "true needs attention \"bidirectional\" (as in DeepSpeed); set it to false");
    }
    if (c.num_different_global_patterns < 1) {
      bad("num_different_global_patterns", fmt::format("{} must be at least 1", c.num_different_global_patterns));
    }
    if (c.num_different_global_patterns > 1 && !c.different_layout_per_head) {
      bad("num_different_global_patterns", fmt::format("{} patterns need different_layout_per_head: true (one layout "
                                                       "for all heads has one pattern); set it or use 1",
                                                       c.num_different_global_patterns));
    }
    if (c.num_different_global_patterns > c.num_local_blocks / c.num_global_blocks) {
      bad("num_different_global_patterns",
          fmt::format("{} is more than num_local_blocks / num_global_blocks = {} / {} = {}",
                      c.num_different_global_patterns, c.num_local_blocks, c.num_global_blocks,
                      c.num_local_blocks / c.num_global_blocks));
    }
  }
  if (c.mode == SparsityMode::kBigBird) {
    if (c.num_random_blocks < 0) bad("num_random_blocks", fmt::format("{} must be >= 0", c.num_random_blocks));
    if (c.num_global_blocks < 0) bad("num_global_blocks", fmt::format("{} must be >= 0", c.num_global_blocks));
  }
  if (c.mode == SparsityMode::kBigBird || c.mode == SparsityMode::kBsLongformer) {
    if (c.num_sliding_window_blocks < 1) {
      bad("num_sliding_window_blocks", fmt::format("{} must be at least 1", c.num_sliding_window_blocks));
    }
  }
  if (c.mode == SparsityMode::kBsLongformer) {
    for (int64_t i : c.global_block_indices) {
      if (i < 0) bad("global_block_indices", fmt::format("{} is negative; block indices start at 0", i));
    }
    if (!c.global_block_end_indices.empty()) {
      if (c.global_block_end_indices.size() != c.global_block_indices.size()) {
        bad("global_block_end_indices", fmt::format("has {} entries and global_block_indices {}; give one end per start",
                                                    c.global_block_end_indices.size(), c.global_block_indices.size()));
      }
      for (size_t i = 0; i < c.global_block_indices.size(); ++i) {
        if (c.global_block_indices[i] >= c.global_block_end_indices[i]) {
          bad("global_block_end_indices", fmt::format("entry {} ({}) must be greater than its start {}", i,
                                                      c.global_block_end_indices[i], c.global_block_indices[i]));
        }
      }
    }
  }
}

std::shared_ptr<const SparseLayout> make_sparse_layout(const std::optional<SparseAttentionConfig>& c, int64_t n_head,
                                                       int64_t max_seq_len) {
  return c ? std::make_shared<const SparseLayout>(*c, n_head, max_seq_len) : nullptr;
}

SparseLayout::SparseLayout(const SparseAttentionConfig& c, int64_t n_head, int64_t max_seq_len)
    : cfg_(c), n_head_(n_head), block_(c.block) {
  validate(c);
  ZS_ASSERT(n_head > 0 && max_seq_len > 0, "sparse layout of {} heads over {} positions", n_head, max_seq_len);
  nb_ = (max_seq_len + block_ - 1) / block_;
  heads_ = c.different_layout_per_head ? n_head : 1;
  bits_.assign(static_cast<size_t>(heads_ * nb_ * nb_), 0);
  for (int64_t h = 0; h < heads_; ++h) {
    switch (c.mode) {
      case SparsityMode::kDense: std::fill(bits_.begin(), bits_.end(), 1); break;
      case SparsityMode::kFixed: make_fixed(h); break;
      case SparsityMode::kBigBird: make_bigbird(h, c.seed); break;
      case SparsityMode::kBsLongformer: make_bslongformer(h); break;
    }
    if (c.unidirectional && c.mode != SparsityMode::kFixed) {
      for (int64_t r = 0; r < nb_; ++r) {
        for (int64_t col = r + 1; col < nb_; ++col) bits_[static_cast<size_t>((h * nb_ + r) * nb_ + col)] = 0;
      }
    }
    for (int64_t r = 0; r < nb_; ++r) {
      ZS_ASSERT(block_allowed(h, r, r), "sparse layout {}: block row {} of head {} misses its diagonal block",
                sparsity_mode_name(c.mode), r, h);
    }
  }
}

void SparseLayout::make_fixed(int64_t h) {
  const int64_t L = cfg_.num_local_blocks, G = cfg_.num_global_blocks, nb = nb_;
  const bool bi = !cfg_.unidirectional;
  for (int64_t i = 0; i < nb; i += L) {
    const int64_t end = std::min(i + L, nb);
    for (int64_t r = i; r < end; ++r) {
      for (int64_t col = i; col < (bi ? end : r + 1); ++col) set(h, r, col);
    }
  }
  auto global = [&](int64_t start, int64_t stop) {
    for (int64_t r = bi ? 0 : start; r < nb; ++r) {
      for (int64_t col = start; col < stop; ++col) set(h, r, col);
    }
    if (cfg_.horizontal_global_attention) {
      for (int64_t r = start; r < stop; ++r) {
        for (int64_t col = 0; col < nb; ++col) set(h, r, col);
      }
    }
  };
  const int64_t first = L - (1 + h % cfg_.num_different_global_patterns) * G;
  const int64_t full_end = nb - nb % L;
  for (int64_t i = first; i < full_end; i += L) global(i, i + G);
  if (full_end < nb) {  // the last, short window
    const int64_t start = std::min(full_end + first, nb - G);
    if (start < 0) {
      bad("num_global_blocks", fmt::format("{} global blocks do not fit the {} blocks of the longest sequence; use at "
                                           "most {} or a smaller block",
                                           G, nb, nb));
    }
    global(start, start + G);
  }
}

void SparseLayout::make_bigbird(int64_t h, uint64_t seed) {
  const int64_t nb = nb_, R = cfg_.num_random_blocks, W = cfg_.num_sliding_window_blocks, G = cfg_.num_global_blocks;
  if (nb < R) bad("num_random_blocks", fmt::format("{} is more than the {} blocks of the longest sequence", R, nb));
  if (nb < W) bad("num_sliding_window_blocks", fmt::format("{} is more than the {} blocks of the longest sequence", W, nb));
  if (nb < G) bad("num_global_blocks", fmt::format("{} is more than the {} blocks of the longest sequence", G, nb));
  std::vector<int64_t> pool;
  for (int64_t r = 0; r < nb; ++r) {
    const int64_t n = cfg_.unidirectional ? r + 1 : nb;
    pool.resize(static_cast<size_t>(n));
    std::iota(pool.begin(), pool.end(), int64_t{0});
    // A partial Fisher-Yates shuffle: R distinct columns, keyed by (seed, head, row).
    uint64_t state = mix(seed ^ mix(static_cast<uint64_t>(h) * 0x100000001b3ULL + static_cast<uint64_t>(r)));
    for (int64_t k = 0; k < std::min(R, n); ++k) {
      state = mix(state);
      const int64_t pick = k + static_cast<int64_t>(state % static_cast<uint64_t>(n - k));
      std::swap(pool[static_cast<size_t>(k)], pool[static_cast<size_t>(pick)]);
      set(h, r, pool[static_cast<size_t>(k)]);
    }
  }
  const int64_t w = W / 2;
  for (int64_t r = 0; r < nb; ++r) {
    for (int64_t col = std::max<int64_t>(0, r - w); col < std::min(r + w + 1, nb); ++col) set(h, r, col);
  }
  for (int64_t r = 0; r < nb; ++r) {
    for (int64_t col = 0; col < nb; ++col) {
      if (r < G || col < G) set(h, r, col);
    }
  }
}

void SparseLayout::make_bslongformer(int64_t h) {
  const int64_t nb = nb_, W = cfg_.num_sliding_window_blocks;
  if (nb < W) bad("num_sliding_window_blocks", fmt::format("{} is more than the {} blocks of the longest sequence", W, nb));
  const int64_t w = W / 2;
  for (int64_t r = 0; r < nb; ++r) {
    for (int64_t col = std::max<int64_t>(0, r - w); col < std::min(r + w + 1, nb); ++col) set(h, r, col);
  }
  const auto& starts = cfg_.global_block_indices;
  for (size_t i = 0; i < starts.size(); ++i) {
    const int64_t start = starts[i];
    if (start >= nb) continue;  // beyond the sequence, as DeepSpeed skips it
    const int64_t stop = cfg_.global_block_end_indices.empty() ? start + 1 : std::min(cfg_.global_block_end_indices[i], nb);
    for (int64_t g = start; g < stop; ++g) {
      for (int64_t k = 0; k < nb; ++k) {
        set(h, g, k);
        set(h, k, g);
      }
    }
  }
}

SparseLayout::Tile SparseLayout::tile(int64_t head, int64_t q0, int64_t rows, int64_t k0, int64_t cols) const {
  bool any = false, all = true;
  for (int64_t r = q0 / block_; r * block_ < q0 + rows; ++r) {
    const int64_t q_hi = std::min(q0 + rows, (r + 1) * block_);  // exclusive
    for (int64_t c = k0 / block_; c * block_ < k0 + cols; ++c) {
      const int64_t k_lo = std::max(k0, c * block_);
      if (k_lo > q_hi - 1) break;  // no causal position in this pair (nor in later columns)
      if (block_allowed(head, r, c)) {
        any = true;
      } else {
        all = false;
      }
    }
  }
  return !any ? Tile::kEmpty : all ? Tile::kFull : Tile::kPartial;
}

double SparseLayout::density(int64_t seq_len) const {
  const int64_t n = std::min(nb_, (seq_len + block_ - 1) / block_);
  int64_t on = 0, total = 0;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c <= r; ++c) {
      on += block_allowed(0, r, c) ? 1 : 0;
      ++total;
    }
  }
  return total == 0 ? 1.0 : static_cast<double>(on) / static_cast<double>(total);
}

std::string SparseLayout::describe(int64_t seq_len) const {
  return fmt::format("{}, block {}: {:.0f}% of the causal blocks at length {}{}", sparsity_mode_name(cfg_.mode), block_,
                     100.0 * density(seq_len), seq_len, heads_ > 1 ? " (head 0; a layout per head)" : "");
}

}  // namespace zs::nn
