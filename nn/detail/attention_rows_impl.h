// Internal: the body of the row kernels of attention_rows.h, written once over a vector type V and
// included by each per-ISA file (attention_rows.cpp, attention_rows_avx2.cpp, attention_rows_avx512.cpp).
// Every V is a type local to its file (anonymous namespace), so the template instances never meet
// across files compiled for different instruction sets.
//
// V provides: R (register), W (lanes), load/store (W lanes), load_n/store_n (the first n < W lanes,
// others read as 0), set1, add, sub, mul, max, exp (Cephes' expf as detail::fast_exp: clamped to
// [-87.3, 88], about 1 ulp), keep_below(x, k) (lanes >= k set to 0), hmax, hsum.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

namespace zs::nn::detail::rows {

template <typename V>
inline float row_max(const float* s, int64_t n) {
  typename V::R acc = V::set1(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + V::W <= n; j += V::W) acc = V::max(acc, V::load(s + j));
  float mx = V::hmax(acc);
  for (; j < n; ++j) mx = std::max(mx, s[j]);
  return mx;
}

template <typename V>
void online_softmax(float* s, int64_t ld, int64_t rows, int64_t cols, int64_t diag, float* m, float* l, float* o,
                    int64_t ldo, int64_t hd) {
  for (int64_t i = 0; i < rows; ++i) {
    float* row = s + i * ld;
    const int64_t n = std::clamp<int64_t>(i + diag, 0, cols);
    if (n == 0) {
      std::fill_n(row, cols, 0.0f);
      continue;
    }
    const float m_new = std::max(m[i], row_max<V>(row, n));
    const float alpha = m[i] == -std::numeric_limits<float>::infinity() ? 0.0f : V::exp_scalar(m[i] - m_new);
    const typename V::R shift = V::set1(m_new);
    typename V::R acc = V::set1(0.0f);
    int64_t j = 0;
    for (; j + V::W <= cols; j += V::W) {
      const typename V::R p = V::keep_below(V::exp(V::sub(V::load(row + j), shift)), n - j);
      V::store(row + j, p);
      acc = V::add(acc, p);
    }
    if (j < cols) {
      const typename V::R p = V::keep_below(V::exp(V::sub(V::load_n(row + j, cols - j), shift)), n - j);
      V::store_n(row + j, p, cols - j);
      acc = V::add(acc, p);
    }
    l[i] = l[i] * alpha + V::hsum(acc);
    m[i] = m_new;
    if (alpha != 1.0f) {
      float* orow = o + i * ldo;
      const typename V::R a = V::set1(alpha);
      int64_t d = 0;
      for (; d + V::W <= hd; d += V::W) V::store(orow + d, V::mul(V::load(orow + d), a));
      for (; d < hd; ++d) orow[d] *= alpha;
    }
  }
}

template <typename V>
void softmax_grad(float* s, float* dp, int64_t ld, int64_t rows, int64_t cols, int64_t diag, const float* lse,
                  const float* dsum) {
  for (int64_t i = 0; i < rows; ++i) {
    float* row = s + i * ld;
    float* drow = dp + i * ld;
    const int64_t n = std::clamp<int64_t>(i + diag, 0, cols);
    const typename V::R shift = V::set1(lse[i]), d = V::set1(dsum[i]);
    int64_t j = 0;
    for (; j + V::W <= cols; j += V::W) {
      const typename V::R p = V::keep_below(V::exp(V::sub(V::load(row + j), shift)), n - j);
      V::store(row + j, p);
      V::store(drow + j, V::mul(p, V::sub(V::load(drow + j), d)));
    }
    if (j < cols) {
      const int64_t k = cols - j;
      const typename V::R p = V::keep_below(V::exp(V::sub(V::load_n(row + j, k), shift)), n - j);
      V::store_n(row + j, p, k);
      V::store_n(drow + j, V::mul(p, V::sub(V::load_n(drow + j, k), d)), k);
    }
  }
}

}  // namespace zs::nn::detail::rows
