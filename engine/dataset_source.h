// DatasetSource: the BatchSource over an nn::Dataset that the tool, the tests and the benchmarks use.
//
//   engine::DatasetSource source(nn::Dataset::builtin(seq_len), /*seed=*/7);
//   engine.train_batch(source);
//
// Samples are a pure function of (seed, step, global sample index) (nn/data.h), so the global batch
// is the same for every world size and accumulation setting. With `min_seq_len` below the dataset's
// seq_len (`data.min_seq_len`), each step's samples have the length Dataset::seq_len_at draws for it.
#pragma once

#include <cstdint>
#include <utility>

#include "engine/engine.h"
#include "nn/data.h"

namespace zs::engine {

class DatasetSource final : public BatchSource {
 public:
  // min_seq_len: 0 for samples of the dataset's seq_len, else 1..seq_len (varying lengths).
  DatasetSource(nn::Dataset data, uint64_t seed, int64_t min_seq_len = 0)
      : data_(std::move(data)), seed_(seed), min_seq_len_(min_seq_len > 0 ? min_seq_len : data_.seq_len()) {}
  void fill(nn::Batch& batch, int64_t step, int64_t first_sample, int64_t count) override {
    data_.fill_batch(batch, seed_, static_cast<uint64_t>(step), static_cast<uint64_t>(first_sample), count,
                     seq_len_at(step));
  }
  // Tokens per sample of `step` (the engine's step index: optimizer steps before it).
  int64_t seq_len_at(int64_t step) const { return data_.seq_len_at(seed_, static_cast<uint64_t>(step), min_seq_len_); }
  const nn::Dataset& data() const { return data_; }

 private:
  nn::Dataset data_;
  uint64_t seed_;
  int64_t min_seq_len_;
};

}  // namespace zs::engine
