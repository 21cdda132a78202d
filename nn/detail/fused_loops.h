// Internal: the one implementation of nn/detail/fused_ops.h's kernels, written over a vector type V
// and included by one file per ISA (fused_ops.cpp: scalar; fused_ops_avx2.cpp; fused_ops_avx512.cpp).
// V provides R (the register type), kWidth, load/store/set1, add/sub/mul/div/min/max, hsum and
// pow2_shifted (Note [vector exp]). Tails shorter than kWidth run the same code on ScalarVec.
//
// Everything here has internal linkage (an anonymous namespace): each ISA file gets its own copy, so
// the linker can never pick an AVX-512 instantiation for the AVX2 or scalar path (see
// memory/simd_bf16.h on the same hazard).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace zs::nn::detail {
namespace {

struct ScalarVec {
  using R = float;
  static constexpr int64_t kWidth = 1;
  static R load(const float* p) { return *p; }
  static void store(float* p, R v) { *p = v; }
  static R set1(float f) { return f; }
  static R add(R a, R b) { return a + b; }
  static R sub(R a, R b) { return a - b; }
  static R mul(R a, R b) { return a * b; }
  static R div(R a, R b) { return a / b; }
  static R min(R a, R b) { return a < b ? a : b; }
  static R max(R a, R b) { return a > b ? a : b; }
  static float hsum(R a) { return a; }
  static R pow2_shifted(R t) { return std::bit_cast<float>((std::bit_cast<uint32_t>(t) - 0x4B400000u + 127u) << 23); }
};

// Note [vector exp]: nn::detail::fast_exp (Cephes' expf, nn/detail/ops.h) on any V: the same clamps,
// rounding trick and polynomial, so every ISA computes the same function to within FMA contraction.
// pow2_shifted(t) builds 2^n from t = n + 1.5 * 2^23 (n's bits sit in t's low mantissa).
template <class V>
typename V::R vexp(typename V::R x) {
  x = V::max(x, V::set1(-87.33654f));
  x = V::min(x, V::set1(88.0f));
  const auto shift = V::set1(12582912.0f);
  const auto t = V::add(V::mul(x, V::set1(1.44269504088896341f)), shift);
  const auto n = V::sub(t, shift);
  auto r = V::sub(x, V::mul(n, V::set1(0.693359375f)));
  r = V::sub(r, V::mul(n, V::set1(-2.12194440e-4f)));
  auto p = V::set1(1.9875691500e-4f);
  p = V::add(V::mul(p, r), V::set1(1.3981999507e-3f));
  p = V::add(V::mul(p, r), V::set1(8.3334519073e-3f));
  p = V::add(V::mul(p, r), V::set1(4.1665795894e-2f));
  p = V::add(V::mul(p, r), V::set1(1.6666665459e-1f));
  p = V::add(V::mul(p, r), V::set1(5.0000001201e-1f));
  const auto e = V::add(V::add(V::mul(p, V::mul(r, r)), r), V::set1(1.0f));
  return V::mul(e, V::pow2_shifted(t));
}

template <class V>
typename V::R sigmoid(typename V::R g) {
  const auto one = V::set1(1.0f);
  return V::div(one, V::add(one, vexp<V>(V::sub(V::set1(0.0f), g))));
}

// Runs body.template operator()<V>(i) for vector steps, then ScalarVec for the tail of [i0, i1).
template <class V, class Body>
void for_lanes(int64_t i0, int64_t i1, Body&& body) {
  int64_t i = i0;
  for (; i + V::kWidth <= i1; i += V::kWidth) body.template operator()<V>(i);
  for (; i < i1; ++i) body.template operator()<ScalarVec>(i);
}

template <class V>
void rms_norm_forward_rows(const float* x, const float* w, int64_t r0, int64_t r1, int64_t d, float eps, float* y,
                           float* rstd) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * d;
    float* yr = y + r * d;
    auto acc = V::set1(0.0f);
    float tail = 0.0f;
    for_lanes<V>(0, d, [&]<class W>(int64_t j) {
      const auto v = W::load(xr + j);
      if constexpr (W::kWidth == V::kWidth && V::kWidth > 1) {
        acc = V::add(acc, V::mul(v, v));
      } else {
        tail += W::hsum(W::mul(v, v));
      }
    });
    const float ss = V::hsum(acc) + tail;
    const float rs = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
    for_lanes<V>(0, d, [&]<class W>(int64_t j) {
      W::store(yr + j, W::mul(W::load(w + j), W::mul(W::load(xr + j), W::set1(rs))));
    });
    rstd[r] = rs;
  }
}

template <class V>
void rms_norm_backward_rows(const float* dy, const float* x, const float* w, const float* rstd, int64_t r0, int64_t r1,
                            int64_t d, float* dx) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * d;
    const float* dr = dy + r * d;
    float* dxr = dx + r * d;
    const float rs = rstd[r];
    // sum_j g_j x_j (times rstd once, below): mean(g * xhat) = rs * sum(g x) / d.
    auto acc = V::set1(0.0f);
    float tail = 0.0f;
    for_lanes<V>(0, d, [&]<class W>(int64_t j) {
      const auto gx = W::mul(W::mul(W::load(dr + j), W::load(w + j)), W::load(xr + j));
      if constexpr (W::kWidth == V::kWidth && V::kWidth > 1) {
        acc = V::add(acc, gx);
      } else {
        tail += W::hsum(gx);
      }
    });
    const float dot = (V::hsum(acc) + tail) * rs / static_cast<float>(d);
    // dx = rs * (g - xhat * dot) = rs * g - x * (rs * rs * dot)
    const float k = rs * rs * dot;
    for_lanes<V>(0, d, [&]<class W>(int64_t j) {
      const auto g = W::mul(W::load(dr + j), W::load(w + j));
      W::store(dxr + j, W::sub(W::mul(W::set1(rs), g), W::mul(W::load(xr + j), W::set1(k))));
    });
  }
}

