// The scalar row kernels of attention_rows.h (any x86-64) and the choice between the three.
#include "nn/detail/attention_rows.h"

#include <algorithm>

#include "core/errors.h"
#include "nn/detail/attention_rows_impl.h"
#include "nn/detail/ops.h"

namespace zs::nn::detail {
namespace {

struct V1 {
  using R = float;
  static constexpr int64_t W = 1;
  static R load(const float* p) { return *p; }
  static R load_n(const float*, int64_t) { return 0.0f; }  // never called: W = 1 has no partial vector
  static void store(float* p, R x) { *p = x; }
  static void store_n(float*, R, int64_t) {}
  static R set1(float x) { return x; }
  static R add(R a, R b) { return a + b; }
  static R sub(R a, R b) { return a - b; }
  static R mul(R a, R b) { return a * b; }
  static R max(R a, R b) { return std::max(a, b); }
  static R keep_below(R x, int64_t k) { return k > 0 ? x : 0.0f; }
  static float hmax(R x) { return x; }
  static float hsum(R x) { return x; }
  static float exp_scalar(float x) { return fast_exp(x); }
  static R exp(R x) { return fast_exp(x); }
};

}  // namespace

AttentionRowKernels attention_row_kernels_scalar() {
  return {&rows::online_softmax<V1>, &rows::softmax_grad<V1>};
}

const AttentionRowKernels& attention_row_kernels(memory::IsaLevel isa) {
  ZS_ASSERT(memory::isa_supported(isa), "attention_row_kernels: {} kernels on a CPU without them",
            memory::isa_name(isa));
  // Each table is built on first use only: building one runs code compiled for its instruction set.
  switch (isa) {
    case memory::IsaLevel::kAvx512: {
      static const AttentionRowKernels avx512 = attention_row_kernels_avx512();
      return avx512;
    }
    case memory::IsaLevel::kAvx2: {
      static const AttentionRowKernels avx2 = attention_row_kernels_avx2();
      return avx2;
    }
    case memory::IsaLevel::kScalar: break;
  }
  static const AttentionRowKernels scalar = attention_row_kernels_scalar();
  return scalar;
}

}  // namespace zs::nn::detail
