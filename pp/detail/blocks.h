// Internal: a GPT stage's blocks [first, end) under their global names ("blocks.3"), run in order; for
// pp::GptStage (nn::Block) and pp::TpGptStage (tp::ParallelBlock).
#pragma once

#include <string>
#include <utility>

#include "nn/module.h"

namespace zs::pp::detail {

class BlockRange : public nn::Module {
 public:
  // make(i) appends block i: add<Block>(i, args...).
  template <typename Block, typename... Args>
  Block& add(int64_t index, Args&&... args) {
    return add_child<Block>(std::to_string(index), std::forward<Args>(args)...);
  }
  std::string_view type_name() const override { return "Sequential"; }

 protected:
  memory::Tensor forward(nn::Context& ctx, const memory::Tensor& x) override {
    memory::Tensor h = x;
    for (Module* b : children()) h = ctx.forward(*b, h);
    return h;
  }
  memory::Tensor backward(nn::Context& ctx, const memory::Tensor& dy) override {
    memory::Tensor d = dy;
    auto c = children();
    for (auto it = c.rbegin(); it != c.rend(); ++it) d = ctx.backward(**it, d);
    return d;
  }
};

}  // namespace zs::pp::detail
