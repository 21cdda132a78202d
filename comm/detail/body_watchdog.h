// BodyWatchdog: bounds the data exchange of a collective, after its handshake (Note [Handshake]).
//
// Note [Stalled body]
// The handshake proves every rank reached the collective; the body then runs MPI's blocking collective.
// A rank stopped or cut off after the handshake (SIGSTOP, a frozen node, a lost link: anything mpirun
// does not see as a dead process) leaves its peers blocked inside MPI for ever, and a blocked MPI call
// can be neither timed out nor cancelled. Fault injection found it (tests/faults/fault_trials.py: a
// rank stopped during the GPT-MoE's all-to-all hung its peer). So each body is armed here with a
// deadline of comm.timeout_s + kGraceS; a body still running past it cannot end any other way, and the watchdog
// ends the job as World::abort does: one line "zeroshard: rank R: fatal: <collective> on <group> timed
// out ..." on stderr, then MPI_Abort, which makes mpirun end every rank. A body that is merely slow (a
// very large message on a slow link) needs a larger comm.timeout_s, as a slow peer does for the
// handshake. The grace of kGraceS (10 s) absorbs a loaded machine's scheduling: with 17 runnable
// processes on 2 cores, the MPI_Comm_split of a 2-rank job took over 2 s after its handshake. A job
// still ends within comm.timeout_s + 30 s of a rank's failure. Cost: a mutex and a list insert per
// collective; the thread wakes every 100 ms.
//
// Thread-safety: arm/disarm from any thread; one thread per watchdog, started at construction.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <thread>

namespace zs::comm::detail {

class BodyWatchdog {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr double kGraceS = 10.0;
  BodyWatchdog();
  ~BodyWatchdog();
  BodyWatchdog(const BodyWatchdog&) = delete;
  BodyWatchdog& operator=(const BodyWatchdog&) = delete;

  struct Entry {
    Clock::time_point deadline;
    double timeout_s = 0;
    // describe(subject): the collective and its group (Op::describe()), called only if the deadline
    // passes, so no message is formatted per collective. `subject` must outlive the armed entry.
    std::string (*describe)(const void* subject) = nullptr;
    const void* subject = nullptr;
  };
  using Ticket = std::list<Entry>::iterator;
  Ticket arm(double timeout_s, std::string (*describe)(const void*), const void* subject);
  void disarm(Ticket t);

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::list<Entry> armed_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace zs::comm::detail
