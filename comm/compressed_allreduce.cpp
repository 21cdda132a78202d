#include "comm/compressed_allreduce.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "core/errors.h"
#include "memory/tensor.h"

namespace zs::comm {

namespace {

constexpr size_t kBitsPerWord = 32;
constexpr size_t kScaleBlock = OneBitAllreduce::kScaleBlock;

// Elements of chunk j that lie inside the buffer (the rest is padding).
size_t real_in_chunk(size_t numel, size_t chunk, size_t j) {
  const size_t begin = j * chunk;
  return begin >= numel ? 0 : std::min(chunk, numel - begin);
}

// sign(0) = +1 (and -0.0 >= 0 too), so every element has a defined sign bit; a NaN gets -1.
inline bool positive(float v) { return v >= 0.0f; }

// The scale sqrt(sum v^2 / m) = ||v||_2 / sqrt(m) (Note [One-bit allreduce]: why not the L1 mean), summed
// in double (m up to millions of elements: a float running sum would lose digits); 0 when m = 0.
float rms_scale(double sum_squares, size_t m) {
  return m == 0 ? 0.0f : static_cast<float>(std::sqrt(sum_squares / static_cast<double>(m)));
}

inline bool bit_at(const uint32_t* words, size_t k) { return (words[k / kBitsPerWord] >> (k % kBitsPerWord)) & 1u; }

memory::Tensor words_view(std::vector<uint32_t>& v, size_t offset, size_t count) {
  return memory::Tensor(v.data() + offset, memory::DType::kI32, {static_cast<int64_t>(count)});
}

}  // namespace

size_t OneBitAllreduce::chunk_for(size_t numel, int ranks) {
  const size_t n_ranks = static_cast<size_t>(ranks);
  const size_t per_rank = (numel + n_ranks - 1) / n_ranks;
  return (per_rank + kScaleBlock - 1) / kScaleBlock * kScaleBlock;
}

OneBitAllreduce::OneBitAllreduce(const Group& group, size_t numel)
    : group_(&group), numel_(numel), size_(group.size()), rank_(group.rank()) {
  const size_t n_ranks = static_cast<size_t>(size_);
  chunk_ = chunk_for(numel, size_);
  block_words_ = chunk_ / kBitsPerWord + chunk_ / kScaleBlock;
  worker_error_.assign(numel_, 0.0f);
  server_error_.assign(chunk_, 0.0f);
  send_.assign(n_ranks * block_words_, 0u);
  recv_.assign(n_ranks * block_words_, 0u);
  gathered_.assign(n_ranks * block_words_, 0u);
}

memory::ShardRange OneBitAllreduce::server_range() const {
  const size_t j = static_cast<size_t>(rank_);
  return {std::min(j * chunk_, numel_), real_in_chunk(numel_, chunk_, j)};
}

void OneBitAllreduce::reset_errors() {
  std::fill(worker_error_.begin(), worker_error_.end(), 0.0f);
  std::fill(server_error_.begin(), server_error_.end(), 0.0f);
}

uint64_t OneBitAllreduce::wire_bytes_per_call() const {
  if (numel_ == 0) return 0;
  return 2 * static_cast<uint64_t>(size_ - 1) * block_words_ * sizeof(uint32_t);
}

uint64_t OneBitAllreduce::fp32_allreduce_bytes() const {
  const uint64_t n = static_cast<uint64_t>(size_);
  return 2 * (n - 1) * numel_ / n * sizeof(float);  // whole elements first, as Group::allreduce counts
}

void OneBitAllreduce::allreduce(std::span<float> data) {
  if (data.size() != numel_) [[unlikely]] {
    throw CommError(fmt::format(
        "one-bit allreduce on group '{}': got {} elements, but this OneBitAllreduce was built for {}; "
        "pass the buffer it was made for or build one per buffer size",
        group_->name(), data.size(), numel_));
  }
  if (numel_ == 0) return;  // same numel on every rank, so every rank skips
  const size_t n_ranks = static_cast<size_t>(size_);
  const size_t sign_words = chunk_ / kBitsPerWord;  // then one scale word per kScaleBlock elements

  // 1. Worker: compress x = data + worker_error scale block by scale block; keep what the compression
  //    dropped. x is formed twice (for the scale, then for the bits) rather than stored: same rounding
  //    both times, and no n-element scratch buffer.
  for (size_t j = 0; j < n_ranks; ++j) {
    const size_t m = real_in_chunk(numel_, chunk_, j);
    uint32_t* block = send_.data() + j * block_words_;
    std::fill(block, block + block_words_, 0u);  // padding bits and empty scale blocks: 0
    float* d = data.data() + j * chunk_;
    float* e = worker_error_.data() + j * chunk_;
    for (size_t b0 = 0; b0 < m; b0 += kScaleBlock) {
      const size_t b1 = std::min(m, b0 + kScaleBlock);
      double squares = 0;
      for (size_t k = b0; k < b1; ++k) {
        const double x = d[k] + e[k];
        squares += x * x;
      }
      const float s = rms_scale(squares, b1 - b0);
      for (size_t k = b0; k < b1; ++k) {
        const float x = d[k] + e[k];
        const bool pos = positive(x);
        block[k / kBitsPerWord] |= static_cast<uint32_t>(pos) << (k % kBitsPerWord);
        e[k] = x - (pos ? s : -s);
      }
      block[sign_words + b0 / kScaleBlock] = std::bit_cast<uint32_t>(s);
    }
  }

  // 2. Every rank's block j goes to server j.
  group_->alltoall(words_view(send_, 0, send_.size()), words_view(recv_, 0, recv_.size()));

  // 3. Server: average the decompressed contributions to my chunk (in rank order: the same rounding
  //    on every run), add my residual, compress again. server_error_ holds y between the two passes.
  const size_t me = static_cast<size_t>(rank_);
  const size_t m_me = real_in_chunk(numel_, chunk_, me);
  float* se = server_error_.data();
  const float inv_n = 1.0f / static_cast<float>(size_);
  for (size_t k = 0; k < m_me; ++k) {
    float acc = 0.0f;
    for (size_t r = 0; r < n_ranks; ++r) {
      const uint32_t* block = recv_.data() + r * block_words_;
      const float s = std::bit_cast<float>(block[sign_words + k / kScaleBlock]);
      acc += bit_at(block, k) ? s : -s;
    }
    se[k] += acc * inv_n;  // y
  }
  uint32_t* mine = gathered_.data() + me * block_words_;
  std::fill(mine, mine + block_words_, 0u);
  for (size_t b0 = 0; b0 < m_me; b0 += kScaleBlock) {
    const size_t b1 = std::min(m_me, b0 + kScaleBlock);
    double squares = 0;
    for (size_t k = b0; k < b1; ++k) squares += static_cast<double>(se[k]) * se[k];
    const float t = rms_scale(squares, b1 - b0);
    for (size_t k = b0; k < b1; ++k) {
      const bool pos = positive(se[k]);
      mine[k / kBitsPerWord] |= static_cast<uint32_t>(pos) << (k % kBitsPerWord);
      se[k] -= pos ? t : -t;
    }
    mine[sign_words + b0 / kScaleBlock] = std::bit_cast<uint32_t>(t);
  }

  // 4. Every server's compressed chunk to every rank (my block is already in place).
  group_->allgather(words_view(gathered_, me * block_words_, block_words_), words_view(gathered_, 0, gathered_.size()));
  for (size_t j = 0; j < n_ranks; ++j) {
    const size_t m = real_in_chunk(numel_, chunk_, j);
    const uint32_t* block = gathered_.data() + j * block_words_;
    float* d = data.data() + j * chunk_;
    for (size_t k = 0; k < m; ++k) {
      const float tj = std::bit_cast<float>(block[sign_words + k / kScaleBlock]);
      d[k] = bit_at(block, k) ? tj : -tj;
    }
  }
}

}  // namespace zs::comm