template <class V>
void rms_norm_weight_grad_cols(const float* dy, const float* x, const float* rstd, int64_t rows, int64_t d, int64_t c0,
                               int64_t c1, float* dw) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    const float* dr = dy + r * d;
    const float rs = rstd[r];
    for_lanes<V>(c0, c1, [&]<class W>(int64_t j) {
      const auto xhat = W::mul(W::load(xr + j), W::set1(rs));
      W::store(dw + j, W::add(W::load(dw + j), W::mul(W::load(dr + j), xhat)));
    });
  }
}

template <class V>
void swiglu_forward_range(const float* g, const float* u, int64_t i0, int64_t i1, float* h) {
  for_lanes<V>(i0, i1, [&]<class W>(int64_t i) {
    const auto gv = W::load(g + i);
    W::store(h + i, W::mul(W::mul(gv, sigmoid<W>(gv)), W::load(u + i)));
  });
}

template <class V>
void swiglu_backward_range(const float* dh, const float* g, const float* u, int64_t i0, int64_t i1, float* dg,
                           float* du) {
  for_lanes<V>(i0, i1, [&]<class W>(int64_t i) {
    const auto gv = W::load(g + i);
    const auto d = W::load(dh + i);
    const auto s = sigmoid<W>(gv);
    const auto one = W::set1(1.0f);
    // d silu / dg = s + g s (1 - s) = s (1 + g (1 - s))
    const auto dsilu = W::mul(s, W::add(one, W::mul(gv, W::sub(one, s))));
    W::store(du + i, W::mul(d, W::mul(gv, s)));
    W::store(dg + i, W::mul(W::mul(d, W::load(u + i)), dsilu));
  });
}

template <class V>
void rope_rows(float* x, int64_t r0, int64_t r1, int64_t row_stride, int64_t seq, int64_t n_head, int64_t hs,
               const float* cos, const float* sin, bool inverse) {
  const int64_t half = hs / 2;
  const float sign = inverse ? -1.0f : 1.0f;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t pos = r % seq;
    const float* c = cos + pos * half;
    const float* s = sin + pos * half;
    for (int64_t h = 0; h < n_head; ++h) {
      float* a = x + r * row_stride + h * hs;
      float* b = a + half;
      for_lanes<V>(0, half, [&]<class W>(int64_t j) {
        const auto av = W::load(a + j), bv = W::load(b + j);
        const auto cv = W::load(c + j), sv = W::mul(W::load(s + j), W::set1(sign));
        W::store(a + j, W::sub(W::mul(av, cv), W::mul(bv, sv)));
        W::store(b + j, W::add(W::mul(bv, cv), W::mul(av, sv)));
      });
    }
  }
}

}  // namespace
}  // namespace zs::nn::detail

// Defines the per-ISA entry points fused_ops.cpp dispatches to: rms_norm_forward_<isa> and so on.
#define ZS_NN_FUSED_ENTRY_POINTS(isa, V)                                                                            \
  void rms_norm_forward_##isa(const float* x, const float* w, int64_t r0, int64_t r1, int64_t d, float eps, float* y, \
                              float* rstd) {                                                                        \
    rms_norm_forward_rows<V>(x, w, r0, r1, d, eps, y, rstd);                                                        \
  }                                                                                                                 \
  void rms_norm_backward_##isa(const float* dy, const float* x, const float* w, const float* rstd, int64_t r0,     \
                               int64_t r1, int64_t d, float* dx) {                                                  \
    rms_norm_backward_rows<V>(dy, x, w, rstd, r0, r1, d, dx);                                                       \
  }                                                                                                                 \
  void rms_norm_weight_grad_##isa(const float* dy, const float* x, const float* rstd, int64_t rows, int64_t d,      \
                                  int64_t c0, int64_t c1, float* dw) {                                              \
    rms_norm_weight_grad_cols<V>(dy, x, rstd, rows, d, c0, c1, dw);                                                 \
  }                                                                                                                 \
  void swiglu_forward_##isa(const float* g, const float* u, int64_t i0, int64_t i1, float* h) {                    \
    swiglu_forward_range<V>(g, u, i0, i1, h);                                                                       \
  }                                                                                                                 \
  void swiglu_backward_##isa(const float* dh, const float* g, const float* u, int64_t i0, int64_t i1, float* dg,   \
                             float* du) {                                                                           \
    swiglu_backward_range<V>(dh, g, u, i0, i1, dg, du);                                                             \
  }                                                                                                                 \
  void rope_apply_##isa(float* x, int64_t r0, int64_t r1, int64_t row_stride, int64_t seq, int64_t n_head,         \
                        int64_t hs, const float* cos, const float* sin, bool inverse) {                             \
    rope_rows<V>(x, r0, r1, row_stride, seq, n_head, hs, cos, sin, inverse);                                        \
  }
