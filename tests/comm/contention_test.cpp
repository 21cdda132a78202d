// The contention detector of the comm waits (Note [Contended cores] in comm/detail/contention.h).
#include "comm/detail/contention.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace zs::comm::detail {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

TEST(Contention, PreemptedNeedsAWholeWindowAndAQuarterLost) {
  EXPECT_FALSE(preempted(milliseconds(0), microseconds(999)));  // too short to judge, even with no CPU
  EXPECT_TRUE(preempted(milliseconds(0), milliseconds(1)));
  EXPECT_TRUE(preempted(microseconds(740), milliseconds(1)));   // ran under 3/4 of the window
  EXPECT_FALSE(preempted(microseconds(750), milliseconds(1)));  // exactly 3/4: still its own core
  EXPECT_FALSE(preempted(milliseconds(1), milliseconds(1)));
  EXPECT_TRUE(preempted(milliseconds(10), milliseconds(20)));   // half of the core: two busy threads on it
  EXPECT_FALSE(preempted(milliseconds(19), milliseconds(20)));  // an interrupt or two
}

TEST(Contention, ThreadCpuTimeCountsSpinningNotSleeping) {
  const auto cpu0 = thread_cpu_time();
  ASSERT_GE(cpu0.count(), 0);
  std::this_thread::sleep_for(milliseconds(20));
  const auto slept = thread_cpu_time() - cpu0;
  EXPECT_LT(slept, milliseconds(10));
  const auto spin_end = Clock::now() + milliseconds(5);
  while (Clock::now() < spin_end) {
  }
  EXPECT_GT(thread_cpu_time() - cpu0, slept);
}

TEST(Contention, ProbeJudgesASleepAsPreemptionButNotAfterSlept) {
  const auto start = Clock::now();
  SpinProbe probe(start);
  EXPECT_FALSE(probe.contended(start));  // before kProbeAfter: no clock read, undecided
  // A "spin" that never ran is exactly what a preempted thread sees: wall time without CPU time.
  std::this_thread::sleep_for(kProbeAfter);
  EXPECT_FALSE(probe.contended(Clock::now()));  // the first probe takes the baseline
  std::this_thread::sleep_for(kContentionWindow * 2);
  EXPECT_TRUE(probe.contended(Clock::now()));
  EXPECT_TRUE(probe.contended(Clock::now()));  // stays decided

  SpinProbe fresh(Clock::now());
  std::this_thread::sleep_for(kProbeAfter);
  EXPECT_FALSE(fresh.contended(Clock::now()));
  std::this_thread::sleep_for(kContentionWindow * 2);
  fresh.slept(Clock::now());  // that was the wait's own back-off: not evidence
  EXPECT_FALSE(fresh.contended(Clock::now()));
}

TEST(Contention, RecentContentionLastsKContendedFor) {
  RecentContention recent;
  const auto now = Clock::now();
  EXPECT_FALSE(recent.recent(now));
  recent.seen(now);
  EXPECT_EQ(recent.times_seen(), 1u);
  EXPECT_TRUE(recent.recent(now));
  EXPECT_TRUE(recent.recent(now + kContendedFor - microseconds(1)));
  EXPECT_FALSE(recent.recent(now + kContendedFor));
}

}  // namespace
}  // namespace zs::comm::detail
