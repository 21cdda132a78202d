// Backend interface through the CPU backend: segments are owned and aligned, capacities enforced,
// copies between tiers move the bytes, unsupported tiers and names are rejected.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "core/errors.h"
#include "memory/cpu_backend.h"
#include "memory/shared_mapping.h"

namespace zs::memory {
namespace {

TEST(CpuBackend, SegmentsAreOwnedAlignedAndCounted) {
  CpuBackend b(1 << 20, 8 << 20);
  EXPECT_EQ(b.name(), "cpu");
  EXPECT_EQ(b.capacity(Tier::kDevice), 1u << 20);
  EXPECT_EQ(b.capacity(Tier::kHost), 8u << 20);
  EXPECT_EQ(b.capacity(Tier::kNvme), 0u);
  {
    Segment s = b.allocate(1000, Tier::kDevice);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s.data()) % 4096, 0u);
    EXPECT_EQ(s.size(), 1000u);
    EXPECT_EQ(s.tier(), Tier::kDevice);
    EXPECT_EQ(b.allocated(Tier::kDevice), 1000u);
    Segment moved = std::move(s);
    EXPECT_FALSE(s);
    EXPECT_TRUE(moved);
    EXPECT_EQ(b.allocated(Tier::kDevice), 1000u);
    Segment h = b.allocate(4096, Tier::kHost);
    EXPECT_EQ(b.allocated(Tier::kHost), 4096u);
    h.reset();
    EXPECT_EQ(b.allocated(Tier::kHost), 0u);
  }
  EXPECT_EQ(b.allocated(Tier::kDevice), 0u);
}

// shared_device: device segments are SharedMappings another process can map (here: this one, through
// its own /proc entry), freed with the segment; host segments stay private.
TEST(CpuBackend, SharedDeviceSegmentsAreMappableThroughProc) {
  CpuBackend backend(8 << 20, 0, /*shared_device=*/true);
  Segment dev = backend.allocate(1 << 20, Tier::kDevice);
  Segment host = backend.allocate(4096, Tier::kHost);
  const SharedMapping* m = backend.shared_mapping(dev.data());
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(backend.shared_mapping(host.data()), nullptr);
  EXPECT_EQ(m->data(), dev.data());
  static_cast<unsigned char*>(dev.data())[12345] = 77;
  std::string error;
  SharedMapping peer = SharedMapping::open_peer(static_cast<int>(::getpid()), m->fd(), m->size(), error);
  ASSERT_TRUE(peer) << error;
  EXPECT_NE(peer.data(), dev.data());
  EXPECT_EQ(static_cast<const unsigned char*>(peer.data())[12345], 77);  // the same pages
  // Read-write (the direct allreduce writes its sums into the peers' tensors): stores reach the owner.
  SharedMapping both = SharedMapping::open_peer(static_cast<int>(::getpid()), m->fd(), m->size(), error,
                                                PeerAccess::kReadWrite);
  ASSERT_TRUE(both) << error;
  static_cast<unsigned char*>(both.data())[4321] = 55;
  EXPECT_EQ(static_cast<const unsigned char*>(dev.data())[4321], 55);
  SharedMapping bad = SharedMapping::open_peer(static_cast<int>(::getpid()), 1 << 20, 4096, error);
  EXPECT_FALSE(bad);
  EXPECT_NE(error.find("/proc/"), std::string::npos) << error;
  dev.reset();
  EXPECT_EQ(backend.allocated(Tier::kDevice), 0u);
  EXPECT_EQ(CpuBackend(8 << 20).shared_mapping(host.data()), nullptr);  // private by default
}

TEST(CpuBackend, DeviceCapacityIsEnforced) {
  CpuBackend b(1 << 20);
  Segment a = b.allocate(768 << 10, Tier::kDevice);
  try {
    Segment c = b.allocate(512 << 10, Tier::kDevice);
    FAIL();
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("device.memory_mb"), std::string::npos);
  }
  EXPECT_EQ(b.allocated(Tier::kDevice), 768u << 10);  // the failed request left no trace
  Segment d = b.allocate(256 << 10, Tier::kDevice);     // exactly fills the rest
  EXPECT_THROW(b.allocate(100, Tier::kNvme), InternalError);
}

TEST(CpuBackend, CopiesBetweenTiers) {
  CpuBackend b(1 << 20);
  Segment dev = b.allocate(4096, Tier::kDevice);
  Segment host = b.allocate(4096, Tier::kHost);
  std::vector<unsigned char> src(4096);
  std::iota(src.begin(), src.end(), 0);
  b.copy(host.data(), Tier::kHost, src.data(), Tier::kHost, 4096);
  b.copy(dev.data(), Tier::kDevice, host.data(), Tier::kHost, 4096);
  std::memset(host.data(), 0, 4096);
  b.copy(host.data(), Tier::kHost, dev.data(), Tier::kDevice, 4096);
  b.synchronize();
  EXPECT_EQ(std::memcmp(host.data(), src.data(), 4096), 0);
  EXPECT_THROW(b.copy(dev.data(), Tier::kDevice, host.data(), Tier::kNvme, 16), InternalError);
}

TEST(Backend, FactoryKnowsCpuOnly) {
  auto b = make_backend("cpu", 1 << 20);
  EXPECT_EQ(b->name(), "cpu");
  EXPECT_EQ(b->capacity(Tier::kDevice), 1u << 20);
  try {
    make_backend("cuda", 1 << 20);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos);
  }
}

}  // namespace
}  // namespace zs::memory
