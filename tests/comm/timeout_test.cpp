// Timeouts and mismatches raise CommError naming the collective, the group, the sizes and the rank,
// instead of hanging. Uses the pair {0, 1} (other ranks sit out), so it needs np >= 2.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "tests/support/mpi_test_env.h"

using namespace zs;
using memory::DType;
using memory::Tensor;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The pair {0, 1} with a 1 s timeout; other ranks get a group of themselves they do not use.
comm::Group pair(const char* name) {
  const auto& g = test::world().group();
  comm::Group p = g.split(g.rank() < 2 ? 0 : 1 + g.rank(), g.rank(), name);
  return p.dup(name, comm::CommConfig{.timeout_s = 1.0});
}

TEST(Timeout, LateRankGivesCommErrorNamingCollective) {
  if (test::world().size() < 2) GTEST_SKIP() << "needs two ranks";
  comm::Group p = pair("slowpair");
  const int world_rank = test::world().rank();
  Tensor x = Tensor::empty({1234}, DType::kF32);
  if (world_rank == 0) {
    try {
      p.allreduce(x);
      FAIL() << "expected a timeout";
    } catch (const CommError& e) {
      const std::string m = e.what();
      EXPECT_TRUE(contains(m, "allreduce")) << m;
      EXPECT_TRUE(contains(m, "timed out")) << m;
      EXPECT_TRUE(contains(m, "group 'slowpair'")) << m;
      EXPECT_TRUE(contains(m, "1234 elements")) << m;
      EXPECT_TRUE(contains(m, "rank 0 of 2")) << m;
    }
    // The group is unusable afterwards, and says so at once.
    try {
      p.barrier();
      FAIL() << "expected CommError";
    } catch (const CommError& e) {
      EXPECT_TRUE(contains(e.what(), "unusable")) << e.what();
    }
  } else if (world_rank == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    // Arriving late with a different collective completes rank 0's abandoned handshake: a mismatch.
    try {
      p.barrier();
      FAIL() << "expected a mismatch";
    } catch (const CommError& e) {
      EXPECT_TRUE(contains(e.what(), "mismatched collectives")) << e.what();
      EXPECT_TRUE(contains(e.what(), "allreduce")) << e.what();
    }
  }
  test::world().group().barrier();
}

TEST(Timeout, AsyncTimeoutSurfacesOnWait) {
  if (test::world().size() < 2) GTEST_SKIP() << "needs two ranks";
  comm::Group p = pair("slowasync");
  const int world_rank = test::world().rank();
  Tensor x = Tensor::empty({64}, DType::kBF16);
  if (world_rank == 0) {
    comm::Work w = p.allreduce_async(x);
    try {
      w.wait();
      FAIL() << "expected a timeout";
    } catch (const CommError& e) {
      EXPECT_TRUE(contains(e.what(), "allreduce(bf16, 64 elements")) << e.what();
    }
  } else if (world_rank == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    EXPECT_THROW(p.barrier_async().wait(), CommError);
  }
  test::world().group().barrier();
}

TEST(Mismatch, DifferentCollectivesOrSizesThrowOnBothRanks) {
  if (test::world().size() < 2) GTEST_SKIP() << "needs two ranks";
  comm::Group p = pair("mismatch");
  const int world_rank = test::world().rank();
  if (world_rank < 2) {
    Tensor x = Tensor::empty({100}, DType::kF32);
    Tensor all = Tensor::empty({200}, DType::kF32);
    try {
      if (world_rank == 0) p.allreduce(x); else p.allgather(x, all);
      FAIL() << "expected a mismatch";
    } catch (const CommError& e) {
      EXPECT_TRUE(contains(e.what(), "allreduce") && contains(e.what(), "allgather")) << e.what();
    }
    Tensor y = Tensor::empty({world_rank == 0 ? 10 : 11}, DType::kF32);
    try {
      p.allreduce(y);
      FAIL() << "expected a size mismatch";
    } catch (const CommError& e) {
      EXPECT_TRUE(contains(e.what(), "mismatched size")) << e.what();
    }
    p.barrier();  // the group is still usable after a detected mismatch
  }
  test::world().group().barrier();
}

