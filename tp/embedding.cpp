#include "tp/embedding.h"

#include <algorithm>

#include "core/errors.h"
#include "nn/detail/ops.h"
#include "nn/detail/parallel.h"
#include "nn/param_access.h"
#include "tp/detail/vocab.h"

namespace zs::tp {

using memory::DType;
using memory::Tensor;
using nn::MemoryUse;

void detail::vocab_lookup(const int32_t* ids, int64_t n, const float* table, int64_t first, int64_t rows, int64_t dim,
                          float* out) {
  nn::detail::parallel_for(n, 64, [=](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t local = static_cast<int64_t>(ids[r]) - first;
      float* o = out + r * dim;
      if (local >= 0 && local < rows) {
        std::copy_n(table + local * dim, dim, o);
      } else {
        std::fill_n(o, dim, 0.0f);
      }
    }
  });
}

void detail::vocab_accumulate(const int32_t* ids, int64_t n, const float* dout, int64_t first, int64_t rows,
                              int64_t dim, float* grad) {
  // Rows may repeat ids: threads split the columns, each summing its columns over the rows in order
  // (as nn::detail::embedding_accumulate).
  nn::detail::parallel_for(dim, 64, [=](int64_t c0, int64_t c1, int) {
    for (int64_t r = 0; r < n; ++r) {
      const int64_t local = static_cast<int64_t>(ids[r]) - first;
      if (local < 0 || local >= rows) continue;
      float* g = grad + local * dim;
      const float* d = dout + r * dim;
      for (int64_t j = c0; j < c1; ++j) g[j] += d[j];
    }
  });
}

namespace {
int64_t rows_per_rank(int64_t num, int parts) {
  ZS_MODEL_CHECK(num > 0 && num % parts == 0, "VocabParallelEmbedding: {} rows do not split over the tensor-parallel "
                 "size {}", num, parts);
  return num / parts;
}
}  // namespace

VocabParallelEmbedding::VocabParallelEmbedding(int64_t num_embeddings, int64_t dim, TensorParallel tp, float init_std,
                                               int64_t padded_num)
    : num_(num_embeddings),
      dim_(dim),
      tp_(tp),
      first_(rows_per_rank(std::max(num_embeddings, padded_num), tp.size()) * tp.rank()),
      weight_(declare_param("weight", {std::max(num_embeddings, padded_num) / tp.size(), dim},
                            nn::Init::normal(0.0f, init_std))) {
  weight_.set_tensor_slice(
      {.dim = 0, .parts = tp.size(), .index = tp.rank(), .full_extent = padded_num > num_embeddings ? num_embeddings : 0});
}

Tensor VocabParallelEmbedding::forward(nn::Context& ctx, const Tensor& ids) {
  ZS_MODEL_CHECK(ids.raw() != nullptr && ids.dtype() == DType::kI32 && ids.is_contiguous(),
                 "VocabParallelEmbedding: expected contiguous int32 ids, got a {} tensor {}",
                 memory::dtype_name(ids.dtype()), memory::shape_string(ids.shape()));
  if (nn::detail::kernels_enabled()) nn::detail::check_ids(ids.data<int32_t>(), ids.numel(), num_, "token");
  const Tensor w = nn::weight_f32(ctx, weight_);
  memory::Shape shape = ids.shape();
  shape.push_back(dim_);
  const bool shard = tp_.sharded_sequence();
  Tensor y = ctx.allocate(shape, DType::kF32, shard ? MemoryUse::kScratch : MemoryUse::kActivation);
  detail::vocab_lookup(ids.data<int32_t>(), ids.numel(), w.data<float>(), first_, weight_.shape()[0], dim_,
                       y.data<float>());
  if (shard) {
    y = reduce_scatter_sequence(ctx, tp_, y, MemoryUse::kActivation);
  } else {
    all_reduce(tp_, y);
  }
  if (ctx.training()) ids_ = ids;
  return y;
}

Tensor VocabParallelEmbedding::backward(nn::Context& ctx, const Tensor& dy) {
  const Tensor full = tp_.sharded_sequence() ? gather_sequence(ctx, tp_, dy, MemoryUse::kScratch) : dy;
  const int64_t n = nn::detail::rows_of(full, dim_, "VocabParallelEmbedding backward");
  ZS_MODEL_CHECK(n == ids_.numel(), "VocabParallelEmbedding backward: dy {} for {} ids",
                 memory::shape_string(dy.shape()), ids_.numel());
  nn::GradAccumulator gw(ctx, weight_);
  detail::vocab_accumulate(ids_.data<int32_t>(), n, full.data<float>(), first_, weight_.shape()[0], dim_, gw.data());
  gw.commit();
  ids_ = {};
  return {};
}

}  // namespace zs::tp
