#include "memory/detail/host_ops.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/parallel.h"

namespace zs::memory::detail {
namespace {

constexpr size_t kPieceElements = size_t{1} << 14;  // 64 KiB of fp32: stays in L2 while it is added

// fn(offset, count) over [0, n) in kPieceElements pieces, on up to `threads` threads.
template <typename F>
void for_pieces(size_t n, int threads, F&& fn) {
  const auto pieces = static_cast<int64_t>((n + kPieceElements - 1) / kPieceElements);
  if (pieces <= 1) {
    if (n > 0) fn(size_t{0}, n, 0);
    return;
  }
  parallel_for_threads(threads, pieces, 4, [&](int64_t p0, int64_t p1, int t) {
    for (int64_t p = p0; p < p1; ++p) {
      const size_t off = static_cast<size_t>(p) * kPieceElements;
      fn(off, std::min(kPieceElements, n - off), t);
    }
  });
}

}  // namespace

void host_copy(void* dst, const void* src, size_t bytes, int threads) {
  for_pieces(bytes, threads, [&](size_t off, size_t k, int) {
    std::memcpy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, k);
  });
}

void host_convert(void* dst, DType dst_type, const void* src, DType src_type, size_t n, int threads) {
  const size_t db = dtype_size(dst_type), sb = dtype_size(src_type);
  for_pieces(n, threads, [&](size_t off, size_t k, int) {
    convert(static_cast<const char*>(src) + off * sb, src_type, static_cast<char*>(dst) + off * db, dst_type, k);
  });
}

void host_accumulate(void* dst, const void* src, DType dtype, size_t n, int threads) {
  if (dtype == DType::kF32) {
    for_pieces(n, threads, [&](size_t off, size_t k, int) {
      auto* d = static_cast<float*>(dst) + off;
      const auto* s = static_cast<const float*>(src) + off;
      for (size_t i = 0; i < k; ++i) d[i] += s[i];
    });
    return;
  }
  // 16-bit: both sides to fp32 in per-thread scratch, added, rounded back once.
  std::vector<std::vector<float>> scratch(static_cast<size_t>(std::max(1, threads)));
  for_pieces(n, threads, [&](size_t off, size_t k, int t) {
    std::vector<float>& buf = scratch[static_cast<size_t>(t)];
    buf.resize(2 * kPieceElements);
    float* a = buf.data();
    float* b = buf.data() + kPieceElements;
    auto* d = static_cast<uint16_t*>(dst) + off;
    const auto* s = static_cast<const uint16_t*>(src) + off;
    convert(d, dtype, a, DType::kF32, k);
    convert(s, dtype, b, DType::kF32, k);
    for (size_t i = 0; i < k; ++i) a[i] += b[i];
    convert(a, DType::kF32, d, dtype, k);
  });
}

void host_fill_zero(void* dst, size_t bytes, int threads) {
  for_pieces(bytes, threads, [&](size_t off, size_t k, int) { std::memset(static_cast<char*>(dst) + off, 0, k); });
}

void host_fill(float* dst, float value, size_t n, int threads) {
  for_pieces(n, threads, [&](size_t off, size_t k, int) { std::fill_n(dst + off, k, value); });
}

}  // namespace zs::memory::detail
