// Transformer pieces on (B, T, C) activations: the GPT-2 MLP and the pre-LN residual block.
//
//   Mlp:   y = proj(gelu(fc(x)))            fc = Linear(C, H), proj = Linear(H, C), H = 4C by default
//   Block: x1 = x + attn(ln1(x))            children in call order: ln1, attn, ln2, mlp
//          y  = x1 + mlp(ln2(x1))
// `proj_std` initialises the residual projections (attn.proj, mlp.proj); GPT-2 uses
// 0.02 / sqrt(2 * n_layer).
#pragma once

#include <cstdint>

#include "memory/tensor.h"
#include "nn/attention.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace zs::nn {

class Mlp : public Module {
 public:
  // hidden: H, 0 for GPT-2's 4 * d_model (an MoE expert may be narrower: moe/gpt_moe.h).
  Mlp(int64_t d_model, float init_std = 0.02f, float proj_std = 0.02f, int64_t hidden = 0);
  std::string_view type_name() const override { return "Mlp"; }

 protected:
  memory::Tensor forward(Context& ctx, const memory::Tensor& x) override;
  memory::Tensor backward(Context& ctx, const memory::Tensor& dy) override;

 private:
  Linear& fc_;
  Gelu& gelu_;
  Linear& proj_;
};

class Block : public Module {
 public:
  // hidden: the MLP's width (0: 4 * d_model); norm_eps: both LayerNorms'.
  Block(int64_t d_model, int64_t n_head, float init_std = 0.02f, float proj_std = 0.02f, int64_t hidden = 0,
        float norm_eps = 1e-5f);
  std::string_view type_name() const override { return "Block"; }
  CausalSelfAttention& attention() { return attn_; }
  // Progressive layer drop (nn/layer_drop.h): while set, the block passes its input through in forward
  // and backward. Set by the model before its forward; unchanged until the backward.
  void set_dropped(bool dropped) { dropped_ = dropped; }

 protected:
  memory::Tensor forward(Context& ctx, const memory::Tensor& x) override;
  memory::Tensor backward(Context& ctx, const memory::Tensor& dy) override;

 private:
  LayerNorm& ln1_;
  CausalSelfAttention& attn_;
  LayerNorm& ln2_;
  Mlp& mlp_;
  bool dropped_ = false;
};

}  // namespace zs::nn
