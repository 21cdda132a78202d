#include "nn/transformer.h"

#include "core/errors.h"
#include "nn/detail/ops.h"
#include "nn/detail/pre_norm_block.h"

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
  if (dropped_) return detail::dropped_block_forward(ctx, x, ln1_, attn_, ln2_, mlp_);
  return detail::pre_norm_block_forward(ctx, x, ln1_, attn_, ln2_, mlp_);
}

Tensor Block::backward(Context& ctx, const Tensor& dy) {
  if (dropped_) return detail::dropped_block_backward(ctx, dy, ln1_, attn_, ln2_, mlp_);
  return detail::pre_norm_block_backward(ctx, dy, ln1_, attn_, ln2_, mlp_);
}

}  // namespace zs::nn
