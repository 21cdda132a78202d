#include "comm/compressed_allreduce.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>

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
  init_blocks();
}

void OneBitAllreduce::init_blocks() {
  chunk_ = chunk_for(numel_, size_);
  sign_words_ = chunk_ / kBitsPerWord;
  block_words_ = sign_words_ + chunk_ / kScaleBlock;
  server_len_ = real_in_chunk(numel_, chunk_, static_cast<size_t>(rank_));
  worker_error_.assign(numel_, 0.0f);
  server_error_.assign(chunk_, 0.0f);
  allocate_wire();
}

void OneBitAllreduce::allocate_wire() {
  const size_t words = static_cast<size_t>(size_) * block_words_;
  send_.assign(words, 0u);
  recv_.assign(words, 0u);
  gathered_.assign(words, 0u);
}

size_t OneBitAllreduce::padded_tensor(size_t n, int ranks) {
  const size_t n_ranks = static_cast<size_t>(ranks);
  const size_t divider = n_ranks * 8 / std::gcd(n_ranks, size_t{8});  // DeepSpeed's self.divider
  const size_t unit = n_ranks * divider;
  return (n + unit - 1) / unit * unit;
}

size_t OneBitAllreduce::state_floats_for(size_t numel, int ranks, std::span<const memory::ShardRange> tensors,
                                         Scales scales) {
  if (scales == Scales::kBlocks) return numel + chunk_for(numel, ranks);
  size_t floats = 0;
  for (const memory::ShardRange& r : tensors) {
    const size_t padded = padded_tensor(r.size, ranks);
    floats += padded + padded / static_cast<size_t>(ranks);  // worker residual + this rank's chunk
  }
  return floats;
}

OneBitAllreduce::OneBitAllreduce(const Group& group, size_t numel, std::span<const memory::ShardRange> tensors,
                                 Scales scales)
    : group_(&group), numel_(numel), size_(group.size()), rank_(group.rank()) {
  size_t end = 0;
  for (const memory::ShardRange& r : tensors) {
    ZS_ASSERT(r.offset >= end && r.offset + r.size <= numel && r.size > 0,
              "OneBitAllreduce: tensor [{}, {}) is empty, overlaps the one before (ending at {}) or lies past "
              "the buffer's {} elements",
              r.offset, r.offset + r.size, end, numel);
    if (r.offset > end) gaps_.push_back({end, r.offset - end});
    end = r.offset + r.size;
  }
  if (numel > end) gaps_.push_back({end, numel - end});
  if (scales == Scales::kBlocks) {
    init_blocks();
    return;
  }

  per_tensor_ = true;
  const size_t n_ranks = static_cast<size_t>(size_);
  size_t worker = 0, bits = 0;
  for (const memory::ShardRange& r : tensors) {
    TensorPlan p{.offset = r.offset, .numel = r.size, .padded = padded_tensor(r.size, size_)};
    p.chunk = p.padded / n_ranks;
    p.worker_at = worker;
    p.server_at = bits;
    p.bit_at = bits;
    worker += p.padded;
    bits += p.chunk;
    tensors_.push_back(p);
  }
  chunk_ = bits;
  sign_words_ = (bits + kBitsPerWord - 1) / kBitsPerWord;
  block_words_ = sign_words_ + tensors_.size();
  server_len_ = bits;
  worker_error_.assign(worker, 0.0f);
  server_error_.assign(bits, 0.0f);
  allocate_wire();
}

void OneBitAllreduce::zero_gaps(std::span<float> data) const {
  for (const memory::ShardRange& g : gaps_) std::fill_n(data.data() + g.offset, g.size, 0.0f);
}

memory::ShardRange OneBitAllreduce::server_range() const {
  ZS_ASSERT(!per_tensor_, "OneBitAllreduce::server_range: per tensor, a rank serves one chunk of every tensor");
  const size_t j = static_cast<size_t>(rank_);
  return {std::min(j * chunk_, numel_), real_in_chunk(numel_, chunk_, j)};
}

void OneBitAllreduce::reset_errors() {
  std::fill(worker_error_.begin(), worker_error_.end(), 0.0f);
  std::fill(server_error_.begin(), server_error_.end(), 0.0f);
}

uint64_t OneBitAllreduce::wire_bytes_per_call() const {
  if (block_words_ == 0) return 0;
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
  zero_gaps(data);
  if (block_words_ == 0) return;  // nothing to compress: the same on every rank, so every rank skips
  if (per_tensor_) worker_tensors(data);
  else worker_blocks(data);
  // 2. Every rank's block j goes to server j.
  group_->alltoall(words_view(send_, 0, send_.size()), words_view(recv_, 0, recv_.size()));
  if (per_tensor_) server_tensors();
  else server_blocks();
  // 4. Every server's compressed chunk to every rank (my block is already in place).
  const size_t me = static_cast<size_t>(rank_);
  group_->allgather(words_view(gathered_, me * block_words_, block_words_), words_view(gathered_, 0, gathered_.size()));
  if (per_tensor_) write_tensors(data);
  else write_blocks(data);
  zero_gaps(data);  // write_blocks wrote the gaps too
}

