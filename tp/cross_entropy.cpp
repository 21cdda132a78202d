#include "tp/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/errors.h"
#include "nn/detail/ops.h"
#include "nn/detail/parallel.h"

namespace zs::tp {

using memory::DType;
using memory::Tensor;
using nn::MemoryUse;

int64_t VocabParallelCrossEntropy::real_columns(int64_t Vl) const {
  if (vocab_ == 0) return Vl;
  return std::clamp<int64_t>(vocab_ - Vl * tp_.rank(), 0, Vl);
}

float VocabParallelCrossEntropy::forward(nn::Context& ctx, const Tensor& logits, const Tensor& targets) {
  ZS_MODEL_CHECK(logits.raw() != nullptr && logits.dtype() == DType::kF32 && logits.is_contiguous() &&
                     logits.dim() >= 1,
                 "vocab-parallel cross-entropy: expected contiguous fp32 logits");
  const int64_t Vl = logits.size(-1), N = logits.numel() / Vl, P = tp_.size();
  const int64_t first = Vl * tp_.rank(), V = vocab_ != 0 ? vocab_ : Vl * P, Vr = real_columns(Vl);
  ZS_MODEL_CHECK(V <= Vl * P, "vocab-parallel cross-entropy: a vocabulary of {} in {} columns per rank over {} ranks",
                 V, Vl, P);
  ZS_MODEL_CHECK(targets.raw() != nullptr && targets.dtype() == DType::kI32 && targets.numel() == N,
                 "vocab-parallel cross-entropy: {} int32 targets needed for logits {}, got a {} tensor {}", N,
                 memory::shape_string(logits.shape()), memory::dtype_name(targets.dtype()),
                 memory::shape_string(targets.shape()));
  const int32_t* tp = targets.data<int32_t>();
  nn::detail::check_ids(tp, N, V, "target");
  const bool train = ctx.training();
  // Per row: local max, local sum of exp(logit - local max), target logit if this rank owns it.
  Tensor local = ctx.allocate({N, 3}, DType::kF32, MemoryUse::kScratch);
  const float* lp = logits.data<float>();
  float* sp = local.data<float>();
  nn::detail::parallel_for(N, 8, [=](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = lp + r * Vl;
      // Padded columns (from Vr on) are out of the softmax (Note [padded vocabulary]).
      const float mx = Vr > 0 ? nn::detail::max_of(row, Vr) : -std::numeric_limits<float>::infinity();
      float sum = 0.0f;
      for (int64_t j = 0; j < Vr; ++j) sum += std::exp(row[j] - mx);
      const int64_t t = static_cast<int64_t>(tp[r]) - first;
      sp[3 * r] = mx;
      sp[3 * r + 1] = sum;
      sp[3 * r + 2] = t >= 0 && t < Vl ? row[t] : 0.0f;
    }
  });
  Tensor all = local;  // (P, N, 3): every rank's, in rank order (Note [one gather for the loss])
  if (P > 1) {
    all = ctx.allocate({P, N, 3}, DType::kF32, MemoryUse::kScratch);
    tp_.group->allgather(local, all);
  }
  Tensor lse = ctx.allocate({N}, DType::kF32, train ? MemoryUse::kActivation : MemoryUse::kScratch);
  Tensor row_loss = ctx.allocate({N}, DType::kF32, MemoryUse::kScratch);
  const float* ap = all.data<float>();
  float* lsep = lse.data<float>();
  float* rl = row_loss.data<float>();
  nn::detail::parallel_for(N, 64, [=](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t p = 0; p < P; ++p) m = std::max(m, ap[(p * N + r) * 3]);
      float sum = 0.0f, target = 0.0f;
      for (int64_t p = 0; p < P; ++p) {
        const float* s = ap + (p * N + r) * 3;
        sum += s[1] * std::exp(s[0] - m);
        target += s[2];
      }
      const float l = m + std::log(sum);
      lsep[r] = l;
      rl[r] = l - target;
    }
  });
  double total = 0.0;  // in double, serially, as nn::SoftmaxCrossEntropy
  if (nn::detail::kernels_enabled()) {
    for (int64_t r = 0; r < N; ++r) total += static_cast<double>(rl[r]);
  }
  if (train) {
    logits_ = logits;
    targets_ = targets;
    lse_ = lse;
  }
  return N > 0 ? static_cast<float>(total / static_cast<double>(N)) : 0.0f;
}

Tensor VocabParallelCrossEntropy::backward(nn::Context& ctx, float grad_scale) {
  ZS_ASSERT(logits_.raw() != nullptr, "vocab-parallel cross-entropy backward without a training-mode forward");
  const int64_t Vl = logits_.size(-1), N = logits_.numel() / Vl, first = Vl * tp_.rank(), Vr = real_columns(Vl);
  Tensor d = ctx.allocate(logits_.shape(), DType::kF32, MemoryUse::kGradient);
  const float s = N > 0 ? grad_scale / static_cast<float>(N) : 0.0f;
  const float* lp = logits_.data<float>();
  const int32_t* tp = targets_.data<int32_t>();
  float* dp = d.data<float>();
  const float* lsep = lse_.data<float>();
  nn::detail::parallel_for(N, 8, [=](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = lp + r * Vl;
      float* dr = dp + r * Vl;
      const float l = lsep[r];
      for (int64_t j = 0; j < Vr; ++j) dr[j] = s * std::exp(row[j] - l);
      for (int64_t j = Vr; j < Vl; ++j) dr[j] = 0.0f;  // padding
      const int64_t t = static_cast<int64_t>(tp[r]) - first;
      if (t >= 0 && t < Vl) dr[t] -= s;
    }
  });
  clear();
  return d;
}

}  // namespace zs::tp
