// launch::set_blas_threads: the CPUs a rank's compute threads get (Note [rank CPU share] in
// launch/launch.cpp), seen through this test's own affinity mask as a launcher would set it.
#include <sched.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

#include "launch/launch.h"

extern "C" int openblas_get_num_threads(void);

namespace {

// Each test may narrow this thread's affinity and unset OPENBLAS_NUM_THREADS (ctest sets it to 1);
// both come back when it ends.
class LaunchThreads : public ::testing::Test {
 protected:
  void SetUp() override {
    CPU_ZERO(&mask_);
    ASSERT_EQ(::sched_getaffinity(0, sizeof mask_, &mask_), 0);
    if (const char* v = std::getenv("OPENBLAS_NUM_THREADS")) saved_env_ = v;
    ::unsetenv("OPENBLAS_NUM_THREADS");
  }
  void TearDown() override {
    ::sched_setaffinity(0, sizeof mask_, &mask_);
    if (saved_env_) ::setenv("OPENBLAS_NUM_THREADS", saved_env_->c_str(), 1);
  }
  static int online() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

  cpu_set_t mask_;
  std::optional<std::string> saved_env_;
};

TEST_F(LaunchThreads, AllowedCpusAreTheAffinityMaskInOrder) {
  const std::vector<int> cpus = zs::launch::allowed_cpus();
  ASSERT_EQ(static_cast<int>(cpus.size()), CPU_COUNT(&mask_));
  EXPECT_TRUE(std::is_sorted(cpus.begin(), cpus.end()));
  for (int c : cpus) EXPECT_TRUE(CPU_ISSET(c, &mask_)) << c;
}

TEST_F(LaunchThreads, UnboundRanksShareTheNodesCpus) {
  const int n = static_cast<int>(zs::launch::allowed_cpus().size());
  if (n < online()) GTEST_SKIP() << "this process is bound to " << n << " of " << online() << " CPUs";
  EXPECT_EQ(zs::launch::set_blas_threads(1), n);
  EXPECT_EQ(openblas_get_num_threads(), n);
  EXPECT_EQ(zs::launch::set_blas_threads(2), std::max(1, n / 2));
  EXPECT_EQ(zs::launch::set_blas_threads(4 * n), 1);
}

// `mpirun -np 1` binds its one rank to one core: it gets one thread there, not one per core of the
// node on a single core.
TEST_F(LaunchThreads, ABoundRankUsesTheCpusItWasGiven) {
  const std::vector<int> cpus = zs::launch::allowed_cpus();
  if (online() < 2 || cpus.size() < 2) GTEST_SKIP() << "needs 2 CPUs to bind to 1";
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpus[0], &one);
  ASSERT_EQ(::sched_setaffinity(0, sizeof one, &one), 0);
  EXPECT_EQ(zs::launch::set_blas_threads(1), 1);
  EXPECT_EQ(openblas_get_num_threads(), 1);
  EXPECT_EQ(zs::launch::set_blas_threads(2), 1);

  cpu_set_t two;  // bound to 2 CPUs of a larger node, or to both of a 2-CPU one (then unbound)
  CPU_ZERO(&two);
  CPU_SET(cpus[0], &two);
  CPU_SET(cpus[1], &two);
  ASSERT_EQ(::sched_setaffinity(0, sizeof two, &two), 0);
  EXPECT_EQ(zs::launch::set_blas_threads(1), 2);
}

TEST_F(LaunchThreads, TheUsersOpenblasNumThreadsWins) {
  ::setenv("OPENBLAS_NUM_THREADS", "3", 1);
  EXPECT_EQ(zs::launch::set_blas_threads(1), 3);
  EXPECT_EQ(zs::launch::set_blas_threads(8), 3);
}

}  // namespace
