#include "nn/cross_entropy.h"

#include <cmath>

#include "core/errors.h"
#include "nn/detail/ops.h"
#include "nn/detail/parallel.h"

namespace zs::nn {

using memory::DType;
using memory::Tensor;

float SoftmaxCrossEntropy::forward(Context& ctx, const Tensor& logits, const Tensor& targets) {
  ZS_MODEL_CHECK(logits.raw() != nullptr && logits.dtype() == DType::kF32 && logits.is_contiguous() && logits.dim() >= 1,
            "cross-entropy: expected contiguous fp32 logits");
  const int64_t V = logits.size(-1);
  const int64_t N = logits.numel() / V;
  ZS_MODEL_CHECK(targets.raw() != nullptr && targets.dtype() == DType::kI32 && targets.numel() == N,
            "cross-entropy: {} int32 targets needed for logits {}, got a {} tensor {}", N,
            memory::shape_string(logits.shape()), memory::dtype_name(targets.dtype()),
            memory::shape_string(targets.shape()));
  const bool train = ctx.training();
  Tensor lse = ctx.allocate({N}, DType::kF32, train ? MemoryUse::kActivation : MemoryUse::kScratch);
  Tensor row_loss = ctx.allocate({N}, DType::kF32, MemoryUse::kScratch);
  const float* lp = logits.data<float>();
  const int32_t* tp = targets.data<int32_t>();
  detail::check_ids(tp, N, V, "target");
  float* lsep = lse.data<float>();
  float* rl = row_loss.data<float>();
  detail::parallel_for(N, 8, [=](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = lp + r * V;
      const float mx = detail::max_of(row, V);
      float sum = 0.0f;
      for (int64_t j = 0; j < V; ++j) sum += std::exp(row[j] - mx);
      const float l = mx + std::log(sum);
      lsep[r] = l;
      rl[r] = l - row[tp[r]];
    }
  });
  double total = 0.0;  // a sum over up to millions of tokens: in double, serially (thread-independent)
  for (int64_t r = 0; r < N; ++r) total += static_cast<double>(rl[r]);
  if (train) {
    logits_ = logits;
    targets_ = targets;
    lse_ = lse;
  }
  return N > 0 ? static_cast<float>(total / static_cast<double>(N)) : 0.0f;
}

Tensor SoftmaxCrossEntropy::backward(Context& ctx, float grad_scale) {
  ZS_ASSERT(logits_.raw() != nullptr, "cross-entropy backward without a training-mode forward");
  const int64_t V = logits_.size(-1);
  const int64_t N = logits_.numel() / V;
  Tensor d = ctx.allocate(logits_.shape(), DType::kF32, MemoryUse::kGradient);
  const float s = N > 0 ? grad_scale / static_cast<float>(N) : 0.0f;
  const float* lp = logits_.data<float>();
  const int32_t* tp = targets_.data<int32_t>();
  float* dp = d.data<float>();
  const float* lsep = lse_.data<float>();
  detail::parallel_for(N, 8, [=](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = lp + r * V;
      float* dr = dp + r * V;
      const float l = lsep[r];
      for (int64_t j = 0; j < V; ++j) dr[j] = s * std::exp(row[j] - l);
      dr[tp[r]] -= s;
    }
  });
  clear();
  return d;
}

}  // namespace zs::nn
