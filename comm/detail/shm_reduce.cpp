#include "comm/detail/shm_reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "core/errors.h"

namespace zs::comm::detail {

namespace {

using memory::DType;

inline float load(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kBF16: return memory::bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16: return memory::f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kI32: break;
  }
  return 0.0f;
}

inline void store(void* p, DType t, size_t i, float v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(p)[i] = v; break;
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = memory::f32_to_bf16(v); break;
    case DType::kF16: static_cast<uint16_t*>(p)[i] = memory::f32_to_f16(v); break;
    case DType::kI32: break;
  }
}

void sum_i32(const void* const* srcs, size_t n_src, void* dst, size_t n) {
  auto* out = static_cast<uint32_t*>(dst);  // unsigned: wrapping sums, as MPI's in practice
  for (size_t i = 0; i < n; ++i) {
    uint32_t acc = static_cast<const uint32_t*>(srcs[0])[i];
    for (size_t s = 1; s < n_src; ++s) acc += static_cast<const uint32_t*>(srcs[s])[i];
    out[i] = acc;
  }
}

}  // namespace

void reduce_sum_scalar(const void* const* srcs, size_t n_src, DType src_type, void* dst, DType dst_type, size_t n,
                       float divisor) {
  const bool divide = divisor != 1.0f;
  for (size_t i = 0; i < n; ++i) {
    float acc = load(srcs[0], src_type, i);
    for (size_t s = 1; s < n_src; ++s) acc += load(srcs[s], src_type, i);
    if (divide) acc /= divisor;
    store(dst, dst_type, i, acc);
  }
}

void reduce_sum(std::span<const void* const> srcs, DType src_type, void* dst, DType dst_type, size_t n,
                float divisor, memory::IsaLevel isa) {
  ZS_ASSERT(!srcs.empty(), "reduce_sum needs at least one source");
  ZS_ASSERT(dst_type == src_type || (dst_type != DType::kI32 && (src_type == DType::kF32 || dst_type == DType::kF32)),
            "reduce_sum: {} sources into {}", memory::dtype_name(src_type), memory::dtype_name(dst_type));
  if (n == 0) return;
  if (src_type == DType::kI32) {
    ZS_ASSERT(divisor == 1.0f, "int32 reductions are sums");
    sum_i32(srcs.data(), srcs.size(), dst, n);
    return;
  }
  if (!memory::isa_supported(isa)) {
    throw ConfigError(fmt::format("reduce_sum: the {} kernel cannot run on this CPU", memory::isa_name(isa)));
  }
  switch (isa) {
    case memory::IsaLevel::kAvx512:
      reduce_sum_avx512(srcs.data(), srcs.size(), src_type, dst, dst_type, n, divisor);
      return;
    case memory::IsaLevel::kAvx2: {
      const size_t body = n / 8 * 8;
      reduce_sum_avx2(srcs.data(), srcs.size(), src_type, dst, dst_type, body, divisor);
      if (body == n) return;
      const size_t in_es = memory::dtype_size(src_type);
      const void* tail[64];
      std::vector<const void*> many;  // more than 64 sources: rare enough to allocate
      const void** t = srcs.size() <= 64 ? tail : (many.resize(srcs.size()), many.data());
      for (size_t s = 0; s < srcs.size(); ++s) t[s] = static_cast<const char*>(srcs[s]) + body * in_es;
      reduce_sum_scalar(t, srcs.size(), src_type, static_cast<char*>(dst) + body * memory::dtype_size(dst_type),
                        dst_type, n - body, divisor);
      return;
    }
    case memory::IsaLevel::kScalar:
      reduce_sum_scalar(srcs.data(), srcs.size(), src_type, dst, dst_type, n, divisor);
      return;
  }
}

void copy_streaming(void* dst, const void* src, size_t bytes) {
#if defined(__SSE2__)
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  const size_t head = std::min(bytes, (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64);
  std::memcpy(d, s, head);  // up to the first destination cache line
  d += head, s += head, bytes -= head;
  for (; bytes >= 64; d += 64, s += 64, bytes -= 64) {  // whole lines: the write-combining buffers fill
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  std::memcpy(d, s, bytes);
  _mm_sfence();  // streaming stores are weakly ordered: done before whatever follows (a barrier's flag)
#else
  std::memcpy(dst, src, bytes);
#endif
}

void reduce_sum(std::span<const void* const> srcs, DType src_type, void* dst, DType dst_type, size_t n,
                float divisor) {
  static const memory::IsaLevel isa = memory::best_isa();
  reduce_sum(srcs, src_type, dst, dst_type, n, divisor, isa);
}

}  // namespace zs::comm::detail
