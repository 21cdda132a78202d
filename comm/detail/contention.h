// Noticing that a spinning wait shares its core with other runnable threads (Note [Contended cores]).
// Used by the handshake's and point-to-point polls (Runtime::pause) and the shared-memory barriers.
//
// Note [Contended cores]
// Note [Polling] (comm/detail/runtime.h) spins for up to 20 ms before backing off, and yields only
// when the node runs more of our ranks than CPUs. Beside other busy processes (a second job, a
// compile) neither holds: a rank spinning for a descheduled peer keeps that peer off the core for a
// whole scheduler slice, and a GPT-MoE job at 2 ranks beside two busy loops on 2 cores spent ~27
// CPU-s per rank before step 1, most of it in these spins (issue #32). The cue is the waiting
// thread's own CPU time: a thread that spun for a wall-clock stretch but ran for clearly less of it
// (below 3/4, over at least kContentionWindow) was preempted, so its core is shared. Once a wait
// sees that, the wait goes straight to the back-off sleeps, and every wait of the Runtime spins only
// kWorkerSpin (50 us) for the next kContendedFor, so each later collective does not spin 1 ms first
// to find out again. The probe costs nothing on the fast path: the first CPU-time read (a system
// call, ~0.2 us) happens only once a wait has spun for kProbeAfter, far longer than an uncontended
// handshake (under 1 us), then at most once per kContentionWindow. Measured (docs/design.md,
// Communication): 20 steps of tests/configs/gpt_moe_ep2.json at np 2 beside two busy loops on 2 cores
// went from 1.2-1.8 to 0.56-0.71 CPU-s per rank and from 2.9-4.0 s to 1.7-2.2 s; idle, and comm_bench's
// small collectives, unchanged. (The 27 CPU-s of the issue did not reproduce here: 0.2-0.26 before
// step 1.)
//
// Note [Our own ranks' turns]
// Where our own ranks outnumber the node's CPUs (Runtime::oversubscribed), a wait yields on every miss,
// and a thread that yields runs for less than its wall-clock time whenever a peer on its core is
// runnable: the hand-over the yield is for, not another process. Judged contended, every wait then
// spun only 50 us and backed off into sleeps of 10 us and more, and each wake-up preempted the peer
// computing on the core for a poll (72-88 thousand context switches in a 60-step run, 59-69 thousand
// after). So such waits never judge contention: they yield for the whole spin phase, then back off as
// usual. Measured with benchmarks/binary_ab.py, the builds before and after interleaved on the 2-core
// AMD EPYC (docs/benchmarks.md, "Waits on oversubscribed cores"): 4 ranks at dp 2 x tp 2, whose 40
// tensor-parallel all-reduces a step each wait for the pair's other rank, 0.87x the step time (0.0593
// to 0.0515 s; np 2 x tp 2, a core per rank, takes 0.049 s for the same work); two hosts of 2 ranks on
// a core each 0.84x (ZeRO++ at 1 Gbit/s) and 0.89x (ZeRO-3 at 10 Gbit/s); a core per rank unchanged.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace zs::comm::detail {

using Clock = std::chrono::steady_clock;

constexpr auto kProbeAfter = std::chrono::microseconds(250);  // spin this long before the first probe
constexpr auto kContentionWindow = std::chrono::milliseconds(1);
constexpr auto kContendedFor = std::chrono::seconds(1);

// True when a thread that spun for `wall` ran for only `cpu` of it: preempted, its core shared.
// Undecided (false) over a stretch shorter than kContentionWindow.
constexpr bool preempted(std::chrono::nanoseconds cpu, std::chrono::nanoseconds wall) {
  return wall >= kContentionWindow && cpu * 4 < wall * 3;
}

// CPU time the calling thread has run (CLOCK_THREAD_CPUTIME_ID).
std::chrono::nanoseconds thread_cpu_time();

// One wait's probe: call contended(now) from the spin phase, at most every poll; it reads the
// thread's CPU time first at `start` + kProbeAfter and then once per kContentionWindow, judging
// each window with preempted(). Used by one thread.
class SpinProbe {
 public:
  explicit SpinProbe(Clock::time_point start) : start_(start) {}
  Clock::time_point start() const { return start_; }
  // True once a window of this wait found the thread preempted (then always true).
  bool contended(Clock::time_point now) {
    if (contended_ || now < next_) [[likely]] return contended_;
    return probe(now);
  }
  // The wait slept (its back-off): the next window starts afresh at the next contended() call, so a
  // sleep is never taken for preemption.
  void slept(Clock::time_point now) {
    cpu0_ = std::chrono::nanoseconds(-1);
    next_ = now;
  }

 private:
  bool probe(Clock::time_point now);
  Clock::time_point start_;
  Clock::time_point next_ = start_ + kProbeAfter;
  Clock::time_point wall0_{};
  std::chrono::nanoseconds cpu0_{-1};  // negative until the first probe
  bool contended_ = false;
};

// The Runtime's memory of recent contention, shared by every wait (any thread): seen() marks the
// cores contended for kContendedFor from `now`; recent() says whether that mark still holds.
class RecentContention {
 public:
  bool recent(Clock::time_point now) const {
    return now.time_since_epoch().count() < until_.load(std::memory_order_relaxed);
  }
  void seen(Clock::time_point now) {
    until_.store((now + kContendedFor).time_since_epoch().count(), std::memory_order_relaxed);
    times_seen_.fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t times_seen() const { return times_seen_.load(std::memory_order_relaxed); }  // a count

 private:
  std::atomic<Clock::rep> until_{0};
  std::atomic<uint64_t> times_seen_{0};
};

}  // namespace zs::comm::detail