// Note [Prompt mismatches]: mismatched calls fail at once on both ranks, not after comm.timeout_s. Each
// case gives the pair fresh groups with a 30 s timeout and expects a CommError naming the mismatch on
// both ranks within kPrompt. `call(groups, rank)` makes rank 0 and rank 1 call different things.
constexpr double kPrompt = 5.0;
using Call = std::function<void(std::vector<comm::Group>&, int)>;

void expect_prompt_mismatch(const char* what, int n_groups, const Call& call,
                            const std::vector<std::vector<std::string>>& parts_by_rank) {
  const auto& world = test::world().group();
  std::vector<comm::Group> groups;
  const char* names[] = {"A0", "B1"};
  for (int i = 0; i < n_groups; ++i) {
    comm::Group p = world.split(world.rank() < 2 ? 0 : 1 + world.rank(), world.rank(), "pair");
    groups.push_back(p.dup(names[i], comm::CommConfig{.timeout_s = 30.0}));
  }
  const int r = world.rank();
  if (r < 2) {
    const auto start = std::chrono::steady_clock::now();
    try {
      call(groups, r);
      ADD_FAILURE() << what << ": rank " << r << " expected a CommError";
    } catch (const CommError& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const std::string m = e.what();
      EXPECT_LT(s, kPrompt) << what << ": rank " << r << " took " << s << " s: " << m;
      EXPECT_TRUE(contains(m, "mismatch")) << what << ": " << m;
      for (const std::string& part : parts_by_rank[static_cast<size_t>(r)]) {
        EXPECT_TRUE(contains(m, part)) << what << ": rank " << r << " expected '" << part << "' in: " << m;
      }
    }
  }
  world.barrier();
}

Tensor ints(int64_t n) { return Tensor::empty({n}, DType::kI32); }

TEST(Mismatch, SameGroupShapesFailPromptlyOnBothRanks) {
  if (test::world().size() < 2) GTEST_SKIP() << "needs two ranks";
  // The case seen in a real run's shape: an allgather of 1 int32 against one of 8.
  expect_prompt_mismatch("allgather 1 vs 8", 1, [](auto& g, int r) {
    const int64_t n = r == 0 ? 1 : 8;
    Tensor out = ints(2 * n);
    g[0].allgather(ints(n), out);
  }, {{"allgather(int32, 1 elements per rank)", "8"}, {"allgather(int32, 8 elements per rank)", "1"}});
  expect_prompt_mismatch("allreduce count", 1, [](auto& g, int r) { g[0].allreduce(ints(r == 0 ? 10 : 11)); },
                         {{"10 elements", "11"}, {"11 elements", "10"}});
  expect_prompt_mismatch("allgather vs allreduce", 1, [](auto& g, int r) {
    Tensor out = ints(2);
    if (r == 0) g[0].allgather(ints(1), out); else g[0].allreduce(ints(1));
  }, {{"allgather", "allreduce"}, {"allgather", "allreduce"}});
  expect_prompt_mismatch("dtype", 1, [](auto& g, int r) {
    g[0].allreduce(Tensor::empty({64}, r == 0 ? DType::kF32 : DType::kBF16));
  }, {{"fp32", "bf16"}, {"bf16", "fp32"}});
  expect_prompt_mismatch("broadcast root", 1, [](auto& g, int r) { g[0].broadcast(ints(4), r); },
                         {{"root 0", "root"}, {"root 1", "root"}});
  // A large allreduce goes the shared-memory (or MPI) path after the handshake, a small one the same
  // handshake: the mismatch is found before either body runs.
  expect_prompt_mismatch("small vs large", 1, [](auto& g, int r) {
    g[0].allreduce(Tensor::empty({r == 0 ? 8 : (1 << 20)}, DType::kF32));
  }, {{"8 elements", "1048576"}, {"1048576 elements", "8"}});
}

// The one-bit allreduce (comm/compressed_allreduce.h) runs Group collectives: built for different sizes
// on the two ranks, its first all-to-all is a mismatch like any other.
TEST(Mismatch, CompressedAllreduceSizesFailPromptly) {
  if (test::world().size() < 2) GTEST_SKIP() << "needs two ranks";
  expect_prompt_mismatch("one-bit allreduce 4096 vs 8192", 1, [](auto& g, int r) {
    const size_t n = r == 0 ? 4096 : 8192;
    comm::OneBitAllreduce onebit(g[0], n);
    std::vector<float> data(n, 1.0f);
    onebit.allreduce(data);
  }, {{"alltoall", "mismatched size"}, {"alltoall", "mismatched size"}});
}

