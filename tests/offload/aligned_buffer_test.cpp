// AlignedBuffer: alignment, rounding, accounting under (offload_buffers, host), moves, empty buffers.
#include <gtest/gtest.h>

#include <cstdint>
#include <utility>

#include "core/errors.h"
#include "offload/aligned_buffer.h"

namespace zs::offload {
namespace {

using memory::Category;
using memory::MemoryTracker;
using memory::Tier;

TEST(AlignedBuffer, AlignedRoundedAndZeroed) {
  for (size_t n : {size_t{1}, size_t{4095}, size_t{4096}, size_t{4097}, size_t{3} << 20}) {
    AlignedBuffer b(n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % kIoAlignment, 0u);
    EXPECT_EQ(b.size(), n);
    EXPECT_EQ(b.capacity(), io_align_up(n));
    EXPECT_EQ(b.span().size(), n);
    EXPECT_EQ(b.data()[n - 1], std::byte{0});
    b.data()[b.capacity() - 1] = std::byte{7};  // the rounded tail is ours to use
    EXPECT_EQ(b.prefix(b.capacity()).size(), b.capacity());
    EXPECT_THROW(b.prefix(b.capacity() + 1), InternalError);
  }
  EXPECT_EQ(io_align_up(0), 0u);
  EXPECT_EQ(io_align_up(1), 4096u);
}

TEST(AlignedBuffer, TrackedWhileAliveAndMovable) {
  MemoryTracker t;
  {
    AlignedBuffer a(10000, &t);
    EXPECT_EQ(t.current(Category::kOffloadBuffers, Tier::kHost), 12288u);
    AlignedBuffer b = std::move(a);
    EXPECT_TRUE(a.empty());
    EXPECT_EQ(a.data(), nullptr);
    EXPECT_EQ(t.current(Category::kOffloadBuffers, Tier::kHost), 12288u);
    AlignedBuffer c(4096, &t, Category::kOptimizer);
    EXPECT_EQ(t.current(Category::kOptimizer, Tier::kHost), 4096u);
    c = std::move(b);  // frees c's own 4096 bytes
    EXPECT_EQ(t.current(Category::kOptimizer, Tier::kHost), 0u);
    EXPECT_EQ(t.current(Category::kOffloadBuffers, Tier::kHost), 12288u);
    c.reset();
    EXPECT_EQ(t.current(Category::kOffloadBuffers, Tier::kHost), 0u);
    c.reset();  // idempotent
  }
  EXPECT_EQ(t.peak(Category::kOffloadBuffers, Tier::kHost), 12288u);
}

TEST(AlignedBuffer, EmptyAndPinned) {
  AlignedBuffer e(0);
  EXPECT_TRUE(e.empty());
  EXPECT_EQ(e.capacity(), 0u);
  // mlock of one page is within every default RLIMIT_MEMLOCK (64 KiB or more).
  AlignedBuffer p(4096, nullptr, Category::kOffloadBuffers, /*pin=*/true);
  EXPECT_TRUE(p.pinned());
}

TEST(IoWindow, CoversTheRangeWithAlignedEnds) {
  constexpr IoWindow inside = io_window(5000, 100);  // within one page
  static_assert(inside.offset == 4096 && inside.bytes == 4096 && inside.skip == 904);
  const IoWindow straddling = io_window(4000, 200);  // crosses a page boundary
  EXPECT_EQ(straddling.offset, 0u);
  EXPECT_EQ(straddling.bytes, 8192u);
  EXPECT_EQ(straddling.skip, 4000u);
  const IoWindow aligned = io_window(8192, 4096);
  EXPECT_EQ(aligned.offset, 8192u);
  EXPECT_EQ(aligned.bytes, 4096u);
  EXPECT_EQ(aligned.skip, 0u);
  for (uint64_t begin : {0ull, 1ull, 4095ull, 123457ull}) {
    for (size_t n : {size_t{1}, size_t{4096}, size_t{10000}}) {
      const IoWindow w = io_window(begin, n);
      EXPECT_TRUE(io_aligned(w.offset) && io_aligned(w.bytes));
      EXPECT_EQ(w.offset + w.skip, begin);
      EXPECT_GE(w.bytes, w.skip + n);
      EXPECT_LT(w.bytes - (w.skip + n), kIoAlignment);
    }
  }
}

}  // namespace
}  // namespace zs::offload
