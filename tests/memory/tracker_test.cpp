// MemoryTracker: per-(category, tier) counters, tier and category sums, peaks of sums (not sums of
// peaks), RAII TrackedBytes, JSON names, and concurrent updates.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "core/errors.h"
#include "memory/tracker.h"

namespace zs::memory {
namespace {

TEST(Category, NamesRoundTrip) {
  EXPECT_EQ(category_name(Category::kCommBuffers), "comm_buffers");
  EXPECT_EQ(category_name(Category::kOffloadBuffers), "offload_buffers");
  EXPECT_EQ(tier_name(Tier::kNvme), "nvme");
  for (Category c : kAllCategories) EXPECT_EQ(category_from_name(category_name(c)), c);
  for (Tier t : kAllTiers) EXPECT_EQ(tier_from_name(tier_name(t)), t);
  EXPECT_FALSE(category_from_name("weights").has_value());
}

TEST(Tracker, CurrentAndPeaks) {
  MemoryTracker m;
  m.add(Category::kParams, Tier::kDevice, 100);
  m.add(Category::kGrads, Tier::kDevice, 50);
  m.sub(Category::kParams, Tier::kDevice, 100);
  m.add(Category::kActivations, Tier::kDevice, 80);
  EXPECT_EQ(m.current(Category::kParams, Tier::kDevice), 0u);
  EXPECT_EQ(m.peak(Category::kParams, Tier::kDevice), 100u);
  EXPECT_EQ(m.tier_current(Tier::kDevice), 130u);
  EXPECT_EQ(m.tier_peak(Tier::kDevice), 150u);  // 100 + 50, not 100 + 50 + 80
  // The peak's make-up: the moment params 100 and grads 50 were alive together.
  EXPECT_EQ(m.at_tier_peak(Category::kParams, Tier::kDevice), 100u);
  EXPECT_EQ(m.at_tier_peak(Category::kGrads, Tier::kDevice), 50u);
  EXPECT_EQ(m.at_tier_peak(Category::kActivations, Tier::kDevice), 0u);
  m.add(Category::kActivations, Tier::kDevice, 30);  // 160: a new peak, made of grads and activations
  EXPECT_EQ(m.at_tier_peak(Category::kParams, Tier::kDevice), 0u);
  EXPECT_EQ(m.at_tier_peak(Category::kActivations, Tier::kDevice), 110u);
  m.sub(Category::kActivations, Tier::kDevice, 30);
  m.add(Category::kOptimizer, Tier::kHost, 400);
  m.add(Category::kOptimizer, Tier::kNvme, 1000);
  EXPECT_EQ(m.category_current(Category::kOptimizer), 1400u);
  EXPECT_EQ(m.tier_current(Tier::kHost), 400u);
  EXPECT_THROW(m.sub(Category::kGrads, Tier::kDevice, 51), InternalError);
  m.reset_peaks();
  EXPECT_EQ(m.tier_peak(Tier::kDevice), 130u);
  EXPECT_EQ(m.peak(Category::kParams, Tier::kDevice), 0u);
  EXPECT_EQ(m.at_tier_peak(Category::kActivations, Tier::kDevice), 80u);

  auto snap = m.snapshot();
  EXPECT_EQ(snap.at(Category::kGrads, Tier::kDevice), 50u);
  auto j = snap.to_json();
  EXPECT_EQ(j.at("device").at("current").at("grads").as_uint64(), 50u);
  EXPECT_EQ(j.at("nvme").at("total_current").as_uint64(), 1000u);
  EXPECT_EQ(j.at("host").at("peak").at("optimizer").as_uint64(), 400u);
  EXPECT_EQ(j.at("device").at("at_peak").at("grads").as_uint64(), 50u);
}

TEST(Tracker, TrackedBytesIsRaiiAndMovable) {
  MemoryTracker m;
  {
    TrackedBytes a(&m, Category::kOffloadBuffers, Tier::kHost, 4096);
    EXPECT_EQ(m.current(Category::kOffloadBuffers, Tier::kHost), 4096u);
    TrackedBytes b = std::move(a);
    EXPECT_EQ(m.current(Category::kOffloadBuffers, Tier::kHost), 4096u);
    TrackedBytes c(&m, Category::kOffloadBuffers, Tier::kHost, 10);
    c = std::move(b);  // releases c's 10 bytes
    EXPECT_EQ(m.current(Category::kOffloadBuffers, Tier::kHost), 4096u);
  }
  EXPECT_EQ(m.current(Category::kOffloadBuffers, Tier::kHost), 0u);
  EXPECT_EQ(m.peak(Category::kOffloadBuffers, Tier::kHost), 4106u);
  TrackedBytes none(nullptr, Category::kParams, Tier::kHost, 5);  // no tracker: no-op
}

TEST(Tracker, ConcurrentUpdatesBalance) {
  MemoryTracker m;
  constexpr int kThreads = 4, kIters = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&m, t] {
      auto c = kAllCategories[static_cast<size_t>(t) % kNumCategories];
      for (int i = 0; i < kIters; ++i) {
        m.add(c, Tier::kDevice, 64);
        m.add(Category::kActivations, Tier::kHost, 8);
        m.sub(c, Tier::kDevice, 64);
        m.sub(Category::kActivations, Tier::kHost, 8);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(m.tier_current(Tier::kDevice), 0u);
  EXPECT_EQ(m.tier_current(Tier::kHost), 0u);
  EXPECT_GE(m.tier_peak(Tier::kDevice), 64u);
  EXPECT_LE(m.tier_peak(Tier::kDevice), 64u * kThreads);
}

}  // namespace
}  // namespace zs::memory
