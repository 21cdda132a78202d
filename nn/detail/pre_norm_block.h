// The pre-norm residual block's two passes, shared by nn::Block (GPT-2), nn::LlamaBlock and their tensor-
// parallel forms (tp::ParallelBlock, tp::ParallelLlamaBlock):
//   x1 = x + attn(ln1(x)),  y = x1 + mlp(ln2(x1))
// with whatever norm, attention and MLP modules the block has. One definition, so both models sum their
// residuals in the same order.
#pragma once

#include "memory/tensor.h"
#include "nn/context.h"
#include "nn/detail/ops.h"
#include "nn/module.h"

namespace zs::nn::detail {

inline memory::Tensor pre_norm_block_forward(Context& ctx, const memory::Tensor& x, Module& ln1, Module& attn,
                                             Module& ln2, Module& mlp) {
  memory::Tensor a = ctx.forward(attn, ctx.forward(ln1, x));
  memory::Tensor x1 = ctx.allocate(x.shape(), memory::DType::kF32, MemoryUse::kActivation);
  add(x.data<float>(), a.data<float>(), x1.data<float>(), x.numel());
  a = {};
  memory::Tensor m = ctx.forward(mlp, ctx.forward(ln2, x1));
  memory::Tensor y = ctx.allocate(x.shape(), memory::DType::kF32, MemoryUse::kActivation);
  add(x1.data<float>(), m.data<float>(), y.data<float>(), x.numel());
  return y;
}

// The residual passes dy straight through; each branch adds its own input gradient. The branch
// gradients are fresh kGradient tensors owned here, so the sums are written into them in place.
inline memory::Tensor pre_norm_block_backward(Context& ctx, const memory::Tensor& dy, Module& ln1, Module& attn,
                                              Module& ln2, Module& mlp) {
  memory::Tensor dx1 = ctx.backward(ln2, ctx.backward(mlp, dy));
  add(dy.data<float>(), dx1.data<float>(), dx1.data<float>(), dy.numel());
  memory::Tensor dx = ctx.backward(ln1, ctx.backward(attn, dx1));
  add(dx1.data<float>(), dx.data<float>(), dx.data<float>(), dy.numel());
  return dx;
}

// A block that progressive layer drop (nn/layer_drop.h) skips in this pass: its output is its input,
// its input gradient the output's; its children's hooks still run (Context::skip_forward).
inline memory::Tensor dropped_block_forward(Context& ctx, const memory::Tensor& x, Module& ln1, Module& attn,
                                            Module& ln2, Module& mlp) {
  for (Module* m : {&ln1, &attn, &ln2, &mlp}) ctx.skip_forward(*m);
  return x;
}
inline memory::Tensor dropped_block_backward(Context& ctx, const memory::Tensor& dy, Module& ln1, Module& attn,
                                             Module& ln2, Module& mlp) {
  for (Module* m : {&mlp, &ln2, &attn, &ln1}) ctx.skip_backward(*m);
  return dy;
}

}  // namespace zs::nn::detail
