#include "offload/detail/exit_cleanup.h"

#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>

#include "core/log.h"

namespace zs::offload::detail {
namespace {

constexpr size_t kSlots = 64;
constexpr size_t kPathBytes = 4096;

// Written under the mutex, read by the handler: a slot's `used` flag is set after its path is
// complete and cleared before the path changes, so the handler never sees half a path.
struct Slot {
  std::atomic<bool> used{false};
  char path[kPathBytes] = {};
};
std::array<Slot, kSlots> g_slots;
std::mutex g_mutex;
bool g_installed = false;
constexpr int kSignals[] = {SIGTERM, SIGINT, SIGHUP};

void on_signal(int sig) {
  unlink_registered_files();
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void install_handlers() {
  for (int sig : kSignals) {
    struct sigaction old {};
    ::sigaction(sig, nullptr, &old);
    // Leave a signal the program ignores (SIG_IGN) or handles itself alone.
    if (old.sa_handler != SIG_DFL) continue;
    struct sigaction act {};
    act.sa_handler = on_signal;
    sigemptyset(&act.sa_mask);
    ::sigaction(sig, &act, nullptr);
  }
}

}  // namespace

void unlink_registered_files() noexcept {
  for (Slot& s : g_slots) {
    if (s.used.load(std::memory_order_acquire)) ::unlink(s.path);  // async-signal-safe
  }
}

void register_for_exit_cleanup(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_installed) {
    install_handlers();
    g_installed = true;
  }
  if (path.size() >= kPathBytes) {
    ZS_LOG_WARN("offload: swap file path too long to remove on a signal: '{}'", path);
    return;
  }
  for (Slot& s : g_slots) {
    if (s.used.load(std::memory_order_relaxed)) continue;
    std::memcpy(s.path, path.c_str(), path.size() + 1);
    s.used.store(true, std::memory_order_release);
    return;
  }
  ZS_LOG_WARN("offload: more than {} swap files; '{}' is not removed if a signal ends the run", kSlots, path);
}

void unregister_for_exit_cleanup(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (Slot& s : g_slots) {
    if (s.used.load(std::memory_order_relaxed) && path == s.path) {
      s.used.store(false, std::memory_order_release);
      return;
    }
  }
}

}  // namespace zs::offload::detail
