// Helpers for the offload tests: temporary directories, IoError messages, private mounts (tiny tmpfs, ramfs, read-only
// file systems) when the process may mount, captured log warnings and byte patterns.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <spdlog/sinks/base_sink.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/errors.h"
#include "core/log.h"
#include "tests/support/temp_dir.h"

namespace zs::offload::test {

using zs::test::TempDir;  // tests/support/temp_dir.h

// Checks that `text` contains `part`, printing the text when it does not.
#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

// The message of the IoError that f() throws (a test failure when it throws none).
template <typename F>
std::string io_error(F&& f) {
  try {
    f();
  } catch (const IoError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an IoError";
  return {};
}

// Moves this process into its own mount namespace (once), so test mounts are invisible to everyone
// else and vanish with the process even if it crashes. False when not permitted (not root, or a
// sandbox forbids it), or when called after threads exist.
inline bool private_mount_namespace() {
  static const bool ok = [] {
    if (::unshare(CLONE_NEWNS) != 0) return false;
    return ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0;
  }();
  return ok;
}

// A file system of `type` mounted on a temporary directory in a private mount namespace; ok() is
// false (and why() says why) when mounting is not possible here.
class ScopedMount {
 public:
  ScopedMount(const std::string& type, const std::string& options, unsigned long flags = 0) {
    if (!private_mount_namespace()) {
      why_ = "cannot create a private mount namespace (needs root and an unconfined process)";
      return;
    }
    if (::mount("zs-test", dir_.path().c_str(), type.c_str(), flags, options.c_str()) != 0) {
      why_ = "mount -t " + type + " failed: " + std::to_string(errno);
      return;
    }
    mounted_ = true;
  }
  ~ScopedMount() {
    if (mounted_) ::umount2(dir_.path().c_str(), MNT_DETACH);
  }
  bool ok() const { return mounted_; }
  const std::string& why() const { return why_; }
  const std::string& path() const { return dir_.path(); }

 private:
  TempDir dir_;
  bool mounted_ = false;
  std::string why_;
};

// Collects the zeroshard logger's warnings while alive.
class WarningCapture {
 public:
  WarningCapture() : sink_(std::make_shared<Sink>()) { zs::logger().sinks().push_back(sink_); }
  ~WarningCapture() {
    auto& sinks = zs::logger().sinks();
    std::erase(sinks, std::static_pointer_cast<spdlog::sinks::sink>(sink_));
  }
  std::vector<std::string> warnings() const {
    std::lock_guard lock(sink_->mu);
    return sink_->lines;
  }

 private:
  struct Sink : spdlog::sinks::base_sink<std::mutex> {
    std::mutex mu;
    std::vector<std::string> lines;
    void sink_it_(const spdlog::details::log_msg& msg) override {
      if (msg.level < spdlog::level::warn) return;
      std::lock_guard lock(mu);
      lines.emplace_back(msg.payload.data(), msg.payload.size());
    }
    void flush_() override {}
  };
  std::shared_ptr<Sink> sink_;
};

// Whether files in `dir` can be opened with O_DIRECT.
inline bool supports_direct(const std::string& dir) {
  const std::string probe = dir + "/.zs-odirect-probe";
  const int fd = ::open(probe.c_str(), O_CREAT | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  if (fd >= 0) ::close(fd);
  ::unlink(probe.c_str());
  return fd >= 0;
}

// Deterministic bytes: pattern(n, seed)[i] depends on (seed, i).
inline std::vector<std::byte> pattern(size_t n, uint64_t seed) {
  std::vector<std::byte> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = static_cast<std::byte>(x >> 24);
  }
  return v;
}

// A pid with no process behind it on this host (for stale-file tests).
inline long dead_pid() {
  for (long pid = 4000000; pid > 1000; pid -= 7919) {
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return pid;
  }
  return -1;
}

}  // namespace zs::offload::test