void OneBitAllreduce::worker_blocks(std::span<float> data) {
  // 1. Worker: compress x = data + worker_error scale block by scale block; keep what the compression
  //    dropped. x is formed twice (for the scale, then for the bits) rather than stored: same rounding
  //    both times, and no n-element scratch buffer.
  const size_t n_ranks = static_cast<size_t>(size_);
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
      block[sign_words_ + b0 / kScaleBlock] = std::bit_cast<uint32_t>(s);
    }
  }
}

void OneBitAllreduce::server_blocks() {
  // 3. Server: average the decompressed contributions to my chunk (in rank order: the same rounding
  //    on every run), add my residual, compress again. server_error_ holds y between the two passes.
  const size_t n_ranks = static_cast<size_t>(size_);
  const size_t me = static_cast<size_t>(rank_);
  const size_t m_me = real_in_chunk(numel_, chunk_, me);
  float* se = server_error_.data();
  const float inv_n = 1.0f / static_cast<float>(size_);
  for (size_t k = 0; k < m_me; ++k) {
    float acc = 0.0f;
    for (size_t r = 0; r < n_ranks; ++r) {
      const uint32_t* block = recv_.data() + r * block_words_;
      const float s = std::bit_cast<float>(block[sign_words_ + k / kScaleBlock]);
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
    mine[sign_words_ + b0 / kScaleBlock] = std::bit_cast<uint32_t>(t);
  }
}

void OneBitAllreduce::write_blocks(std::span<float> data) const {
  for (size_t j = 0; j < static_cast<size_t>(size_); ++j) {
    const size_t m = real_in_chunk(numel_, chunk_, j);
    const uint32_t* block = gathered_.data() + j * block_words_;
    float* d = data.data() + j * chunk_;
    for (size_t k = 0; k < m; ++k) {
      const float tj = std::bit_cast<float>(block[sign_words_ + k / kScaleBlock]);
      d[k] = bit_at(block, k) ? tj : -tj;
    }
  }
}

// --- Per tensor (Note [Per-tensor scales]). Tensor t's scale word is word sign_words_ + t. ---

void OneBitAllreduce::worker_tensors(std::span<const float> data) {
  std::fill(send_.begin(), send_.end(), 0u);
  for (size_t t = 0; t < tensors_.size(); ++t) {
    const TensorPlan& p = tensors_[t];
    const float* d = data.data() + p.offset;
    float* e = worker_error_.data() + p.worker_at;
    // The padding is DeepSpeed's zeros plus their own residual: x = 0 + e = e exactly.
    auto x_at = [&](size_t k) { return k < p.numel ? d[k] + e[k] : e[k]; };
    double squares = 0;
    for (size_t k = 0; k < p.padded; ++k) {
      const double x = x_at(k);
      squares += x * x;
    }
    const float s = rms_scale(squares, p.padded);
    for (size_t k = 0; k < p.padded; ++k) {
      const float x = x_at(k);
      const bool pos = positive(x);
      const size_t j = k / p.chunk;
      const size_t bit = p.bit_at + (k - j * p.chunk);
      send_[j * block_words_ + bit / kBitsPerWord] |= static_cast<uint32_t>(pos) << (bit % kBitsPerWord);
      e[k] = x - (pos ? s : -s);
    }
    for (size_t j = 0; j < static_cast<size_t>(size_); ++j) send_[j * block_words_ + sign_words_ + t] = std::bit_cast<uint32_t>(s);
  }
}

void OneBitAllreduce::server_tensors() {
  const size_t n_ranks = static_cast<size_t>(size_);
  const size_t me = static_cast<size_t>(rank_);
  const float inv_n = 1.0f / static_cast<float>(size_);
  uint32_t* mine = gathered_.data() + me * block_words_;
  std::fill(mine, mine + block_words_, 0u);
  for (size_t t = 0; t < tensors_.size(); ++t) {
    const TensorPlan& p = tensors_[t];
    float* se = server_error_.data() + p.server_at;
    double squares = 0;
    for (size_t k = 0; k < p.chunk; ++k) {
      float acc = 0.0f;
      for (size_t r = 0; r < n_ranks; ++r) {
        const uint32_t* block = recv_.data() + r * block_words_;
        const float s = std::bit_cast<float>(block[sign_words_ + t]) * inv_n;
        acc += bit_at(block, p.bit_at + k) ? s : -s;
      }
      se[k] = acc + se[k];  // y
      squares += static_cast<double>(se[k]) * se[k];
    }
    const float scale = rms_scale(squares, p.chunk);
    for (size_t k = 0; k < p.chunk; ++k) {
      const bool pos = positive(se[k]);
      const size_t bit = p.bit_at + k;
      mine[bit / kBitsPerWord] |= static_cast<uint32_t>(pos) << (bit % kBitsPerWord);
      se[k] -= pos ? scale : -scale;
    }
    mine[sign_words_ + t] = std::bit_cast<uint32_t>(scale);
  }
}

void OneBitAllreduce::write_tensors(std::span<float> data) const {
  for (size_t t = 0; t < tensors_.size(); ++t) {
    const TensorPlan& p = tensors_[t];
    float* d = data.data() + p.offset;
    for (size_t k = 0; k < p.numel; ++k) {
      const size_t j = k / p.chunk;
      const uint32_t* block = gathered_.data() + j * block_words_;
      const float scale = std::bit_cast<float>(block[sign_words_ + t]);
      d[k] = bit_at(block, p.bit_at + (k - j * p.chunk)) ? scale : -scale;
    }
  }
}

}  // namespace zs::comm
