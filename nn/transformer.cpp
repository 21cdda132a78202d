#include "nn/transformer.h"

#include "core/errors.h"
#include "nn/detail/ops.h"

namespace zs::nn {

using memory::DType;
using memory::Tensor;

Mlp::Mlp(int64_t d_model, float init_std, float proj_std, int64_t hidden)
    : fc_(add_child<Linear>("fc", d_model, hidden > 0 ? hidden : 4 * d_model, true, init_std)),
      gelu_(add_child<Gelu>("gelu")),
      proj_(add_child<Linear>("proj", hidden > 0 ? hidden : 4 * d_model, d_model, true, proj_std)) {}

Tensor Mlp::forward(Context& ctx, const Tensor& x) {
  Tensor h = ctx.forward(fc_, x);
  h = ctx.forward(gelu_, h);
  return ctx.forward(proj_, h);
}

Tensor Mlp::backward(Context& ctx, const Tensor& dy) {
  Tensor dh = ctx.backward(proj_, dy);
  dh = ctx.backward(gelu_, dh);
  return ctx.backward(fc_, dh);
}

Block::Block(int64_t d_model, int64_t n_head, float init_std, float proj_std, int64_t hidden, float norm_eps)
    : ln1_(add_child<LayerNorm>("ln1", d_model, norm_eps)),
      attn_(add_child<CausalSelfAttention>("attn", d_model, n_head, init_std, proj_std)),
      ln2_(add_child<LayerNorm>("ln2", d_model, norm_eps)),
      mlp_(add_child<Mlp>("mlp", d_model, init_std, proj_std, hidden)) {}

Tensor Block::forward(Context& ctx, const Tensor& x) {
  Tensor a = ctx.forward(attn_, ctx.forward(ln1_, x));
  Tensor x1 = ctx.allocate(x.shape(), DType::kF32, MemoryUse::kActivation);
  detail::add(x.data<float>(), a.data<float>(), x1.data<float>(), x.numel());
  a = {};
  Tensor m = ctx.forward(mlp_, ctx.forward(ln2_, x1));
  Tensor y = ctx.allocate(x.shape(), DType::kF32, MemoryUse::kActivation);
  detail::add(x1.data<float>(), m.data<float>(), y.data<float>(), x.numel());
  return y;
}

Tensor Block::backward(Context& ctx, const Tensor& dy) {
  // The residual passes dy straight through; each branch adds its own input gradient. The branch
  // gradients are fresh kGradient tensors owned here, so the sums are written into them in place.
  Tensor dx1 = ctx.backward(ln2_, ctx.backward(mlp_, dy));
  detail::add(dy.data<float>(), dx1.data<float>(), dx1.data<float>(), dy.numel());
  Tensor dx = ctx.backward(ln1_, ctx.backward(attn_, dx1));
  detail::add(dx1.data<float>(), dx.data<float>(), dx.data<float>(), dy.numel());
  return dx;
}

}  // namespace zs::nn
