// ZeRO++'s quantised collectives (comm/quantized_collectives.h).
#include "comm/quantized_collectives.h"

#include <algorithm>
#include <cstring>

#include "comm/quantize.h"
#include "core/errors.h"
#include "memory/dtype.h"

namespace zs::comm {
namespace {

using memory::DType;

void check_dtype(const memory::Tensor& t, const char* what) {
  if (t.dtype() == DType::kI32) {
    throw CommError(fmt::format("quantised collective: {} is int32; int8 blocks carry fp32, bf16 or fp16 values", what));
  }
}

// Quantises n elements of `dtype` at src into wire (16-bit values through an fp32 copy on the host).
void quantize_from(const void* src, DType dtype, size_t n, int32_t* wire, std::vector<float>& tmp) {
  if (dtype == DType::kF32) return quantize_int8(static_cast<const float*>(src), n, wire);
  tmp.resize(n);
  memory::convert(src, dtype, tmp.data(), DType::kF32, n);
  quantize_int8(tmp.data(), n, wire);
}

memory::Tensor words(int32_t* p, size_t n) { return memory::Tensor(p, DType::kI32, {static_cast<int64_t>(n)}); }

}  // namespace

QuantizedAllgather::QuantizedAllgather(const Group& group, std::span<const size_t> counts)
    : group_(group), counts_(counts.begin(), counts.end()) {
  ZS_ASSERT(counts_.size() == static_cast<size_t>(group.size()), "{} counts for a group of {}", counts_.size(), group.size());
  for (size_t c : counts_) {
    words_.push_back(int8_words(c));
    words_total_ += words_.back();
  }
}

uint64_t QuantizedAllgather::run(const memory::Tensor& in, const memory::Tensor& out, void* scratch, bool compute) const {
  check_dtype(in, "the input");
  const size_t me = static_cast<size_t>(group_.rank());
  ZS_ASSERT(static_cast<size_t>(in.numel()) == counts_[me] && in.dtype() == out.dtype(), "quantised allgather: bad input");
  auto* wire = static_cast<int32_t*>(scratch);
  size_t at = 0;
  for (size_t r = 0; r < me; ++r) at += words_[r];
  std::vector<float> tmp;
  if (compute) quantize_from(in.raw(), in.dtype(), counts_[me], wire + at, tmp);
  const uint64_t before = group_.bytes_sent();
  group_.allgatherv(words(wire + at, words_[me]), words(wire, words_total_), words_);
  if (compute) {
    const size_t es = memory::dtype_size(out.dtype());
    size_t w = 0, e = 0;
    for (size_t r = 0; r < counts_.size(); w += words_[r], e += counts_[r], ++r) {
      char* dst = static_cast<char*>(out.raw()) + e * es;
      if (out.dtype() == DType::kF32) {
        dequantize_int8(wire + w, counts_[r], reinterpret_cast<float*>(dst));
        continue;
      }
      tmp.resize(counts_[r]);
      dequantize_int8(wire + w, counts_[r], tmp.data());
      memory::convert(tmp.data(), DType::kF32, dst, out.dtype(), counts_[r]);
    }
  }
  return group_.bytes_sent() - before;
}

QuantizedReduceScatter::QuantizedReduceScatter(const Group& inner, const Group* outer, std::span<const size_t> counts)
    : inner_(inner), outer_(outer), hosts_size_(inner.size()), hosts_(outer ? outer->size() : 1),
      counts_(counts.begin(), counts.end()) {
  ZS_ASSERT(counts_.size() == static_cast<size_t>(hosts_size_) * static_cast<size_t>(hosts_),
            "{} counts for {} hosts of {} ranks", counts_.size(), hosts_, hosts_size_);
  size_t d = 0;
  for (size_t c : counts_) {
    displs_.push_back(d);
    d += c;
    send1_words_ += int8_words(c);
  }
  for (int i = 0; i < hosts_size_; ++i) {
    size_t words = 0, elems = 0;
    for (int o = 0; o < hosts_; ++o) {
      words += int8_words(counts_[rank_of(o, i)]);
      elems += counts_[rank_of(o, i)];
    }
    block1_max_ = std::max(block1_max_, words);
    partial_max_ = std::max(partial_max_, elems);
    if (i == inner.rank()) block1_words_ = words, partial_elems_ = elems;
  }
  for (size_t c : counts_) mine_max_ = std::max(mine_max_, c);
  mine_ = counts_[rank_of(outer ? outer->rank() : 0, inner.rank())];
}

size_t QuantizedReduceScatter::scratch_bytes() const {
  // send1 | recv1 (H blocks) | partial sums (fp32) | send2 | recv2 (O pieces) | the result (fp32)
  size_t words = send1_words_ + static_cast<size_t>(hosts_size_) * block1_max_ + partial_max_;
  if (hosts_ > 1) words += block1_max_ + static_cast<size_t>(hosts_) * int8_words(mine_max_) + mine_max_;
  return words * sizeof(int32_t);
}

uint64_t QuantizedReduceScatter::run(const memory::Tensor& in, const memory::Tensor& out, ReduceOp op, void* scratch,
                                     bool compute) const {
  check_dtype(in, "the input");
  ZS_ASSERT(static_cast<size_t>(out.numel()) == mine_ && in.dtype() == out.dtype(), "quantised reduce-scatter: bad output");
  const size_t H = static_cast<size_t>(hosts_size_), O = static_cast<size_t>(hosts_);
  const size_t i_me = static_cast<size_t>(inner_.rank());
  const size_t es = memory::dtype_size(in.dtype());
  auto* send1 = static_cast<int32_t*>(scratch);
  int32_t* recv1 = send1 + send1_words_;
  auto* partial = reinterpret_cast<float*>(recv1 + H * block1_words_);
  std::vector<float> tmp;
  // Stage 1: to inner peer i', the pieces of ranks o' H + i' for every o' (in o' order).
  std::vector<size_t> send_counts(H), recv_counts(H, block1_words_);
  size_t at = 0;
  for (size_t i = 0; i < H; ++i) {
    for (size_t o = 0; o < O; ++o) {
      const size_t r = rank_of(static_cast<int>(o), static_cast<int>(i));
      if (compute) quantize_from(static_cast<const char*>(in.raw()) + displs_[r] * es, in.dtype(), counts_[r], send1 + at, tmp);
      at += int8_words(counts_[r]);
      send_counts[i] += int8_words(counts_[r]);
    }
  }
  uint64_t sent = inner_.bytes_sent();
  inner_.alltoallv(words(send1, send1_words_), send_counts, words(recv1, H * block1_words_), recv_counts,
                   Group::CountCheck::kSkip);
  sent = inner_.bytes_sent() - sent;
  if (compute) {
    std::fill_n(partial, partial_elems_, 0.0f);
    for (size_t i = 0; i < H; ++i) {  // inner rank order
      const int32_t* block = recv1 + i * block1_words_;
      float* p = partial;
      for (size_t o = 0; o < O; ++o) {
        const size_t n = counts_[rank_of(static_cast<int>(o), static_cast<int>(i_me))];
        dequantize_int8(block, n, p, true);
        block += int8_words(n);
        p += n;
      }
    }
  }
  float* result = partial;  // O = 1: the host's sum is the whole sum
  if (O > 1) {
    // Stage 2: the host's partial of rank o' H + i to outer peer o'.
    int32_t* send2 = reinterpret_cast<int32_t*>(partial + partial_elems_);
    int32_t* recv2 = send2 + block1_words_;
    result = reinterpret_cast<float*>(recv2 + O * int8_words(mine_));
    std::vector<size_t> send2_counts(O), recv2_counts(O, int8_words(mine_));
    const float* p = partial;
    int32_t* w = send2;
    for (size_t o = 0; o < O; ++o) {
      const size_t n = counts_[rank_of(static_cast<int>(o), static_cast<int>(i_me))];
      if (compute) quantize_int8(p, n, w);
      send2_counts[o] = int8_words(n);
      p += n;
      w += int8_words(n);
    }
    const uint64_t before = outer_->bytes_sent();
    outer_->alltoallv(words(send2, block1_words_), send2_counts, words(recv2, O * int8_words(mine_)), recv2_counts,
                      Group::CountCheck::kSkip);
    sent += outer_->bytes_sent() - before;
    if (compute) {
      std::fill_n(result, mine_, 0.0f);
      for (size_t o = 0; o < O; ++o) dequantize_int8(recv2 + o * int8_words(mine_), mine_, result, true);
    }
  }
  if (compute) {
    if (op == ReduceOp::kAverage) {
      const float n = static_cast<float>(H * O);
      for (size_t k = 0; k < mine_; ++k) result[k] /= n;
    }
    memory::convert(result, DType::kF32, out.raw(), out.dtype(), mine_);
  }
  return sent;
}

}  // namespace zs::comm