// Counts carried inside the handshake (Note [Counts in the handshake]) make its messages longer than a
// plain handshake's: a rank expecting a plain one must not fail on the length alone.
TEST(Mismatch, HandshakeCarriedCountsAgainstOtherCollectives) {
  if (test::world().size() < 2) GTEST_SKIP() << "needs two ranks";
  expect_prompt_mismatch("exchange_counts vs allgather", 1, [](auto& g, int r) {
    if (r == 0) {
      std::vector<int64_t> send(2, 1), recv(2);
      g[0].exchange_counts(send, recv);
    } else {
      Tensor out = ints(16);
      g[0].allgather(ints(8), out);
    }
  }, {{"alltoall(counts", "allgather"}, {"allgather(int32, 8 elements", "alltoall"}});
  expect_prompt_mismatch("exchange_counts widths", 1, [](auto& g, int r) {
    const size_t w = r == 0 ? 1 : 6;
    std::vector<int64_t> send(2 * w, 1), recv(2 * w);
    g[0].exchange_counts(send, recv);
  }, {{"1 int64 per rank", "6"}, {"6 int64 per rank", "1"}});
  // Large enough for MPI's rendezvous protocol (over 4 KiB): the longer message is still read whole.
  expect_prompt_mismatch("exchange_counts of 1024 values vs allgather", 1, [](auto& g, int r) {
    if (r == 0) {
      std::vector<int64_t> send(1024, 1), recv(1024);
      g[0].exchange_counts(send, recv);
    } else {
      Tensor out = ints(16);
      g[0].allgather(ints(8), out);
    }
  }, {{"alltoall(counts, 512 int64 per rank)", "allgather"}, {"allgather(int32, 8 elements", "alltoall"}});
  // Past kMaxGathered values the counts travel by MPI_Alltoall instead: a much larger handshake
  // message on one side only.
  expect_prompt_mismatch("exchange_counts in handshake vs not", 1, [](auto& g, int r) {
    const size_t w = r == 0 ? 4 : 4096;
    std::vector<int64_t> send(2 * w, 1), recv(2 * w);
    g[0].exchange_counts(send, recv);
  }, {{"4 int64 per rank", "4096"}, {"4096 int64 per rank", "4"}});
}

// Note [Prompt mismatches], every pair of kinds and sizes seen in a real run's shape: rank 0 fails and
// enters the caller's error agreement (a small collective) while the others are in the collective
// that rank 0 never reached (e2e_bad_alloc_trace_unwritable: the alloc_trace comment in
// engine/engine.cpp). Over the whole world, so that at 3 and 4 ranks the ranks that agree with each
// other still learn of rank 0's mismatch at once; every rank must throw within kPrompt.
using WorldCall = std::function<void(const comm::Group&, bool rank0)>;

void expect_world_mismatch(const char* what, const WorldCall& call, const std::vector<std::string>& parts) {
  const auto& world = test::world().group();
  comm::Group g = world.dup("agree", comm::CommConfig{.timeout_s = 30.0});
  const auto start = std::chrono::steady_clock::now();
  try {
    call(g, world.rank() == 0);
    ADD_FAILURE() << what << ": rank " << world.rank() << " expected a CommError";
  } catch (const CommError& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string m = e.what();
    EXPECT_LT(s, kPrompt) << what << ": rank " << world.rank() << " took " << s << " s: " << m;
    EXPECT_TRUE(contains(m, "mismatch")) << what << ": " << m;
    EXPECT_TRUE(contains(m, "group 'agree'")) << what << ": " << m;
    for (const std::string& part : parts) EXPECT_TRUE(contains(m, part)) << what << ": '" << part << "' in: " << m;
  }
  world.barrier();
}

