// Preemption: cluster schedulers send SIGTERM (SLURM to every task of the job, mpirun forwarding its
// own) some time before they kill a job. A program that watches for it can save a checkpoint at the
// next step boundary and exit 0, and the job restarted with the same command plus `--load` goes on.
//
//   zs::launch::PreemptionWatch watch;                      // after the engine exists (Note below)
//   while (...) {
//     engine.train_batch(source);
//     if (zs::launch::agree_preempted(watch, group)) { engine.save_checkpoint(dir); return 0; }
//   }
//
// Note [Preemption signals]: the handler only counts the signal in a lock-free atomic (it runs on any
// thread, between any two instructions: little is async-signal-safe to do there) and, on the first,
// calls the async-signal-safe hook it was given: `zeroshard train` passes offload's
// unlink_swap_files_now, because the SIGKILL that follows a SIGTERM (mpirun's after
// odls_base_sigkill_timeout, SLURM's after KillWait) cannot be caught, and a file already unlinked
// but still open is freed by the kernel whenever the process ends. The first SIGTERM or SIGINT sets
// the request; the program sees it at its next step boundary. A second one
// restores the action that was installed before the watch and re-raises the signal, so the process
// ends at once as it would have without the watch: when offload's swap files exist, that action is
// offload's exit-cleanup handler, which unlinks them first (offload/detail/exit_cleanup.h), which is
// why the watch must be created after the engine (after the swap files' handler is installed: that
// handler leaves a signal alone when it is not at its default action). A signal the process ignores
// (SIG_IGN, e.g. under nohup) stays ignored. Handlers are installed with SA_RESTART, so an
// interrupted read or write resumes; calls that never restart (poll, io_uring waits) retry on EINTR.
#pragma once

#include <span>

#include "comm/group.h"

namespace zs::launch {

// Watches SIGTERM and SIGINT while it exists (Note [Preemption signals]); the destructor restores the
// previous actions. At most one exists at a time (UsageError otherwise). Move-only in spirit: neither
// copyable nor movable.
class PreemptionWatch {
 public:
  // `on_first_signal` (may be null) runs inside the handler on the first signal: it must be
  // async-signal-safe.
  explicit PreemptionWatch(void (*on_first_signal)() noexcept = nullptr);
  ~PreemptionWatch();
  PreemptionWatch(const PreemptionWatch&) = delete;
  PreemptionWatch& operator=(const PreemptionWatch&) = delete;

  // The first watched signal that arrived on this process (SIGTERM, SIGINT), 0 when none has.
  int signal() const;
};

// Collective over `group` (every rank calls it at the same step boundary): true on every rank when a
// watched signal has arrived on any of them, so all ranks stop at the same step even when only one
// got the signal, or one got it later than the others. One 4-byte allreduce. `signal_out` (optional)
// gets the lowest signal number any rank saw.
bool agree_preempted(const PreemptionWatch& watch, const comm::Group& group, int* signal_out = nullptr);
// The same over several groups in turn whose product is the job (a Topology's dp, then tp): one
// 8-byte allreduce per group, so a stalled rank is named by the group it shares with the others.
bool agree_preempted(const PreemptionWatch& watch, std::span<const comm::Group* const> groups, int* signal_out = nullptr);

// "SIGTERM", "SIGINT", or "a signal".
const char* signal_name(int sig);

}  // namespace zs::launch
