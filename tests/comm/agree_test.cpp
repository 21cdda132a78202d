// comm/agree.h: every rank ends a step with the same outcome, that of the lowest failing rank.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "comm/agree.h"
#include "comm/comm.h"
#include "tests/support/mpi_test_env.h"

using namespace zs;

namespace {

const comm::Group& everyone() { return test::world().group(); }

TEST(Agree, EveryRankSucceedsNothingIsThrown) {
  EXPECT_NO_THROW(comm::run_agreed(everyone(), [] {}));
  EXPECT_FALSE(comm::agree_outcome(everyone(), nullptr).has_value());
}

TEST(Agree, TheLowestFailingRanksErrorReachesEveryRankWithItsKind) {
  const int n = everyone().size(), me = everyone().rank();
  // The last rank and (when there are 3 or more) rank 1 fail; rank 1, the lowest, is the one reported.
  const int lowest = n >= 3 ? 1 : n - 1;
  auto fail_some = [&] {
    if (me == n - 1) throw IoError("disk gone on the last rank");
    if (n >= 3 && me == 1) throw ConfigError("bad key on rank 1, with a message longer than a word: x.y.z");
  };
  const std::string expected = lowest == n - 1 && !(n >= 3) ? "disk gone on the last rank"
                                                             : "bad key on rank 1, with a message longer than a word: x.y.z";
  try {
    comm::run_agreed(everyone(), fail_some);
    ADD_FAILURE() << "no rank threw";
  } catch (const ConfigError& e) {
    EXPECT_GE(n, 3);
    EXPECT_EQ(std::string(e.what()), "rank 1: " + expected);
  } catch (const IoError& e) {
    EXPECT_LT(n, 3);
    // A group of one rethrows its own exception unchanged (no rank prefix).
    EXPECT_EQ(std::string(e.what()), n == 1 ? expected : "rank " + std::to_string(lowest) + ": " + expected);
  }
}

TEST(Agree, OutcomeNamesTheRankKindAndMessageOnEveryRank) {
  const int n = everyone().size(), me = everyone().rank();
  std::exception_ptr local;
  if (me == n - 1) local = std::make_exception_ptr(std::filesystem::filesystem_error("no such file", std::error_code()));
  const auto f = comm::agree_outcome(everyone(), local);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->rank, n - 1);
  EXPECT_EQ(f->kind, comm::ErrorKind::kIo);  // filesystem errors are I/O errors
  EXPECT_NE(f->message.find("no such file"), std::string::npos) << f->message;
}

TEST(Agree, OtherErrorsBecomeTheCallersType) {
  const int n = everyone().size(), me = everyone().rank();
  auto fail = [&] {
    if (me == 0) throw std::runtime_error("plain failure");
  };
  if (n == 1) {
    EXPECT_THROW(comm::run_agreed<CheckpointError>(everyone(), fail), std::runtime_error);
  } else {
    EXPECT_THROW(comm::run_agreed<CheckpointError>(everyone(), fail), CheckpointError);
  }
}

}  // namespace
