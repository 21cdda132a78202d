// checkpoint_save_driver ROOT TAG [--ranks N] [--scale S] [--keep-last K] [--zstd] [--no-checksum]
//
// One save through the real storage path from several processes, the way the engine's ranks save:
// the coordinator (this process) calls begin_save, forks N writer processes that each stream their
// rank file through ShardWriter (synthetic.h), waits for every one of them, and only if all
// succeeded writes the metadata and commits. A writer that dies (SIGKILL from the crash harness)
// makes the coordinator exit 1 without committing; writers die with the coordinator
// (PR_SET_PDEATHSIG), as MPI ranks die with their launcher. The crash harness
// (tests/checkpoint/crash_harness.py) kills this command at random points; `zeroshard train --save`
// can stand in for it.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "core/errors.h"
#include "tests/checkpoint/synthetic.h"

namespace {

int usage() {
  std::fprintf(stderr, "usage: checkpoint_save_driver ROOT TAG [--ranks N] [--scale S] [--keep-last K] [--zstd] [--no-checksum]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 3) return usage();
  const std::filesystem::path root = argv[1];
  const std::string tag = argv[2];
  int ranks = 4, keep_last = 0;
  uint64_t scale = 200;
  zs::checkpoint::WriteOptions options;
  for (int i = 3; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> long {
      if (i + 1 >= argc) throw zs::UsageError(a + " needs a value");
      return std::stol(argv[++i]);
    };
    if (a == "--ranks") ranks = static_cast<int>(value());
    else if (a == "--scale") scale = static_cast<uint64_t>(value());
    else if (a == "--keep-last") keep_last = static_cast<int>(value());
    else if (a == "--zstd") options.compression = zs::checkpoint::Compression::kZstd;
    else if (a == "--no-checksum") options.checksum = false;
    else return usage();
  }
  // The step is the tag's trailing number (global_step12 -> 12), so `inspect` shows it.
  int64_t step = 0;
  size_t digits = tag.find_last_not_of("0123456789");
  if (digits + 1 < tag.size()) step = std::stoll(tag.substr(digits + 1));
  auto meta = zs::test::synthetic_metadata(ranks, tag, step, scale);

  auto dir = zs::checkpoint::begin_save(root, tag);
  std::vector<pid_t> writers;
  const pid_t coordinator = ::getpid();
  for (int r = 0; r < ranks; ++r) {
    pid_t pid = ::fork();
    if (pid < 0) throw zs::IoError("fork failed");
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != coordinator) ::_exit(1);  // the coordinator died before prctl
      try {
        zs::test::write_synthetic_rank(dir, meta, r, options, 4099);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "checkpoint_save_driver: rank %d: %s\n", r, e.what());
        ::_exit(1);
      }
      ::_exit(0);
    }
    writers.push_back(pid);
  }
  bool ok = true;
  for (size_t r = 0; r < writers.size(); ++r) {
    int status = 0;
    ::waitpid(writers[r], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "checkpoint_save_driver: rank %zu writer failed (%s %d): not committing\n", r,
                   WIFSIGNALED(status) ? "signal" : "exit", WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
      ok = false;
    }
  }
  if (!ok) return 1;
  zs::checkpoint::write_metadata(dir, meta);
  zs::checkpoint::commit_save(root, tag, keep_last);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "checkpoint_save_driver: %s\n", e.what());
  return 1;
}