TEST(Mismatch, DifferentCollectivesOnOneGroupFailPromptlyOnEveryRank) {
  if (test::world().size() < 2) GTEST_SKIP() << "needs two ranks";
  const int n = test::world().size();
  // Counts carried in the handshake (its own tags: Note [Handshake lengths]) against a plain allreduce.
  expect_world_mismatch("exchange_counts vs allreduce", [n](const comm::Group& g, bool rank0) {
    if (rank0) {
      std::vector<int64_t> send(static_cast<size_t>(n), 1), recv(static_cast<size_t>(n));
      g.exchange_counts(send, recv);
    } else {
      g.allreduce(ints(1));
    }
  }, {"allreduce"});
  expect_world_mismatch("exchange_counts vs large allreduce", [n](const comm::Group& g, bool rank0) {
    if (rank0) {
      std::vector<int64_t> send(static_cast<size_t>(n) * 4, 1), recv(static_cast<size_t>(n) * 4);
      g.exchange_counts(send, recv);
    } else {
      g.allreduce(Tensor::empty({1 << 18}, DType::kF32));
    }
  }, {"allreduce"});
  expect_world_mismatch("allgather 1 vs allreduce 1000", [n](const comm::Group& g, bool rank0) {
    Tensor out = ints(n);
    if (rank0) g.allgather(ints(1), out); else g.allreduce(ints(1000));
  }, {"allgather", "allreduce"});
  expect_world_mismatch("alltoallv vs allreduce", [n](const comm::Group& g, bool rank0) {
    if (rank0) {
      std::vector<size_t> counts(static_cast<size_t>(n), 2);
      g.alltoallv(ints(2 * n), counts, ints(2 * n), counts);
    } else {
      g.allreduce(ints(2 * n));
    }
  }, {"alltoallv", "allreduce"});
  expect_world_mismatch("reduce_scatter vs allgatherv", [n](const comm::Group& g, bool rank0) {
    std::vector<size_t> counts(static_cast<size_t>(n), 3);
    if (rank0) g.reduce_scatter(ints(3 * n), ints(3), counts); else g.allgatherv(ints(3), ints(3 * n), counts);
  }, {"reduce_scatter", "allgatherv"});
  expect_world_mismatch("reduce_scatter counts", [n](const comm::Group& g, bool rank0) {
    std::vector<size_t> counts(static_cast<size_t>(n), 3);
    counts[0] = rank0 ? 3 : 4;
    size_t total = 0;
    for (size_t c : counts) total += c;
    g.reduce_scatter(ints(static_cast<int64_t>(total)), ints(static_cast<int64_t>(counts[static_cast<size_t>(g.rank())])), counts);
  }, {"mismatched size", "a hash of the counts"});
  expect_world_mismatch("broadcast vs barrier", [](const comm::Group& g, bool rank0) {
    if (rank0) g.broadcast(ints(4), 0); else g.barrier();
  }, {"broadcast", "barrier"});
  expect_world_mismatch("async allreduce vs allgather", [n](const comm::Group& g, bool rank0) {
    Tensor out = ints(8 * n);
    if (rank0) g.allreduce_async(ints(8)).wait(); else g.allgather(ints(8), out);
  }, {"allreduce", "allgather"});
}

// The hang seen for real: rank 0 in an allgather on one group (the command's error agreement, on the
// world) while rank 1 is in an allgather on another group of the same ranks (a registration step on
// 'dp'). Neither handshake can finish - each waits for a rank that waits for it - so both ranks must
// say so at once, naming both sides, instead of waiting for comm.timeout_s.
TEST(Mismatch, DifferentGroupsOfTheSameRanksFailPromptly) {
  if (test::world().size() < 2) GTEST_SKIP() << "needs two ranks";
  expect_prompt_mismatch("allgather on A vs allgather on B", 2, [](auto& g, int r) {
    const int64_t n = r == 0 ? 1 : 8;
    Tensor out = ints(2 * n);
    g[r].allgather(ints(n), out);
  }, {{"allgather(int32, 1 elements per rank) on group 'A0'", "allgather(int32, 8 elements per rank) on group 'B1'"},
      {"allgather(int32, 8 elements per rank) on group 'B1'", "allgather(int32, 1 elements per rank) on group 'A0'"}});
  // Async on one side: the comm worker is the one waiting; the error surfaces on wait().
  expect_prompt_mismatch("async allreduce on A vs barrier on B", 2, [](auto& g, int r) {
    if (r == 0) g[0].allreduce_async(ints(3)).wait(); else g[1].barrier();
  }, {{"allreduce(int32, 3 elements", "barrier"}, {"barrier", "allreduce(int32, 3 elements"}});
}

}  // namespace
