#include "launch/preemption.h"

#include <signal.h>

#include <atomic>
#include <cstdint>

#include "core/errors.h"
#include "memory/tensor.h"

namespace zs::launch {
namespace {

constexpr int kSignals[] = {SIGTERM, SIGINT};
constexpr int kWatched = 2;

// Read by the handler (Note [Preemption signals]); written only while no watch exists or by the handler.
static_assert(std::atomic<int>::is_always_lock_free, "the handler needs a lock-free atomic");
std::atomic<int> g_count{0};  // watched signals received
std::atomic<int> g_first{0};  // the first one's number
std::atomic<bool> g_exists{false};
void (*g_on_first)() noexcept = nullptr;  // set before the handlers are installed
struct sigaction g_previous[kWatched];
bool g_installed[kWatched] = {};

int slot_of(int sig) { return sig == SIGTERM ? 0 : 1; }

void on_signal(int sig) {
  int expected = 0;
  g_first.compare_exchange_strong(expected, sig);
  if (g_count.fetch_add(1) == 0) {  // the first: the program stops at its next step boundary
    if (g_on_first != nullptr) g_on_first();
    return;
  }
  // A second: end now, as the process would have without the watch (sigaction and raise are
  // async-signal-safe). The raised signal stays blocked until this handler returns, then the restored
  // action runs.
  ::sigaction(sig, &g_previous[slot_of(sig)], nullptr);
  ::raise(sig);
}

}  // namespace

PreemptionWatch::PreemptionWatch(void (*on_first_signal)() noexcept) {
  if (g_exists.exchange(true)) throw UsageError("launch::PreemptionWatch: only one may exist at a time");
  g_on_first = on_first_signal;
  g_count.store(0);
  g_first.store(0);
  for (int i = 0; i < kWatched; ++i) {
    const int sig = kSignals[i];
    g_installed[i] = false;
    struct sigaction old {};
    ::sigaction(sig, nullptr, &old);
    if ((old.sa_flags & SA_SIGINFO) == 0 && old.sa_handler == SIG_IGN) continue;  // stays ignored
    g_previous[i] = old;
    struct sigaction act {};
    act.sa_handler = on_signal;
    act.sa_flags = SA_RESTART;
    sigemptyset(&act.sa_mask);
    for (int other : kSignals) sigaddset(&act.sa_mask, other);  // one handler run at a time
    ::sigaction(sig, &act, nullptr);
    g_installed[i] = true;
  }
}

PreemptionWatch::~PreemptionWatch() {
  for (int i = 0; i < kWatched; ++i) {
    if (g_installed[i]) ::sigaction(kSignals[i], &g_previous[i], nullptr);
    g_installed[i] = false;
  }
  g_exists.store(false);
}

int PreemptionWatch::signal() const { return g_first.load(std::memory_order_relaxed); }

bool agree_preempted(const PreemptionWatch& watch, const comm::Group& group, int* signal_out) {
  const comm::Group* groups[] = {&group};
  return agree_preempted(watch, groups, signal_out);
}

bool agree_preempted(const PreemptionWatch& watch, std::span<const comm::Group* const> groups, int* signal_out) {
  const int sig = watch.signal();
  // {ranks that saw a signal, ranks whose first was SIGTERM}: the job reports SIGTERM if any rank got it.
  // Summed over each group in turn, the second carrying the first's sums: over a Topology's dp, then
  // tp (the dp groups of one tp group's ranks partition the job) every rank ends with the job's totals.
  int32_t seen[2] = {sig != 0 ? 1 : 0, sig == SIGTERM ? 1 : 0};
  for (const comm::Group* group : groups) {
    if (group->size() > 1) group->allreduce(memory::Tensor(seen, memory::DType::kI32, {2}), comm::ReduceOp::kSum);
  }
  if (signal_out != nullptr) *signal_out = seen[0] == 0 ? 0 : seen[1] > 0 ? SIGTERM : SIGINT;
  return seen[0] > 0;
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    default: return "a signal";
  }
}

}  // namespace zs::launch
