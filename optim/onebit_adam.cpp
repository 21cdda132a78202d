// One-bit Adam / 0/1 Adam configs, constants, scalar reference kernels and the ISA dispatch. This
// file is compiled with -ffp-contract=off -fno-math-errno like the fast loops (optim/CMakeLists.txt),
// so the references round each operation once, in the order written.
#include "optim/onebit_adam.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/errors.h"
#include "core/parallel.h"
#include "optim/detail/onebit_kernels.h"

namespace zs::optim {
namespace {

constexpr int64_t kLineFloats = 64 / sizeof(float);
// Below about 16K elements per thread a wake-up costs more than the work it shares (as Adam's).
constexpr int64_t kGrainElements = 1024 * kLineFloats;

struct Common {
  double lr;
  std::array<double, 2> betas;
  double eps;
  double weight_decay;
};

void validate_common(const Common& c, const std::string& path) {
  auto fail = [&](const std::string& key, const std::string& what) {
    throw ConfigError(fmt::format("{}.{}: {}", path, key, what));
  };
  if (!(c.lr >= 0 && std::isfinite(c.lr))) fail("lr", fmt::format("must be a finite value >= 0, got {}", c.lr));
  for (int i = 0; i < 2; ++i) {
    if (!(c.betas[i] >= 0 && c.betas[i] < 1)) {
      fail(fmt::format("betas[{}]", i), fmt::format("must be in [0, 1), got {}", c.betas[i]));
    }
  }
  if (!(c.eps > 0 && std::isfinite(c.eps))) fail("eps", fmt::format("must be a finite value > 0, got {}", c.eps));
  if (!(c.weight_decay >= 0 && std::isfinite(c.weight_decay))) {
    fail("weight_decay", fmt::format("must be a finite value >= 0, got {}", c.weight_decay));
  }
}

void require_at_least(int64_t value, int64_t min, const std::string& path, const char* key, const char* why) {
  if (value < min) throw ConfigError(fmt::format("{}.{}: must be >= {} ({}), got {}", path, key, min, why, value));
}

CompressedConstants fold(const Common& c, const CompressedStep& s) {
  // torch computes `alpha = 1 - beta1` in double and applies it as a float: do the same.
  CompressedConstants k;
  k.beta1 = static_cast<float>(c.betas[0]);
  k.beta2 = static_cast<float>(c.betas[1]);
  k.one_minus_beta1 = static_cast<float>(1.0 - c.betas[0]);
  k.one_minus_beta2 = static_cast<float>(1.0 - c.betas[1]);
  k.eps = static_cast<float>(c.eps);
  k.weight_decay = static_cast<float>(c.weight_decay);
  k.lr = static_cast<float>(s.lr);
  k.grad_scale = s.grad_scale;
  k.lrs = static_cast<float>(s.lrs);
  return k;
}

float decay_of(const CompressedChunk& c, const CompressedConstants& k) {
  return c.apply_weight_decay ? k.weight_decay : 0.0f;
}

void check(const CompressedChunk& c, const char* kernel, bool master, bool m, bool v, bool u, bool g) {
  ZS_ASSERT((!master || c.master != nullptr) && (!m || c.exp_avg != nullptr) && (!v || c.exp_avg_sq != nullptr) &&
                (!u || c.accumulator != nullptr) && (!g || c.grad != nullptr),
            "{}: an array it uses is null (master {}, exp_avg {}, exp_avg_sq {}, accumulator {}, grad {})", kernel,
            static_cast<const void*>(c.master), static_cast<const void*>(c.exp_avg),
            static_cast<const void*>(c.exp_avg_sq), static_cast<const void*>(c.accumulator),
            static_cast<const void*>(c.grad));
  ZS_ASSERT(c.low_precision == nullptr || c.low_precision_dtype == memory::DType::kBF16 ||
                c.low_precision_dtype == memory::DType::kF16,
            "{}: low-precision copy must be bf16 or fp16, got {}", kernel,
            memory::dtype_name(c.low_precision_dtype));
}

void write_low(const CompressedChunk& c) {
  if (c.low_precision != nullptr) {
    memory::convert(c.master, memory::DType::kF32, c.low_precision, c.low_precision_dtype, c.n);
  }
}

template <void (*kScalar)(const CompressedChunk&, const CompressedConstants&),
          void (*kAvx2)(const CompressedChunk&, const CompressedConstants&),
          void (*kAvx512)(const CompressedChunk&, const CompressedConstants&)>
void dispatch(const CompressedChunk& c, const CompressedConstants& k, memory::IsaLevel isa, const char* name) {
  ZS_ASSERT(memory::isa_supported(isa), "{}: {} kernel called on a CPU without it", name, memory::isa_name(isa));
  switch (isa) {
    case memory::IsaLevel::kAvx512:
      kAvx512(c, k);
      return;
    case memory::IsaLevel::kAvx2:
      kAvx2(c, k);
      return;
    case memory::IsaLevel::kScalar:
      kScalar(c, k);
      return;
  }
}

using detail::Avx2Isa;
using detail::Avx512Isa;
using detail::CompressedLoops;
using detail::ScalarIsa;

#define ZS_COMPRESSED_DISPATCH(fn)                                                                      \
  dispatch<&CompressedLoops<ScalarIsa>::fn, &CompressedLoops<Avx2Isa>::fn, &CompressedLoops<Avx512Isa>::fn>( \
      c, k, isa, #fn)

}  // namespace

void validate(const OneBitAdamConfig& c, const std::string& path) {
  validate_common({c.lr, c.betas, c.eps, c.weight_decay}, path);
  require_at_least(c.freeze_step, 1, path, "freeze_step",
                   "the variance is only updated during the warm-up, so at least one warm-up step must run");
}

void validate(const ZeroOneAdamConfig& c, const std::string& path) {
  validate_common({c.lr, c.betas, c.eps, c.weight_decay}, path);
  require_at_least(c.var_freeze_step, 0, path, "var_freeze_step", "a step number");
  require_at_least(c.var_update_scaler, 1, path, "var_update_scaler",
                   "the variance interval doubles every this many updates; use a large value to keep it at 1");
  require_at_least(c.local_step_scaler, 1, path, "local_step_scaler",
                   "the local-step interval doubles every this many steps; use a large value to keep it at 1");
  require_at_least(c.local_step_clipper, 1, path, "local_step_clipper",
                   "the most steps between synchronisations; 1 synchronises every step");
}

bool one_bit_frozen(const OneBitAdamConfig& config, int64_t step) { return step > config.freeze_step; }

CompressedChunk CompressedChunk::slice(size_t begin, size_t end) const {
  ZS_ASSERT(begin <= end && end <= n, "CompressedChunk::slice [{}, {}) of {} elements", begin, end, n);
  auto at = [begin](auto* ptr) { return ptr == nullptr ? nullptr : ptr + begin; };
  CompressedChunk s = *this;
  s.master = at(master);
  s.exp_avg = at(exp_avg);
  s.exp_avg_sq = at(exp_avg_sq);
  s.accumulator = at(accumulator);
  s.grad = at(grad);
  s.n = end - begin;
  if (low_precision != nullptr) {
    s.low_precision = static_cast<char*>(low_precision) + begin * memory::dtype_size(low_precision_dtype);
  }
  return s;
}

CompressedConstants compressed_constants(const OneBitAdamConfig& c, const CompressedStep& s) {
  return fold({c.lr, c.betas, c.eps, c.weight_decay}, s);
}

CompressedConstants compressed_constants(const ZeroOneAdamConfig& c, const CompressedStep& s) {
  return fold({c.lr, c.betas, c.eps, c.weight_decay}, s);
}

// --- Fast kernels: the per-ISA loops of detail/onebit_loops.h. ---

void adam_update(const CompressedChunk& c, const CompressedConstants& k, memory::IsaLevel isa) {
  check(c, "adam_update", true, true, true, false, true);
  ZS_COMPRESSED_DISPATCH(adam_update);
}

void momentum_update(const CompressedChunk& c, const CompressedConstants& k, memory::IsaLevel isa) {
  check(c, "momentum_update", false, true, false, false, true);
  ZS_COMPRESSED_DISPATCH(momentum_update);
}

void frozen_update(const CompressedChunk& c, const CompressedConstants& k, memory::IsaLevel isa) {
  check(c, "frozen_update", true, true, true, false, false);
  ZS_COMPRESSED_DISPATCH(frozen_update);
}

void local_step(const CompressedChunk& c, const CompressedConstants& k, memory::IsaLevel isa) {
  check(c, "local_step", true, true, true, true, true);
  ZS_COMPRESSED_DISPATCH(local_step);
}

void sync_prepare(const CompressedChunk& c, const CompressedConstants& k, memory::IsaLevel isa) {
  check(c, "sync_prepare", true, false, true, true, false);
  ZS_COMPRESSED_DISPATCH(sync_prepare);
}

void local_step_sync_prepare(const CompressedChunk& c, const CompressedConstants& k, memory::IsaLevel isa) {
  check(c, "local_step_sync_prepare", true, true, true, true, true);
  ZS_COMPRESSED_DISPATCH(local_step_sync_prepare);
}

void sync_finish(const CompressedChunk& c, const CompressedConstants& k, memory::IsaLevel isa) {
  check(c, "sync_finish", true, true, true, true, false);
  ZS_COMPRESSED_DISPATCH(sync_finish);
}

// --- Scalar references: the test oracles, written as the formulas in onebit_adam.h read. ---

void adam_update_reference(const CompressedChunk& c, const CompressedConstants& k) {
  check(c, "adam_update_reference", true, true, true, false, true);
  const float wd = decay_of(c, k);
  for (size_t i = 0; i < c.n; ++i) {
    const float gs = c.grad[i] * k.grad_scale;
    c.exp_avg[i] = k.beta1 * c.exp_avg[i] + k.one_minus_beta1 * gs;
    c.exp_avg_sq[i] = k.beta2 * c.exp_avg_sq[i] + k.one_minus_beta2 * gs * gs;
    const float upd = c.exp_avg[i] / (std::sqrt(c.exp_avg_sq[i]) + k.eps) + wd * c.master[i];
    c.master[i] = c.master[i] - k.lr * upd;
  }
  write_low(c);
}

void momentum_update_reference(const CompressedChunk& c, const CompressedConstants& k) {
  check(c, "momentum_update_reference", false, true, false, false, true);
  for (size_t i = 0; i < c.n; ++i) {
    const float gs = c.grad[i] * k.grad_scale;
    c.exp_avg[i] = k.beta1 * c.exp_avg[i] + k.one_minus_beta1 * gs;
  }
}

void frozen_update_reference(const CompressedChunk& c, const CompressedConstants& k) {
  check(c, "frozen_update_reference", true, true, true, false, false);
  const float wd = decay_of(c, k);
  for (size_t i = 0; i < c.n; ++i) {
    const float upd = c.exp_avg[i] / (std::sqrt(c.exp_avg_sq[i]) + k.eps) + wd * c.master[i];
    c.master[i] = c.master[i] - k.lr * upd;
  }
  write_low(c);
}

void local_step_reference(const CompressedChunk& c, const CompressedConstants& k) {
  check(c, "local_step_reference", true, true, true, true, true);
  const float wd = decay_of(c, k);
  for (size_t i = 0; i < c.n; ++i) {
    const float gs = c.grad[i] * k.grad_scale;
    c.exp_avg[i] = k.beta1 * c.exp_avg[i] + k.one_minus_beta1 * gs;
    const float upd = c.exp_avg[i] / (std::sqrt(c.exp_avg_sq[i]) + k.eps) + wd * c.master[i];
    c.master[i] = c.master[i] - k.lr * upd;
    c.accumulator[i] = c.accumulator[i] - k.lr * upd;
  }
  write_low(c);
}

void sync_prepare_reference(const CompressedChunk& c, const CompressedConstants& k) {
  check(c, "sync_prepare_reference", true, false, true, true, false);
  for (size_t i = 0; i < c.n; ++i) {
    c.master[i] = c.master[i] - c.accumulator[i];
    c.accumulator[i] = c.accumulator[i] * (std::sqrt(c.exp_avg_sq[i]) + k.eps);
  }
}

void sync_finish_reference(const CompressedChunk& c, const CompressedConstants& k) {
  check(c, "sync_finish_reference", true, true, true, true, false);
  for (size_t i = 0; i < c.n; ++i) {
    if (k.lrs > 0.0f) c.exp_avg[i] = -(c.accumulator[i] / k.lrs);
    c.master[i] = c.master[i] + c.accumulator[i] / (std::sqrt(c.exp_avg_sq[i]) + k.eps);
    c.accumulator[i] = 0.0f;
  }
  write_low(c);
}

void run_parallel(CompressedKernel kernel, const CompressedChunk& c, const CompressedConstants& k, int threads,
                  memory::IsaLevel isa) {
  // Cuts are multiples of 16 elements in the index space shifted so that master's first 64-byte
  // line starts at 0 (the same rule as Optimizer::step_parallel).
  // Nothing may throw inside the parallel region: an empty slice runs the kernel's own checks (null
  // arrays, dtype, ISA) here first, and they pass on every piece once they pass on the whole chunk.
  kernel(c.slice(0, 0), k, isa);
  const auto n = static_cast<int64_t>(c.n);
  const int64_t pad = c.master == nullptr
                          ? 0
                          : static_cast<int64_t>((reinterpret_cast<uintptr_t>(c.master) % 64) / sizeof(float));
  const int64_t units = (n + pad + kLineFloats - 1) / kLineFloats;
  const int64_t grain = kGrainElements / kLineFloats;
  if (threads <= 1 || parallel_chunks(threads, units, grain) <= 1) {
    kernel(c, k, isa);
    return;
  }
  parallel_for_threads(threads, units, grain, [&](int64_t u0, int64_t u1, int) {
    const int64_t b = std::max<int64_t>(0, u0 * kLineFloats - pad);
    const int64_t e = std::min<int64_t>(n, u1 * kLineFloats - pad);
    if (e > b) kernel(c.slice(static_cast<size_t>(b), static_cast<size_t>(e)), k, isa);
  });
}

}  // namespace zs::optim
