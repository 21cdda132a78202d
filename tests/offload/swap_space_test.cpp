// SwapSpace: preflight errors (missing, not a directory, unwritable even for root, too little space),
// file naming, preallocation, accounting, regions, removal on destruction and on exceptions, and the
// stale-file warning that touches nothing.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "core/errors.h"
#include "launch/preemption.h"
#include "offload/swap_space.h"
#include "tests/offload/offload_test_util.h"

namespace zs::offload {
namespace {

namespace fs = std::filesystem;
using memory::Category;
using memory::MemoryTracker;
using memory::Tier;
using test::io_error;
using test::TempDir;

const bool kMountNs = test::private_mount_namespace();

size_t files_in(const std::string& dir) {
  size_t n = 0;
  for ([[maybe_unused]] auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

TEST(SwapSpace, CreatesNamedPreallocatedFileAndRemovesIt) {
  TempDir dir;
  MemoryTracker tracker;
  std::string path;
  {
    SwapSpace s(dir.path(), 3, "optim", 10000, AioConfig{}, &tracker, Category::kOptimizer);
    path = s.path();
    EXPECT_EQ(path, dir.path() + "/zeroshard-swap-r3-" + std::to_string(::getpid()) + "-optim.bin");
    EXPECT_EQ(path, SwapSpace::file_path(dir.path(), 3, "optim"));
    EXPECT_EQ(s.capacity(), 12288u);
    EXPECT_EQ(fs::file_size(path), 12288u);
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_GE(static_cast<size_t>(st.st_blocks) * 512, 12288u) << "blocks preallocated, not a sparse file";
    EXPECT_EQ(tracker.current(Category::kOptimizer, Tier::kNvme), 12288u);
    EXPECT_EQ(files_in(dir.path()), 1u) << "the writability probe is gone";
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(tracker.current(Category::kOptimizer, Tier::kNvme), 0u);
  EXPECT_EQ(files_in(dir.path()), 0u);
}

TEST(SwapSpace, RemovedWhenAnExceptionUnwinds) {
  TempDir dir;
  std::string path;
  try {
    SwapSpace s(dir.path(), 0, "params", 4096, AioConfig{});
    path = s.path();
    ASSERT_TRUE(fs::exists(path));
    throw std::runtime_error("training failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(path.empty());
  EXPECT_FALSE(fs::exists(path));
}

// mpirun ends the other ranks of a failed job with SIGTERM: no destructor runs, the handler removes
// the files (offload/detail/exit_cleanup.h).
TEST(SwapSpace, RemovedWhenSigtermEndsTheProcess) {
  TempDir dir;
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipe_fds[0]);
    SwapSpace s(dir.path(), 3, "optimizer", 8192, AioConfig{});
    const char ready = 1;
    (void)!::write(pipe_fds[1], &ready, 1);
    for (;;) ::pause();  // until the signal
  }
  ::close(pipe_fds[1]);
  char ready = 0;
  ASSERT_EQ(::read(pipe_fds[0], &ready, 1), 1);
  ::close(pipe_fds[0]);
  EXPECT_EQ(files_in(dir.path()), 1u);
  ::kill(child, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "the signal's default action still ends it";
  EXPECT_EQ(files_in(dir.path()), 0u);
}

// Preemption (launch/preemption.h, as `zeroshard train` sets it up after the engine): the first SIGTERM
// unlinks the file's name at once (the SIGKILL that may follow cannot be caught) and the process goes
// on to its step boundary; a second ends it through offload's handler.
TEST(SwapSpace, PreemptionUnlinksAtTheFirstSigtermAndTheSecondEnds) {
  TempDir dir;
  int up[2];
  ASSERT_EQ(::pipe(up), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(up[0]);
    SwapSpace s(dir.path(), 3, "optimizer", 8192, AioConfig{});
    launch::PreemptionWatch watch(&unlink_swap_files_now);
    char c = 'r';
    (void)!::write(up[1], &c, 1);
    while (watch.signal() == 0) ::usleep(1000);
    c = watch.signal() == SIGTERM ? 's' : 'x';
    (void)!::write(up[1], &c, 1);
    for (;;) ::pause();  // until the second signal
  }
  ::close(up[1]);
  char c = 0;
  ASSERT_EQ(::read(up[0], &c, 1), 1);
  EXPECT_EQ(files_in(dir.path()), 1u);
  ::kill(child, SIGTERM);
  ASSERT_EQ(::read(up[0], &c, 1), 1);
  EXPECT_EQ(c, 's') << "the watch saw SIGTERM";
  EXPECT_EQ(files_in(dir.path()), 0u) << "the first signal unlinks the swap file's name";
  int status = 0;
  EXPECT_EQ(::waitpid(child, &status, WNOHANG), 0) << "the first signal does not end the process";
  ::kill(child, SIGTERM);
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ::close(up[0]);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "the second ends it by the signal";
}

TEST(SwapSpace, MissingDirectory) {
  TempDir dir;
  const std::string missing = dir.path() + "/no/such/dir";
  const std::string m = io_error([&] { SwapSpace(missing, 0, "x", 4096, AioConfig{}); });
  EXPECT_HAS(m, "nvme_path '" + missing + "' does not exist");
  EXPECT_HAS(m, "mkdir -p");
  EXPECT_FALSE(fs::exists(missing));
}

TEST(SwapSpace, NotADirectory) {
  TempDir dir;
  const std::string file = dir.file("plain");
  std::ofstream(file) << "x";
  const std::string m = io_error([&] { SwapSpace(file, 0, "x", 4096, AioConfig{}); });
  EXPECT_HAS(m, "is not a directory");
  EXPECT_EQ(files_in(dir.path()), 1u);
}

// access(W_OK) says yes to root almost everywhere; the real create test must catch it.
TEST(SwapSpace, UnwritableDirectory) {
  if (::geteuid() != 0) {
    TempDir dir;
    ASSERT_EQ(::chmod(dir.path().c_str(), 0500), 0);
    const std::string m = io_error([&] { SwapSpace(dir.path(), 0, "x", 4096, AioConfig{}); });
    ::chmod(dir.path().c_str(), 0700);
    EXPECT_HAS(m, "is not writable");
    EXPECT_HAS(m, dir.path());
    return;
  }
  // Root: /proc is a directory where even root cannot create files, and access() passes.
  std::string m = io_error([&] { SwapSpace("/proc", 0, "x", 4096, AioConfig{}); });
  EXPECT_HAS(m, "nvme_path '/proc' is not writable");
  EXPECT_HAS(m, "creating '/proc/zeroshard-swap-r0-");
  // And a read-only mount, when this process may mount one.
  test::ScopedMount ro("tmpfs", "size=1m", MS_RDONLY);
  if (ro.ok()) {
    m = io_error([&] { SwapSpace(ro.path(), 0, "x", 4096, AioConfig{}); });
    EXPECT_HAS(m, "is not writable");
    EXPECT_HAS(m, "Read-only file system");
  }
}

TEST(SwapSpace, NotEnoughSpaceIsCaughtBeforeCreatingAnything) {
  TempDir dir;
  const size_t huge = size_t{1} << 62;
  const std::string m = io_error([&] { SwapSpace(dir.path(), 0, "huge", huge, AioConfig{}); });
  EXPECT_HAS(m, "nvme_path '" + dir.path() + "'");
  EXPECT_HAS(m, "free but the swap file");
  EXPECT_HAS(m, std::to_string(huge) + " bytes");
  EXPECT_HAS(m, "free space there");
  EXPECT_EQ(files_in(dir.path()), 0u);
}

TEST(SwapSpace, NotEnoughSpaceOnATinyTmpfs) {
  test::ScopedMount tiny("tmpfs", "size=1m");
  if (!tiny.ok()) GTEST_SKIP() << "cannot mount a tiny tmpfs here (" << tiny.why() << ")";
  {
    SwapSpace fits(tiny.path(), 0, "a", 512 << 10, AioConfig{});
    const std::string m = io_error([&] { SwapSpace(tiny.path(), 0, "b", 768 << 10, AioConfig{}); });
    EXPECT_HAS(m, "tmpfs file system");
    EXPECT_HAS(m, "786432 bytes");
    EXPECT_EQ(files_in(tiny.path()), 1u);
  }
  EXPECT_EQ(files_in(tiny.path()), 0u);
}

TEST(SwapSpace, BadNameIsAConfigError) {
  TempDir dir;
  EXPECT_THROW(SwapSpace(dir.path(), 0, "a/b", 4096, AioConfig{}), ConfigError);
  EXPECT_THROW(SwapSpace(dir.path(), 0, "", 4096, AioConfig{}), ConfigError);
  EXPECT_THROW(SwapSpace(dir.path(), -1, "x", 4096, AioConfig{}), ConfigError);
}

TEST(SwapSpace, SameNameTwiceNeverOverwrites) {
  TempDir dir;
  SwapSpace a(dir.path(), 0, "x", 4096, AioConfig{});
  const std::string m = io_error([&] { SwapSpace(dir.path(), 0, "x", 4096, AioConfig{}); });
  EXPECT_HAS(m, "never overwrites");
  EXPECT_TRUE(fs::exists(a.path())) << "the failed second space must not remove the first one's file";
}

TEST(SwapSpace, RegionsAreAlignedAndRoundTrip) {
  TempDir dir;
  const size_t sizes[] = {100, 8192, 5000};
  SwapSpace s(dir.path(), 0, "regions", SwapSpace::bytes_for(sizes), AioConfig{});
  EXPECT_EQ(s.capacity(), 4096u + 8192u + 8192u);
  SwapRegion r0 = s.allocate(100), r1 = s.allocate(8192), r2 = s.allocate(5000);
  EXPECT_EQ(r0.offset, 0u);
  EXPECT_EQ(r1.offset, 4096u);
  EXPECT_EQ(r2.offset, 12288u);
  EXPECT_EQ(r2.reserved_bytes(), 8192u);
  EXPECT_EQ(s.used(), s.capacity());
  EXPECT_THROW(s.allocate(1), OutOfMemoryError);

  AlignedBuffer a(8192), b(8192);
  const auto p = test::pattern(8192, 5);
  std::memcpy(a.data(), p.data(), 8192);
  s.write(r2, 4096, a.prefix(904));  // the last 904 bytes of a 5000-byte region
  s.write(r1, 0, a.prefix(8192));
  s.read(r1, 0, b.prefix(8192));
  EXPECT_EQ(std::memcmp(a.data(), b.data(), 8192), 0);
  s.read(r2, 4096, b.prefix(904));
  EXPECT_EQ(std::memcmp(a.data(), b.data(), 904), 0);
  EXPECT_THROW(s.write(r0, 0, a.prefix(8192)), InternalError) << "past the region's 4096 reserved bytes";
}

TEST(SwapSpace, WarnsAboutStaleFilesAndTouchesNothing) {
  TempDir dir;
  const long pid = test::dead_pid();
  ASSERT_GT(pid, 0);
  const std::string stale = dir.file("zeroshard-swap-r1-" + std::to_string(pid) + "-optimizer.bin");
  const std::string other = dir.file("my-data.bin");
  std::ofstream(stale) << "old";
  std::ofstream(other) << "keep";
  test::WarningCapture warnings;
  {
    SwapSpace s(dir.path(), 0, "optimizer", 4096, AioConfig{});
  }
  EXPECT_TRUE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(other));
  const auto w = warnings.warnings();
  ASSERT_EQ(w.size(), 1u);
  EXPECT_HAS(w[0], fs::path(stale).filename().string());
  EXPECT_HAS(w[0], "never deletes");
}

}  // namespace
}  // namespace zs::offload
