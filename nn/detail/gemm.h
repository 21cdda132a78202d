// Internal: the matrix product of the nn layers with bf16 operands (Note [bf16 products]).
//
//   using detail::GemmPath, detail::Matrix;
//   GemmPath path = detail::gemm_path_for(weight.dtype());     // once per layer call
//   detail::gemm(path, n, out, in, 1.0f, Matrix::of(x), Matrix::of(w, /*trans=*/true), 0.0f, y, out);
//
// Note [bf16 products]: with bf16 parameters a product used to convert the weight to an fp32 copy
// and run OpenBLAS's sgemm, so a bf16 step took as long as an fp32 one (Debian's OpenBLAS exports no
// bf16 GEMM). On a CPU whose AVX512-BF16 outruns its fp32 FMAs (Note [bf16 product rate], below) the
// products now run in our own kernel
// (gemm_avx512bf16.cpp): both operands are rounded to bf16 (round to nearest even) while they are
// packed into the kernel's blocked layout, products are accumulated in fp32 by vdpbf16ps, and C is
// fp32. The fp32 activations are therefore never converted by a pass of their own: the packing the
// kernel needs anyway does it, and a bf16 weight is read as it is stored. This is the rounding
// PyTorch's autocast applies (bf16 matmul inputs, fp32 accumulation). docs/design.md, "bf16 matrix
// products", has the measurements that chose this kernel over oneDNN, libxsmm and sgemm.
//
// Everywhere else (no AVX512-BF16, a vdpbf16ps slower than fp32 FMAs, or best_isa() capped below
// AVX-512 by --isa) the path is kSgemm:
// today's fp32 product, with bf16 operands widened to fp32 first, so results there are bit for bit
// what they were. fp32 training always takes kSgemm: only a bf16 weight selects the bf16 path.
#pragma once

#include <cstdint>
#include <string_view>

#include "memory/dtype.h"
#include "memory/tensor.h"

namespace zs::nn::detail {

enum class GemmPath : uint8_t {
  kSgemm,       // fp32 sgemm (OpenBLAS); bf16 operands are widened into a temporary fp32 copy
  kAvx512Bf16,  // our AVX512-BF16 kernel: operands rounded to bf16 when packed, fp32 accumulation
};

// A row-major matrix operand: element (r, c) of the stored matrix is at data[r * ld + c], fp32 or
// bf16. trans: the product uses its transpose (op(X) = X^T).
struct Matrix {
  const void* data = nullptr;
  memory::DType dtype = memory::DType::kF32;
  int64_t ld = 0;
  bool trans = false;

  static Matrix f32(const float* p, int64_t ld, bool trans = false) { return {p, memory::DType::kF32, ld, trans}; }
  // A contiguous fp32/bf16 tensor viewed as (numel / last dim, last dim).
  static Matrix of(const memory::Tensor& t, bool trans = false) { return {t.raw(), t.dtype(), t.size(-1), trans}; }
};

// Note [bf16 product rate]
// AVX512-BF16 does not make bf16 products faster everywhere. vdpbf16ps does twice the multiply-adds
// of an fp32 FMA per instruction, and on AMD Zen 4 both issue once per cycle, so our kernel runs bf16
// products at about 2x sgemm's rate. An Intel Xeon with AVX512-BF16 (2026-11-28, a 2-core VM) issues
// two fp32 FMAs per cycle but vdpbf16ps at half that rate: the kernel ran the GPTs' products at 80
// GFLOP/s per core against OpenBLAS sgemm's 147, and bf16 training at 0.56-0.69x of fp32
// (docs/benchmarks.md, "bf16 products by the core's rates"). So the choice is measured, not assumed:
// the register-only peak probe (memory/peak_flops.h, one thread, about 20 ms for both; the same figures model
// FLOPs utilisation divides by) compares the two instructions' flop rates once per process, and the
// kernel is taken when
// vdpbf16ps does at least kMinBf16RateOverFma times the FMA's flops. The rates differ by about 4x
// between the two kinds of core, so the margin keeps the choice from flipping with noise. Load can
// still halve one probe's rate for its whole 10 ms window (a vCPU sharing its physical core for a
// while): on a loaded Zen 4 one rank of a test took sgemm while its peer took the kernel (its device
// and activation peaks in a failed e2e_estimate_agrees_stage2_nvme.np2 were exactly the sgemm path's:
// the tied head's weight widened to an fp32 copy, 30,720 bytes above the memory estimate), so its
// arithmetic differed from its peer's as well. A ratio below the margin is therefore measured again, up to
// kBf16RateTries times in all, and the best ratio decides: a false "sgemm" then needs every try slowed,
// and a core whose vdpbf16ps is truly slower (about 0.5x) stays far below the margin in all of them,
// at the price of about 40 ms more once per process there.
// The environment variable ZS_BF16_GEMM overrides the probe: "native" takes the kernel wherever the
// CPU has AVX512-BF16 (the .avx512 kernel variants of the tests do, to test it on every such CPU),
// "sgemm" never takes it, "auto" (or unset) measures.
inline constexpr double kMinBf16RateOverFma = 1.5;
inline constexpr int kBf16RateTries = 3;

struct Bf16GemmChoice {
  GemmPath path = GemmPath::kSgemm;
  double rate_over_fma = 0.0;   // the probe's ratio; 0 when it did not run
  std::string_view why;         // how the path was chosen, for logs (a string literal)
  bool kernel_allowed = false;  // the kernel may run here: AVX512-BF16, no --isa cap, not ZS_BF16_GEMM=sgemm
};
// The path the library takes for products with a bf16 operand, decided once per process: kSgemm
// without AVX512-BF16 or with best_isa() below kAvx512; otherwise as Note [bf16 product rate] says.
// Throws ConfigError for an unknown ZS_BF16_GEMM value.
const Bf16GemmChoice& bf16_gemm_choice();
GemmPath bf16_gemm_path();  // bf16_gemm_choice().path
// Replaces this process's path (the ranks' agreement, Note [ranks agree the bf16 path] in nn/layers.h);
// `why` must outlive the process (a literal). Call before products run on other threads.
void set_bf16_gemm_path(GemmPath path, std::string_view why);
// The path for a layer whose weight has dtype `weight`: bf16_gemm_path() for bf16, kSgemm otherwise.
GemmPath gemm_path_for(memory::DType weight);
bool gemm_path_supported(GemmPath path);
std::string_view gemm_path_name(GemmPath path);  // "sgemm", "avx512bf16"

// C = alpha * op(A) op(B) + beta * C on `path`: op(A) is (m, k), op(B) is (k, n), C is (m, n) fp32
// with row stride ldc. Operands are fp32 or bf16 (fp16 is not supported). beta == 0 never reads C.
// Runs on compute_threads() threads (serially when called from inside a parallel_for), does nothing
// while kernels are off (Note [measuring run]). Path kAvx512Bf16 requires gemm_path_supported().
// Thread-safe; buffers are per thread (a packed block of each operand, under 1 MiB).
// bias (optional, n fp32 values): C starts as bias in every row instead of its own values, so
// C = alpha op(A) op(B) + beta bias, bit for bit what copying bias into each row of C first gives;
// the bf16 kernel reads bias where it would read C, without that pass over C (a layer's bias).
void gemm(GemmPath path, int64_t m, int64_t n, int64_t k, float alpha, const Matrix& a, const Matrix& b, float beta,
          float* c, int64_t ldc, const float* bias = nullptr);

}  // namespace zs::nn::detail
