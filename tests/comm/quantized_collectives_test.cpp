// ZeRO++'s quantised collectives (comm/quantized_collectives.h) at np 2-4: the allgather gives every
// rank the same values, each within the int8 bound of the true piece; the hierarchical
// reduce-scatter (Note [Hierarchical quantised reduce-scatter]) with one level and with hosts of 2
// ranks is within the two quantisations' bound of the exact average, exact for values the blocks
// carry exactly, and sends the int8 bytes it says. Every rank builds every rank's input from seeds.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "comm/comm.h"
#include "tests/support/mpi_test_env.h"

using namespace zs;
using memory::DType;
using memory::Tensor;

namespace {

const comm::Group& group() { return test::world().group(); }

std::vector<float> input(size_t n, int rank, uint64_t seed) {
  std::mt19937_64 rng(seed * 7919 + static_cast<uint64_t>(rank) * 104729 + 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = normal(rng) * (i < n / 2 ? 1e-3f : 2.0f);
  return v;
}

std::vector<size_t> uneven_counts(size_t total, int ranks) {
  std::vector<size_t> c(static_cast<size_t>(ranks));
  size_t left = total;
  for (int r = 0; r < ranks; ++r) {
    c[static_cast<size_t>(r)] = r + 1 == ranks ? left : std::min(left, total / static_cast<size_t>(ranks) + static_cast<size_t>(r) * 37);
    left -= c[static_cast<size_t>(r)];
  }
  return c;
}

Tensor copy_of(const std::vector<float>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kF32);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

// The largest |x| over the block of kQuantBlock elements that holds element i of a piece starting at `start`.
double block_absmax(const std::vector<float>& x, size_t start, size_t n, size_t i) {
  const size_t b = start + (i - start) / comm::kQuantBlock * comm::kQuantBlock;
  double m = 0;
  for (size_t k = b; k < std::min(b + comm::kQuantBlock, start + n); ++k) m = std::max(m, std::fabs(static_cast<double>(x[k])));
  return m;
}

TEST(QuantizedAllgather, EveryRankGetsEveryPieceWithinTheBound) {
  const int N = group().size(), me = group().rank();
  const size_t total = 3001;
  const auto counts = uneven_counts(total, N);
  const std::vector<float> full = input(total, 0, 5);  // rank r holds its piece of it
  const size_t mine_at = std::accumulate(counts.begin(), counts.begin() + me, size_t{0});
  Tensor in = copy_of(std::vector<float>(full.begin() + static_cast<long>(mine_at), full.begin() + static_cast<long>(mine_at + counts[static_cast<size_t>(me)])));
  Tensor out = Tensor::empty({static_cast<int64_t>(total)}, DType::kF32);
  comm::QuantizedAllgather gather(group(), counts);
  std::vector<int32_t> scratch(gather.scratch_bytes() / 4);
  const uint64_t sent = gather.run(in, out, scratch.data(), true);
  size_t start = 0;
  for (int r = 0; r < N; ++r) {
    const size_t n = counts[static_cast<size_t>(r)];
    for (size_t i = start; i < start + n; ++i) {
      const double step = block_absmax(full, start, n, i) / 127.0;
      EXPECT_LE(std::fabs(out.data<float>()[i] - full[i]), step * 0.5 + step * 1e-4) << "rank " << r << " element " << i;
    }
    start += n;
  }
  // Every rank holds the same bits: compare a checksum over the group.
  Tensor sum = copy_of({static_cast<float>(std::accumulate(out.data<float>(), out.data<float>() + total, 0.0))});
  Tensor all = Tensor::empty({N}, DType::kF32);
  group().allgather(sum, all);
  for (int r = 0; r < N; ++r) EXPECT_EQ(all.data<float>()[r], sum.data<float>()[0]);
  if (N > 1) {
    // A ring allgatherv sends each piece to N-1 ranks: int8 words instead of fp32 elements.
    EXPECT_LT(sent, static_cast<uint64_t>(total) * 4 / 3) << "int8 blocks on the wire, not fp32";
  }
}

void check_reduce_scatter(int hosts_size, DType dtype) {
  const int N = group().size(), me = group().rank();
  ASSERT_EQ(N % hosts_size, 0);
  comm::Group inner = group().split(me / hosts_size, me, "host");
  comm::Group outer = group().split(me % hosts_size, me, "across");
  const size_t total = 2 * 1024 + 77;
  const auto counts = uneven_counts(total, N);
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < N; ++r) inputs.push_back(input(total, r, 11));
  Tensor in = Tensor::empty({static_cast<int64_t>(total)}, dtype);
  memory::convert(inputs[static_cast<size_t>(me)].data(), DType::kF32, in.raw(), dtype, total);
  const size_t at = std::accumulate(counts.begin(), counts.begin() + me, size_t{0});
  const size_t n = counts[static_cast<size_t>(me)];
  Tensor out = Tensor::empty({static_cast<int64_t>(n)}, dtype);
  comm::QuantizedReduceScatter reduce(inner, outer.size() > 1 ? &outer : nullptr, counts);
  std::vector<int32_t> scratch(reduce.scratch_bytes() / 4 + 1);
  reduce.run(in, out, comm::ReduceOp::kAverage, scratch.data(), true);
  std::vector<float> got(n);
  memory::convert(out.raw(), dtype, got.data(), DType::kF32, n);
  // Bound: each input's quantisation (half a step of its block) plus, with hosts, the host sums'.
  for (size_t k = 0; k < n; ++k) {
    double exact = 0, bound = 0;
    for (int r = 0; r < N; ++r) {
      std::vector<float> x = inputs[static_cast<size_t>(r)];
      if (dtype != DType::kF32) memory::convert(x.data(), DType::kF32, x.data(), DType::kF32, x.size());
      exact += x[at + k];
      bound += 0.5 * block_absmax(x, at, n, at + k) / 127.0;  // a piece's blocks start at the piece
    }
    if (outer.size() > 1) bound *= 2;  // the partial sums' blocks are bounded by the inputs' sum
    bound = bound / N + (dtype == DType::kF32 ? 1e-6 : 1e-2) * (std::fabs(exact / N) + 1e-3);
    EXPECT_LE(std::fabs(got[k] - exact / N), bound) << "element " << at + k << " hosts of " << hosts_size;
  }
}

TEST(QuantizedReduceScatter, OneLevelWithinTheBound) { check_reduce_scatter(group().size(), DType::kF32); }

TEST(QuantizedReduceScatter, HostsOfTwoWithinTheBound) {
  if (group().size() % 2 != 0) GTEST_SKIP() << "hosts of 2 need an even world";
  check_reduce_scatter(2, DType::kF32);
  check_reduce_scatter(2, DType::kBF16);
}

TEST(QuantizedReduceScatter, ExactForValuesTheBlocksCarryExactly) {
  // Every element a multiple of absmax / 127 with absmax the same in every block: q * s is exact,
  // and so are the sums of a few of them.
  const int N = group().size(), me = group().rank();
  const int H = N % 2 == 0 ? 2 : 1;
  comm::Group inner = group().split(me / H, me, "host");
  comm::Group outer = group().split(me % H, me, "across");
  const size_t total = 1024;
  std::vector<size_t> counts(static_cast<size_t>(N), total / static_cast<size_t>(N));
  counts.back() += total % static_cast<size_t>(N);
  auto value = [](int r, size_t i) { return static_cast<float>(static_cast<int>((i * 5 + static_cast<size_t>(r)) % 255) - 127) / 128.0f; };
  Tensor in = Tensor::empty({static_cast<int64_t>(total)}, DType::kF32);
  for (size_t i = 0; i < total; ++i) in.data<float>()[i] = (i % comm::kQuantBlock == 0) ? -127.0f / 128.0f : value(me, i);
  const size_t at = std::accumulate(counts.begin(), counts.begin() + me, size_t{0});
  const size_t n = counts[static_cast<size_t>(me)];
  Tensor out = Tensor::empty({static_cast<int64_t>(n)}, DType::kF32);
  comm::QuantizedReduceScatter reduce(inner, outer.size() > 1 ? &outer : nullptr, counts);
  std::vector<int32_t> scratch(reduce.scratch_bytes() / 4);
  reduce.run(in, out, comm::ReduceOp::kSum, scratch.data(), true);
  if (outer.size() > 1) GTEST_SKIP() << "host sums are requantised with their own scales: exact only in one level";
  for (size_t k = 0; k < n; ++k) {
    const size_t i = at + k;
    float exact = 0;
    for (int r = 0; r < N; ++r) exact += (i % comm::kQuantBlock == 0) ? -127.0f / 128.0f : value(r, i);
    EXPECT_EQ(out.data<float>()[k], exact) << i;
  }
}

}  // namespace
