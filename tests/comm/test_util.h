// Deterministic test data and naive references shared by the comm tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "memory/dtype.h"
#include "memory/tensor.h"

namespace zs::test {

// A value exactly representable in bf16 and fp16 whose sums over a few ranks are exact in fp32.
inline float value(int rank, size_t i) {
  int m = static_cast<int>((i * 7 + static_cast<size_t>(rank) * 3) % 64);
  return (1.0f + static_cast<float>(m) / 64.0f) * std::ldexp(1.0f, static_cast<int>(i % 4) - 1) * ((i + rank) % 3 == 0 ? -1.0f : 1.0f);
}

// A tensor of `n` elements of `dtype` holding value(rank, offset + i).
inline memory::Tensor filled(memory::DType dtype, size_t n, int rank, size_t offset = 0) {
  auto t = memory::Tensor::empty({static_cast<int64_t>(n)}, dtype);
  for (size_t i = 0; i < n; ++i) {
    float v = value(rank, offset + i);
    switch (dtype) {
      case memory::DType::kF32: t.data<float>()[i] = v; break;
      case memory::DType::kBF16: t.data<uint16_t>()[i] = memory::f32_to_bf16(v); break;
      case memory::DType::kF16: t.data<uint16_t>()[i] = memory::f32_to_f16(v); break;
      case memory::DType::kI32: t.data<int32_t>()[i] = static_cast<int32_t>(v * 8); break;
    }
  }
  return t;
}

inline float as_float(const memory::Tensor& t, size_t i) {
  switch (t.dtype()) {
    case memory::DType::kF32: return t.data<float>()[i];
    case memory::DType::kBF16: return memory::bf16_to_f32(t.data<uint16_t>()[i]);
    case memory::DType::kF16: return memory::f16_to_f32(t.data<uint16_t>()[i]);
    case memory::DType::kI32: return static_cast<float>(t.data<int32_t>()[i]);
  }
  return 0;
}

// Reference: the element's sum over ranks in fp32 (exact for these values), divided for an average,
// rounded once to `dtype`.
inline float reduced(memory::DType dtype, int ranks, size_t i, bool average) {
  float s = 0;
  for (int r = 0; r < ranks; ++r) {
    float v = value(r, i);
    s += dtype == memory::DType::kI32 ? static_cast<float>(static_cast<int32_t>(v * 8)) : v;
  }
  if (average) s /= static_cast<float>(ranks);
  switch (dtype) {
    case memory::DType::kBF16: return memory::bf16_to_f32(memory::f32_to_bf16(s));
    case memory::DType::kF16: return memory::f16_to_f32(memory::f32_to_f16(s));
    default: return s;
  }
}

inline float stored(memory::DType dtype, int rank, size_t i) { return as_float(filled(dtype, 1, rank, i), 0); }

// Element i as a double, whatever the dtype (16-bit values widened exactly).
inline double as_double(const memory::Tensor& t, size_t i) {
  switch (t.dtype()) {
    case memory::DType::kF32: return t.data<float>()[i];
    case memory::DType::kBF16: return memory::bf16_to_f32(t.data<uint16_t>()[i]);
    case memory::DType::kF16: return memory::f16_to_f32(t.data<uint16_t>()[i]);
    case memory::DType::kI32: return t.data<int32_t>()[i];
  }
  return 0;
}

inline memory::Tensor empty(size_t n, memory::DType t) { return memory::Tensor::empty({static_cast<int64_t>(n)}, t); }

inline bool same_bits(const memory::Tensor& a, const memory::Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.raw(), b.raw(), static_cast<size_t>(a.numel()) * memory::dtype_size(a.dtype())) == 0;
}

// Deterministic values in [-1, 1) of rank `rank`, element offset + i, mixed by a hash (int32: the
// value x 1000 truncated); 16-bit dtypes store them rounded.
inline float raw_value(int rank, size_t i) {
  uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(rank) + 7) * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return static_cast<float>(static_cast<double>(h >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

inline memory::Tensor random_values(memory::DType t, size_t n, int rank, size_t offset = 0) {
  memory::Tensor x = memory::Tensor::empty({static_cast<int64_t>(n)}, t);
  for (size_t i = 0; i < n; ++i) {
    const float v = raw_value(rank, offset + i);
    switch (t) {
      case memory::DType::kF32: x.data<float>()[i] = v; break;
      case memory::DType::kBF16: x.data<uint16_t>()[i] = memory::f32_to_bf16(v); break;
      case memory::DType::kF16: x.data<uint16_t>()[i] = memory::f32_to_f16(v); break;
      case memory::DType::kI32: x.data<int32_t>()[i] = static_cast<int32_t>(v * 1000); break;
    }
  }
  return x;
}

}  // namespace zs::test
