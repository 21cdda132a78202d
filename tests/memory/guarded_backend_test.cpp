#include "memory/guarded_backend.h"

#include <gtest/gtest.h>

#include <vector>

#include "memory/measuring_backend.h"

namespace zs::memory {
namespace {

TEST(GuardedBackend, OperationsWorkWhileTheMemoryIsGuarded) {
  GuardedBackend b(1 << 20);
  Segment seg = b.allocate(4096, Tier::kDevice);
  std::vector<float> host(1024, 1.5f), back(1024, 0.0f);
  b.copy(seg.data(), Tier::kDevice, host.data(), Tier::kHost, 4096);
  b.accumulate(seg.data(), Tier::kDevice, host.data(), Tier::kHost, DType::kF32, 1024);
  b.copy(back.data(), Tier::kHost, seg.data(), Tier::kDevice, 4096);
  EXPECT_EQ(back[7], 3.0f);
  EXPECT_EQ(b.transfers().host_to_device_bytes, 2 * 4096u);
  EXPECT_EQ(b.transfers().device_to_host_bytes, 4096u);
  b.fill(static_cast<float*>(seg.data()), Tier::kDevice, 2.0f, 1024);
  {
    DeviceAccess access(b);
    EXPECT_EQ(static_cast<const float*>(seg.data())[1023], 2.0f);
  }
  EXPECT_FALSE(b.accessible());
}

TEST(GuardedBackend, AccessOutsideAScopeDies) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        GuardedBackend b(1 << 20);
        Segment seg = b.allocate(4096, Tier::kDevice);
        static_cast<volatile char*>(seg.data())[100] = 1;
      },
      "byte 100 of a device segment");
}

TEST(MeasuringBackend, HandsOutAddressesAndSkipsEverything) {
  MeasuringBackend b(size_t{1} << 40);  // a terabyte of address space, no memory
  Segment seg = b.allocate(size_t{1} << 39, Tier::kDevice);
  ASSERT_NE(seg.data(), nullptr);
  EXPECT_FALSE(b.runs_kernels());
  bool ran = false;
  run_kernel(b, [&] { ran = true; });
  EXPECT_FALSE(ran);
  std::vector<float> host(16);
  b.copy(seg.data(), Tier::kDevice, host.data(), Tier::kHost, 64);  // counted, not done
  EXPECT_EQ(b.transfers().host_to_device_bytes, 64u);
  EXPECT_EQ(b.allocated(Tier::kDevice), size_t{1} << 39);
}

}  // namespace
}  // namespace zs::memory
