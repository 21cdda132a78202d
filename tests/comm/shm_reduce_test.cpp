// The shared-memory collectives' sum kernels (comm/detail/shm_reduce.h): every ISA the CPU runs gives
// the scalar kernel's bits, for every type pair, source count, divisor and tail length; the scalar
// kernel itself sums in source order in fp32 and rounds once; the streaming copy copies exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "comm/detail/shm_reduce.h"

using namespace zs;
using memory::DType;
using memory::IsaLevel;

namespace {

std::vector<unsigned char> values(DType t, size_t n, int seed) {
  std::vector<unsigned char> out(n * memory::dtype_size(t));
  for (size_t i = 0; i < n; ++i) {
    const float v = std::sin(static_cast<float>(i * 7 + static_cast<size_t>(seed) * 131)) * std::ldexp(1.0f, static_cast<int>(i % 9) - 4);
    switch (t) {
      case DType::kF32: std::memcpy(out.data() + i * 4, &v, 4); break;
      case DType::kBF16: { uint16_t h = memory::f32_to_bf16(v); std::memcpy(out.data() + i * 2, &h, 2); break; }
      case DType::kF16: { uint16_t h = memory::f32_to_f16(v); std::memcpy(out.data() + i * 2, &h, 2); break; }
      case DType::kI32: { int32_t x = static_cast<int32_t>(v * 1e6f); std::memcpy(out.data() + i * 4, &x, 4); break; }
    }
  }
  return out;
}

struct Pair {
  DType src, dst;
};

TEST(ShmReduce, EveryIsaGivesTheScalarBits) {
  const Pair pairs[] = {{DType::kF32, DType::kF32},  {DType::kBF16, DType::kBF16}, {DType::kF16, DType::kF16},
                        {DType::kBF16, DType::kF32}, {DType::kF16, DType::kF32},   {DType::kF32, DType::kBF16},
                        {DType::kF32, DType::kF16},  {DType::kI32, DType::kI32}};
  for (const Pair& p : pairs) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{15}, size_t{16}, size_t{31}, size_t{33}, size_t{1000}}) {
      for (size_t n_src : {size_t{1}, size_t{2}, size_t{3}, size_t{5}}) {
        for (float divisor : {1.0f, 3.0f}) {
          if (p.src == DType::kI32 && divisor != 1.0f) continue;
          std::vector<std::vector<unsigned char>> data;
          std::vector<const void*> srcs;
          for (size_t s = 0; s < n_src; ++s) data.push_back(values(p.src, n, static_cast<int>(s)));
          for (auto& d : data) srcs.push_back(d.data());
          const size_t out_bytes = n * memory::dtype_size(p.dst);
          std::vector<unsigned char> ref(out_bytes + 1, 0xAB);
          comm::detail::reduce_sum(srcs, p.src, ref.data(), p.dst, n, divisor, IsaLevel::kScalar);
          EXPECT_EQ(ref[out_bytes], 0xAB) << "wrote past the end";
          for (IsaLevel isa : memory::supported_isas()) {
            std::vector<unsigned char> got(out_bytes + 1, 0xAB);
            comm::detail::reduce_sum(srcs, p.src, got.data(), p.dst, n, divisor, isa);
            EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), out_bytes + 1))
                << memory::isa_name(isa) << " " << memory::dtype_name(p.src) << "->" << memory::dtype_name(p.dst) << " n "
                << n << " sources " << n_src << " divisor " << divisor;
          }
          // The scalar reference: source order, fp32, one rounding.
          if (p.src == DType::kF32 && p.dst == DType::kF32 && n > 0) {
            float acc = reinterpret_cast<const float*>(data[0].data())[n - 1];
            for (size_t s = 1; s < n_src; ++s) acc += reinterpret_cast<const float*>(data[s].data())[n - 1];
            if (divisor != 1.0f) acc /= divisor;
            float got = 0;
            std::memcpy(&got, ref.data() + (n - 1) * 4, 4);
            EXPECT_EQ(got, acc);
          }
        }
      }
    }
  }
}

TEST(ShmReduce, InPlaceIntoTheFirstSource) {
  for (IsaLevel isa : memory::supported_isas()) {
    auto a = values(DType::kBF16, 100, 1), b = values(DType::kBF16, 100, 2);
    std::vector<unsigned char> ref(200);
    const void* srcs[] = {a.data(), b.data()};
    comm::detail::reduce_sum(srcs, DType::kBF16, ref.data(), DType::kBF16, 100, 2.0f, IsaLevel::kScalar);
    comm::detail::reduce_sum(srcs, DType::kBF16, a.data(), DType::kBF16, 100, 2.0f, isa);
    EXPECT_EQ(0, std::memcmp(a.data(), ref.data(), 200)) << memory::isa_name(isa);
  }
}

}  // namespace

// copy_streaming: every byte, for destinations on and off cache lines, whole lines or not, with the
// bytes either side untouched.
TEST(ShmReduce, StreamingCopyCopiesExactly) {
  std::vector<unsigned char> src(3 * 4096 + 200), dst(src.size() + 256);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
  for (size_t dst_off : {size_t{0}, size_t{1}, size_t{37}, size_t{64}}) {
    for (size_t src_off : {size_t{0}, size_t{3}}) {
      for (size_t bytes : {size_t{0}, size_t{5}, size_t{63}, size_t{64}, size_t{129}, size_t{3 * 4096 + 100}}) {
        std::fill(dst.begin(), dst.end(), 0xEE);
        auto* d = dst.data() + 64 - reinterpret_cast<uintptr_t>(dst.data()) % 64 + dst_off;  // offset from a line
        comm::detail::copy_streaming(d, src.data() + src_off, bytes);
        EXPECT_EQ(0, std::memcmp(d, src.data() + src_off, bytes)) << dst_off << " " << src_off << " " << bytes;
        EXPECT_EQ(d[-1], 0xEE);
        EXPECT_EQ(d[bytes], 0xEE);
      }
    }
  }
}
