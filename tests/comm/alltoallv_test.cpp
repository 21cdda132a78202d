// Group::alltoallv: uneven and zero counts (a rank sending nothing, a rank receiving everything),
// dtypes, the async form, byte counters and op stats, and mismatched counts as a CommError on every
// rank with the group still usable afterwards.
#include <gtest/gtest.h>

#include <numeric>

#include "comm/group.h"
#include "core/errors.h"
#include "tests/comm/test_util.h"
#include "tests/support/mpi_test_env.h"

namespace zs::comm {
namespace {

using memory::DType;
using memory::Tensor;

const Group& group() { return test::world().group(); }

// Runs alltoallv where rank i sends count(i, j) elements to rank j and checks every received element.
void exchange(DType dtype, const std::function<size_t(int, int)>& count, bool async) {
  const Group& g = group();
  const int n = g.size(), me = g.rank();
  std::vector<size_t> send, recv;
  for (int j = 0; j < n; ++j) send.push_back(count(me, j));
  for (int i = 0; i < n; ++i) recv.push_back(count(i, me));
  const size_t send_total = std::accumulate(send.begin(), send.end(), size_t{0});
  const size_t recv_total = std::accumulate(recv.begin(), recv.end(), size_t{0});
  Tensor in = test::filled(dtype, send_total, me);
  Tensor out = Tensor::empty({static_cast<int64_t>(recv_total)}, dtype);
  const CommCounters before = g.counters();
  if (async) {
    g.alltoallv_async(in, send, out, recv).wait();
  } else {
    g.alltoallv(in, send, out, recv);
  }
  const CommCounters after = g.counters();
  if (n > 1) {
    EXPECT_EQ(after.bytes_sent - before.bytes_sent, (send_total - send[static_cast<size_t>(me)]) * memory::dtype_size(dtype));
    EXPECT_EQ(after.bytes_received - before.bytes_received, (recv_total - recv[static_cast<size_t>(me)]) * memory::dtype_size(dtype));
  }
  size_t pos = 0;
  for (int i = 0; i < n; ++i) {
    size_t src_offset = 0;
    for (int j = 0; j < me; ++j) src_offset += count(i, j);
    for (size_t k = 0; k < count(i, me); ++k, ++pos)
      ASSERT_EQ(test::as_float(out, pos), test::stored(dtype, i, src_offset + k)) << "from rank " << i << " element " << k;
  }
}

TEST(Alltoallv, UnevenAndZeroCounts) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kI32}) {
    exchange(t, [](int i, int j) { return static_cast<size_t>((i * 3 + j * 5) % 4); }, false);
    exchange(t, [](int i, int j) { return static_cast<size_t>(i == 1 ? 0 : 7 + j); }, true);  // rank 1 sends nothing
  }
}

TEST(Alltoallv, EverythingToOneRankAndNothingAtAll) {
  exchange(DType::kF32, [](int, int j) { return static_cast<size_t>(j == 0 ? 1000 : 0); }, false);
  exchange(DType::kF32, [](int, int) { return size_t{0}; }, false);
}

TEST(Alltoallv, CountedInOpStats) {
  auto count_of = [] {
    for (const OpStats& s : group().op_stats())
      if (s.name == "alltoallv") return s.count;
    return uint64_t{0};
  };
  const uint64_t before = count_of();
  exchange(DType::kF32, [](int, int) { return size_t{3}; }, false);
  EXPECT_EQ(count_of(), before + 1);
}

TEST(Alltoallv, MismatchedCountsFailOnEveryRank) {
  const Group& g = group();
  if (g.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int n = g.size(), me = g.rank();
  // Rank 0 sends 4 elements to rank 1, which expects 3; everything else agrees.
  std::vector<size_t> send(static_cast<size_t>(n), 2), recv(static_cast<size_t>(n), 2);
  if (me == 0) send[1] = 4;
  if (me == 1) recv[0] = 3;
  Tensor in = Tensor::empty({static_cast<int64_t>(std::accumulate(send.begin(), send.end(), size_t{0}))}, DType::kF32);
  Tensor out = Tensor::empty({static_cast<int64_t>(std::accumulate(recv.begin(), recv.end(), size_t{0}))}, DType::kF32);
  try {
    g.alltoallv(in, send, out, recv);
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 sends 4 elements to rank 1, which expects 3"), std::string::npos)
        << e.what();
  }
  // No data moved and no rank was left behind: the group still works.
  exchange(DType::kF32, [](int i, int j) { return static_cast<size_t>(i + j); }, false);
}

// exchange_counts: counts carried by the handshake (w per pair), and the fallback past its size limit
// (1024 values per rank); then an alltoallv with those counts, with no handshake of its own right after
// them and with one when another collective ran in between.
TEST(Alltoallv, ExchangeCountsThenExchangedAlltoallv) {
  const Group& g = group();
  const int n = g.size(), me = g.rank();
  for (size_t w : {size_t{1}, size_t{3}, size_t{700}}) {
    std::vector<int64_t> send(static_cast<size_t>(n) * w), recv(send.size(), -1);
    for (int j = 0; j < n; ++j)
      for (size_t c = 0; c < w; ++c) send[static_cast<size_t>(j) * w + c] = (me * 7 + j * 3 + static_cast<int64_t>(c)) % 5;
    g.exchange_counts(send, recv);
    for (int i = 0; i < n; ++i)
      for (size_t c = 0; c < w; ++c)
        ASSERT_EQ(recv[static_cast<size_t>(i) * w + c], (i * 7 + me * 3 + static_cast<int64_t>(c)) % 5)
            << "w " << w << " from rank " << i << " value " << c;
  }
  for (bool in_between : {false, true}) {
    std::vector<int64_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) send[static_cast<size_t>(j)] = (me + 2 * j) % 3 + (in_between ? 1 : 0);
    g.exchange_counts(send, recv);
    if (in_between) g.barrier();
    std::vector<size_t> sc(send.begin(), send.end()), rc(recv.begin(), recv.end());
    Tensor in = test::filled(DType::kF32, std::accumulate(sc.begin(), sc.end(), size_t{0}), me);
    Tensor out = Tensor::empty({std::accumulate(recv.begin(), recv.end(), int64_t{0})}, DType::kF32);
    g.alltoallv(in, sc, out, rc, Group::CountCheck::kExchanged);
    size_t pos = 0;
    for (int i = 0; i < n; ++i) {
      size_t src_offset = 0;
      for (int j = 0; j < me; ++j) src_offset += static_cast<size_t>((i + 2 * j) % 3 + (in_between ? 1 : 0));
      for (size_t k = 0; k < rc[static_cast<size_t>(i)]; ++k, ++pos)
        ASSERT_EQ(test::as_float(out, pos), test::stored(DType::kF32, i, src_offset + k)) << "from rank " << i;
    }
  }
}

}  // namespace
}  // namespace zs::comm
