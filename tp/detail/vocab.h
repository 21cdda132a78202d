// Internal: this rank's part of a vocab-parallel lookup, for tp::VocabParallelEmbedding and the
// tensor-parallel GPT's token embedding. Rows [first, first + rows) of the vocabulary live here.
#pragma once

#include <cstdint>

namespace zs::tp::detail {

// out[r, :] = table[ids[r] - first, :] for ids in [first, first + rows), else 0. Ids are checked by the
// caller (nn::detail::check_ids against the whole vocabulary).
void vocab_lookup(const int32_t* ids, int64_t n, const float* table, int64_t first, int64_t rows, int64_t dim,
                  float* out);

// grad[ids[r] - first, :] += dout[r, :] for the ids in [first, first + rows).
void vocab_accumulate(const int32_t* ids, int64_t n, const float* dout, int64_t first, int64_t rows, int64_t dim,
                      float* grad);

}  // namespace zs::tp::detail
