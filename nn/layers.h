// Basic layers on row-major fp32 activations: Linear, Embedding, LayerNorm, Gelu.
//
// Activations are (..., features): any leading dimensions (usually (B, T)) are flattened into rows.
// Parameters may be stored as fp32, bf16 or fp16 (converted to fp32 scratch at the edge); gradients
// accumulate into Parameter::grad in its dtype. Every matmul is one nn::detail::gemm: OpenBLAS sgemm,
// or with a bf16 weight on an AVX512-BF16 CPU that runs it faster the bf16 kernel (Note [bf16 products],
// nn/detail/gemm.h).
//
//   Linear fc(768, 3072);                   // weight (3072, 768), bias (3072)
//   Tensor y = ctx.forward(fc, x);          // x (B, T, 768) -> y (B, T, 3072)
#pragma once

#include <cstdint>
#include <string>

#include "memory/tensor.h"
#include "nn/module.h"

namespace zs::nn {

// How products with a bf16 weight run in this process, for logs: "avx512bf16 (...)" or "sgemm (...)",
// with the reason (Note [bf16 product rate] in nn/detail/gemm.h). The first call makes the choice.
std::string bf16_products_description();

// y = x W^T + b. weight (out, in) like PyTorch, init normal(0, init_std); bias (out), zeros, tagged
// no_weight_decay. Saves its input for backward.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, float init_std = 0.02f);
  std::string_view type_name() const override { return "Linear"; }

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  Parameter& weight() { return weight_; }
  Parameter* bias() { return bias_; }  // nullptr without bias
  // The weight's storage dtype in the last forward (kF32 before any): the model's compute precision,
  // from which a parent picks the products of its own (nn/attention.cpp). Unlike weight().data(), it
  // stays valid while the engine holds the weight partitioned (ZeRO-3).
  memory::DType weight_dtype() const { return weight_dtype_; }

 protected:
  memory::Tensor forward(Context& ctx, const memory::Tensor& x) override;       // (..., in) -> (..., out)
  memory::Tensor backward(Context& ctx, const memory::Tensor& dy) override;     // (..., out) -> (..., in)
  void clear_own_saved() override { input_ = {}; }

 private:
  int64_t in_;
  int64_t out_;
  Parameter& weight_;
  Parameter* bias_ = nullptr;
  memory::Tensor input_;
  memory::DType weight_dtype_ = memory::DType::kF32;
};

// Row lookup: ids (any shape, DType::kI32, each in [0, num)) -> (..., dim). weight (num, dim), init
// normal(0, init_std). backward accumulates rows of the weight grad and returns an undefined Tensor.
// An id out of range throws ConfigError.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, float init_std = 0.02f);
  std::string_view type_name() const override { return "Embedding"; }
  Parameter& weight() { return weight_; }

 protected:
  memory::Tensor forward(Context& ctx, const memory::Tensor& ids) override;
  memory::Tensor backward(Context& ctx, const memory::Tensor& dy) override;
  void clear_own_saved() override { ids_ = {}; }

 private:
  int64_t num_;
  int64_t dim_;
  Parameter& weight_;
  memory::Tensor ids_;
};

// Normalises over the last dimension: y = (x - mean) / sqrt(var + eps) * weight + bias, with the
// biased variance. weight ones, bias zeros, both tagged no_weight_decay. Saves input, mean, rstd.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, float eps = 1e-5f);
  std::string_view type_name() const override { return "LayerNorm"; }
  Parameter& weight() { return weight_; }
  Parameter& bias() { return bias_; }

 protected:
  memory::Tensor forward(Context& ctx, const memory::Tensor& x) override;
  memory::Tensor backward(Context& ctx, const memory::Tensor& dy) override;
  void clear_own_saved() override { input_ = mean_ = rstd_ = {}; }

 private:
  int64_t dim_;
  float eps_;
  Parameter& weight_;
  Parameter& bias_;
  memory::Tensor input_;
  memory::Tensor mean_;  // (rows)
  memory::Tensor rstd_;  // (rows)
};

// GELU, tanh approximation (GPT-2): y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// Elementwise on any shape. Saves its input.
class Gelu : public Module {
 public:
  std::string_view type_name() const override { return "Gelu"; }

 protected:
  memory::Tensor forward(Context& ctx, const memory::Tensor& x) override;
  memory::Tensor backward(Context& ctx, const memory::Tensor& dy) override;
  void clear_own_saved() override { input_ = {}; }

 private:
  memory::Tensor input_;
};

}  // namespace zs::nn
