// How layers read parameters and write their gradients, whatever the storage dtype.
//
// Layers compute in fp32. A parameter stored as bf16/fp16 is converted at the edge:
//   Tensor w = weight_f32(ctx, *weight_);      // fp32 (out, in): the data itself, or a scratch copy
//   GradAccumulator gw(ctx, *weight_);         // fp32 buffer that accumulates into weight_->grad()
//   cblas_sgemm(..., /*beta=*/1.0f, gw.data(), ...);   // gw += dy^T x
//   gw.commit();                               // no-op for fp32 grads; converts back for bf16/fp16
#pragma once

#include <span>

#include "memory/tensor.h"
#include "nn/context.h"
#include "nn/parameter.h"

namespace zs::nn {

// Both below throw ModelError when p's owner is not the module running through ctx (ctx.running()):
// a forward/backward called directly instead of through the Context, or a parameter used by another
// module (weight sharing: see nn/module.h). Parameters without an owner are not checked.
//
// p.data() as stored (fp32, bf16 or fp16), for kernels that read bf16 themselves (nn/detail/gemm.h).
// Same checks and errors as weight_f32.
const memory::Tensor& weight_stored(Context& ctx, const Parameter& p);

// An fp32, contiguous Tensor with p's shape holding p's values. For an fp32 parameter this is
// p.data() itself (no copy); otherwise a kScratch tensor from ctx. Throws UsageError when p.data()
// is undefined (a model run without the engine and without nn::materialize).
memory::Tensor weight_f32(Context& ctx, const Parameter& p);

// Accumulation target for dL/dp. data() points at p.numel() fp32 values that equal the current
// gradient; layers ADD their contribution (e.g. sgemm with beta = 1). commit() publishes the sum:
// for an fp32 grad the layer wrote in place and commit does nothing; for bf16/fp16 the fp32 scratch
// is rounded back into p.grad(). The destructor commits if commit() was not called, unless an
// exception is unwinding (then a bf16/fp16 gradient is left as it was before this accumulator; an
// fp32 one, accumulated in place, may hold part of the failed contribution).
class GradAccumulator {
 public:
  GradAccumulator(Context& ctx, Parameter& p);
  GradAccumulator(const GradAccumulator&) = delete;
  GradAccumulator& operator=(const GradAccumulator&) = delete;
  ~GradAccumulator();

  float* data() const { return buffer_.data(); }
  std::span<float> span() const { return buffer_; }
  void commit();

 private:
  Parameter& param_;
  memory::Tensor scratch_;  // undefined when accumulating in place
  std::span<float> buffer_;
  int uncaught_at_start_;
  bool committed_ = false;
};

}  // namespace zs::nn
