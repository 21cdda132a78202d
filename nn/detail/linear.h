// Internal: the products of nn::Linear, for every layer that holds a linear map's parameters itself
// (nn::Linear, and tp/'s column- and row-parallel linears, which add collectives around them): one
// implementation of y = x W^T + b and its backward, on the GEMM path the weight's dtype selects
// (Note [bf16 products] in nn/detail/gemm.h).
#pragma once

#include <cstdint>

#include "memory/tensor.h"
#include "nn/context.h"
#include "nn/parameter.h"

namespace zs::nn::detail {

// y = x W^T (+ bias broadcast over the rows when bias != nullptr): x (..., in) with n rows, W (out, in);
// y is a fresh kActivation tensor (..., out). `weight_dtype` receives W's storage dtype (the products'
// precision, nn::Linear::weight_dtype).
memory::Tensor linear_forward(Context& ctx, const memory::Tensor& x, int64_t n, const Parameter& weight,
                              const Parameter* bias, memory::DType* weight_dtype = nullptr);

// The backward of linear_forward for dy (n rows of out) and the forward's input x (n rows of in):
// returns dx = dy W, a fresh kGradient tensor shaped as x; accumulates weight.grad += dy^T x and, when
// bias != nullptr, bias.grad += the column sums of dy.
memory::Tensor linear_backward(Context& ctx, const memory::Tensor& dy, int64_t n, const memory::Tensor& x,
                               Parameter& weight, Parameter* bias);
// Its two halves (the same products as linear_backward, which keeps one weight view for both): dx = dy W; and weight.grad += dy^T x
// with the bias's column sums (a zero-bubble pipeline runs the second later: Note [deferred weight
// gradients] in nn/context.h).
memory::Tensor linear_backward_input(Context& ctx, const memory::Tensor& dy, int64_t n, const memory::Tensor& x,
                                     const Parameter& weight);
void linear_backward_weight(Context& ctx, const memory::Tensor& dy, int64_t n, const memory::Tensor& x,
                            Parameter& weight, Parameter* bias);
// linear_backward, or, while ctx has a weight-gradient sink (Note [deferred weight gradients] in
// nn/context.h), linear_backward_input now and linear_backward_weight appended to the sink as part of
// `owner` (the module that declared weight and bias), keeping x and dy until it runs. `dy_reused`:
// the caller may write into dy afterwards, so the sink keeps a copy (nn::Linear's case); a caller that
// drops dy (the tied output head's logits gradient) passes false and the sink keeps dy itself.
memory::Tensor linear_backward_deferrable(Context& ctx, const Module& owner, const memory::Tensor& dy, bool dy_reused,
                                          int64_t n, const memory::Tensor& x, Parameter& weight, Parameter* bias);

}  // namespace zs::nn::detail
