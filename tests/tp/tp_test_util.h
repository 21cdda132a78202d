// Helpers of the tensor-parallel tests: tensor-parallel groups of the test world, slices of tp = 1
// tensors (taken through nn::Parameter's own slice arithmetic, Note [tensor slices]), and comparisons.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "memory/tensor.h"
#include "nn/module.h"
#include "nn/parameter.h"
#include "tests/support/mpi_test_env.h"

namespace zs::tp::test {

using memory::DType;
using memory::Shape;
using memory::Tensor;

// The tensor-parallel sizes this world runs: 1, 2, 4 where they divide it.
inline std::vector<int> tp_sizes() {
  std::vector<int> out;
  for (int t : {1, 2, 4}) {
    if (zs::test::world().size() % t == 0) out.push_back(t);
  }
  return out;
}

// Groups of `t` consecutive world ranks (Megatron's tensor-parallel groups), named "tp".
inline comm::Group tp_group(int t) {
  const int rank = zs::test::world().rank();
  return zs::test::world().group().split(rank / t, rank, "tp");
}

// Piece `index` of `parts` of `full` along `dim` (with `stride` blocks): what a TP rank holds.
inline Tensor take_slice(const Tensor& full, int dim, int parts, int index, int stride = 1) {
  Shape local = full.shape();
  local[dim] /= parts;
  nn::Parameter p("slice", local, nn::Init::zeros());
  p.set_tensor_slice({.dim = dim, .parts = parts, .index = index, .stride = stride});
  Tensor f = Tensor::empty(full.shape(), DType::kF32);
  f.copy_from(full);
  Tensor out = Tensor::empty(local, DType::kF32);
  p.for_each_full_run(0, static_cast<uint64_t>(p.numel()), [&](uint64_t l, uint64_t g, uint64_t n) {
    std::copy_n(f.data<float>() + g, n, out.data<float>() + l);
  });
  return out;
}

// The local piece of a tp = 1 tensor that parameter `p` (a TP slice or whole) holds.
inline Tensor slice_for(const nn::Parameter& p, const Tensor& full) {
  const nn::TensorSlice& s = p.tensor_slice();
  if (s.whole()) return full;
  if (s.full_extent == 0) return take_slice(full, s.dim, s.parts, s.index, s.stride);
  // A padded slice (Note [tensor slices]): the full tensor's runs, zeros in the padding.
  Tensor out = Tensor::empty(p.shape(), DType::kF32);
  std::fill_n(out.data<float>(), out.numel(), 0.0f);
  p.for_each_full_run(0, static_cast<uint64_t>(p.numel()), [&](uint64_t l, uint64_t g, uint64_t n) {
    std::copy_n(full.data<float>() + g, n, out.data<float>() + l);
  });
  return out;
}

// Sets every parameter to values keyed by its full name and FULL element index (so a TP model gets
// the slices of the tp = 1 model's values): bias and norm parameters are not left at 0 or 1.
inline void randomize(nn::Module& m, uint64_t seed, float scale = 0.3f) {
  m.visit_params([&](nn::Parameter& p) {
    CounterRng rng(seed, p.full_name());
    Tensor v = Tensor::empty(p.shape(), DType::kF32);
    std::fill_n(v.data<float>(), v.numel(), 0.0f);  // a padded slice's padding stays zero
    p.for_each_full_run(0, static_cast<uint64_t>(p.numel()), [&](uint64_t l, uint64_t g, uint64_t n) {
      const float offset = p.has_tag(nn::kTagNoWeightDecay) ? 0.5f : 0.0f;  // norm weights near 1, biases not 0
      for (uint64_t i = 0; i < n; ++i) v.data<float>()[l + i] = scale * rng.normal(g + i) + offset;
    });
    p.data().copy_from(v);
  });
}

inline std::vector<float> values(const Tensor& t) {
  Tensor f = Tensor::empty(t.shape(), DType::kF32);
  f.copy_from(t);
  return {f.f32().begin(), f.f32().end()};
}

inline std::vector<float> values_of_grad(const nn::Parameter& p) { return values(p.grad()); }

// |a - b| <= tol * max(1, |b|) elementwise.
inline void expect_close(const Tensor& got, const Tensor& want, const std::string& what, double tol = 1e-5) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  const std::vector<float> a = values(got), b = values(want);
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_NEAR(a[i], b[i], tol * std::max(1.0, std::abs(static_cast<double>(b[i])))) << what << "[" << i << "]";
  }
}

// Every parameter's gradient of `tp_model` against its slice of the same-named parameter's of `ref`.
inline void expect_grads_are_slices(nn::Module& tp_model, nn::Module& ref, double tol = 1e-5) {
  int64_t checked = 0;
  tp_model.visit_params([&](nn::Parameter& p) {
    nn::Parameter* r = ref.find_param(p.full_name());
    ASSERT_NE(r, nullptr) << p.full_name() << " is not a parameter of the tp = 1 model";
    ASSERT_EQ(p.full_shape(), r->shape()) << p.full_name();
    expect_close(p.grad(), slice_for(p, r->grad()), "grad of " + p.full_name(), tol);
    ++checked;
  });
  EXPECT_EQ(checked, static_cast<int64_t>(ref.all_params().size()));
}

}  // namespace zs::tp::test
