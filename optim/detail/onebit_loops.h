// Definitions of CompressedLoops<Isa> (detail/onebit_kernels.h). Include only from the
// onebit_kernels_<isa>.cpp files, each of which instantiates it for one ISA and is compiled with
// -ffp-contract=off -fno-math-errno (optim/CMakeLists.txt), so GCC vectorises these loops for that
// ISA with exactly the scalar operations: IEEE add, multiply, divide and sqrt are correctly rounded
// in every lane, so the vector code equals the `_reference` loops bit for bit.
// Only builtins and out-of-line functions are called here: an inline non-template helper compiled
// with AVX-512 flags could be picked by the linker for the scalar build too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "memory/dtype.h"
#include "optim/detail/onebit_kernels.h"

namespace zs::optim::detail {

// Note [Blocked low copy]: each loop runs over blocks small enough (2 KiB of master) that the block
// is still in L1 when the bf16/fp16 conversion reads it back: one pass over memory, with the
// conversion's own SIMD kernel instead of a per-element call inside the vectorised loop.
template <class Isa, class Body>
inline void blocked_loop(const CompressedChunk& c, bool write_low, Body&& body) {
  constexpr size_t kBlock = 512;
  for (size_t b = 0; b < c.n; b += kBlock) {
    const size_t len = c.n - b < kBlock ? c.n - b : kBlock;
    body(b, len);
    if (write_low && c.low_precision != nullptr) {
      const std::span<const float> src(c.master + b, len);
      const std::span<uint16_t> dst(static_cast<uint16_t*>(c.low_precision) + b, len);
      if (c.low_precision_dtype == memory::DType::kBF16) {
        memory::convert_f32_to_bf16(src, dst, Isa::kIsa);
      } else {
        memory::convert_f32_to_f16(src, dst, Isa::kIsa);
      }
    }
  }
}

template <class Isa>
void CompressedLoops<Isa>::adam_update(const CompressedChunk& c, const CompressedConstants& k) {
  const float wd = c.apply_weight_decay ? k.weight_decay : 0.0f;
  blocked_loop<Isa>(c, true, [&](size_t b, size_t len) {
    float* __restrict p = c.master + b;
    float* __restrict m = c.exp_avg + b;
    float* __restrict v = c.exp_avg_sq + b;
    const float* __restrict g = c.grad + b;
    for (size_t i = 0; i < len; ++i) {
      const float gs = g[i] * k.grad_scale;
      const float mi = k.beta1 * m[i] + k.one_minus_beta1 * gs;
      const float vi = k.beta2 * v[i] + k.one_minus_beta2 * gs * gs;
      const float upd = mi / (__builtin_sqrtf(vi) + k.eps) + wd * p[i];
      m[i] = mi;
      v[i] = vi;
      p[i] = p[i] - k.lr * upd;
    }
  });
}

template <class Isa>
void CompressedLoops<Isa>::momentum_update(const CompressedChunk& c, const CompressedConstants& k) {
  blocked_loop<Isa>(c, false, [&](size_t b, size_t len) {
    float* __restrict m = c.exp_avg + b;
    const float* __restrict g = c.grad + b;
    for (size_t i = 0; i < len; ++i) m[i] = k.beta1 * m[i] + k.one_minus_beta1 * (g[i] * k.grad_scale);
  });
}

template <class Isa>
void CompressedLoops<Isa>::frozen_update(const CompressedChunk& c, const CompressedConstants& k) {
  const float wd = c.apply_weight_decay ? k.weight_decay : 0.0f;
  blocked_loop<Isa>(c, true, [&](size_t b, size_t len) {
    float* __restrict p = c.master + b;
    const float* __restrict m = c.exp_avg + b;
    const float* __restrict v = c.exp_avg_sq + b;
    for (size_t i = 0; i < len; ++i) {
      const float upd = m[i] / (__builtin_sqrtf(v[i]) + k.eps) + wd * p[i];
      p[i] = p[i] - k.lr * upd;
    }
  });
}

template <class Isa>
void CompressedLoops<Isa>::local_step(const CompressedChunk& c, const CompressedConstants& k) {
  const float wd = c.apply_weight_decay ? k.weight_decay : 0.0f;
  blocked_loop<Isa>(c, true, [&](size_t b, size_t len) {
    float* __restrict p = c.master + b;
    float* __restrict m = c.exp_avg + b;
    const float* __restrict v = c.exp_avg_sq + b;
    float* __restrict u = c.accumulator + b;
    const float* __restrict g = c.grad + b;
    for (size_t i = 0; i < len; ++i) {
      const float mi = k.beta1 * m[i] + k.one_minus_beta1 * (g[i] * k.grad_scale);
      const float step = k.lr * (mi / (__builtin_sqrtf(v[i]) + k.eps) + wd * p[i]);
      m[i] = mi;
      p[i] = p[i] - step;
      u[i] = u[i] - step;
    }
  });
}

template <class Isa>
void CompressedLoops<Isa>::sync_prepare(const CompressedChunk& c, const CompressedConstants& k) {
  blocked_loop<Isa>(c, false, [&](size_t b, size_t len) {
    float* __restrict p = c.master + b;
    const float* __restrict v = c.exp_avg_sq + b;
    float* __restrict u = c.accumulator + b;
    for (size_t i = 0; i < len; ++i) {
      p[i] = p[i] - u[i];
      u[i] = u[i] * (__builtin_sqrtf(v[i]) + k.eps);
    }
  });
}

template <class Isa>
void CompressedLoops<Isa>::local_step_sync_prepare(const CompressedChunk& c, const CompressedConstants& k) {
  const float wd = c.apply_weight_decay ? k.weight_decay : 0.0f;
  blocked_loop<Isa>(c, false, [&](size_t b, size_t len) {
    float* __restrict p = c.master + b;
    float* __restrict m = c.exp_avg + b;
    const float* __restrict v = c.exp_avg_sq + b;
    float* __restrict u = c.accumulator + b;
    const float* __restrict g = c.grad + b;
    for (size_t i = 0; i < len; ++i) {
      const float d = __builtin_sqrtf(v[i]) + k.eps;
      const float mi = k.beta1 * m[i] + k.one_minus_beta1 * (g[i] * k.grad_scale);
      const float step = k.lr * (mi / d + wd * p[i]);
      const float pi = p[i] - step;
      const float ui = u[i] - step;
      m[i] = mi;
      p[i] = pi - ui;
      u[i] = ui * d;
    }
  });
}

template <class Isa>
void CompressedLoops<Isa>::sync_finish(const CompressedChunk& c, const CompressedConstants& k) {
  // Two loops rather than a branch inside one, so each vectorises; lrs == 0 keeps m (onebit_adam.h).
  const bool set_momentum = k.lrs > 0.0f;
  blocked_loop<Isa>(c, true, [&](size_t b, size_t len) {
    float* __restrict p = c.master + b;
    float* __restrict m = c.exp_avg + b;
    const float* __restrict v = c.exp_avg_sq + b;
    float* __restrict u = c.accumulator + b;
    if (set_momentum) {
      for (size_t i = 0; i < len; ++i) {
        const float ui = u[i];
        m[i] = -(ui / k.lrs);
        p[i] = p[i] + ui / (__builtin_sqrtf(v[i]) + k.eps);
        u[i] = 0.0f;
      }
    } else {
      for (size_t i = 0; i < len; ++i) {
        p[i] = p[i] + u[i] / (__builtin_sqrtf(v[i]) + k.eps);
        u[i] = 0.0f;
      }
    }
  });
}

}  // namespace zs::optim::detail
