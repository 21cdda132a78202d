// OneBitAllreduce against a double-precision reference of the algorithm and against the exact
// average: bounded error, the error-feedback identities (what one call drops is carried exactly),
// convergence in the mean for a constant input, byte counters, odd sizes. Runs at np 1, 2, 3, 4.
//
// Every rank generates every rank's input from seeded Gaussians, so the exact average and the
// reference are computed locally without trusting any collective. Checks after a collective use
// EXPECT (not ASSERT) so that a failing rank still joins the collectives that follow.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
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
using Vec = std::vector<float>;

// Input of `rank` at call `step`: common * shared + noise * private Gaussians.
Vec input(size_t n, int rank, int step, float common = 0.0f, float noise = 1.0f) {
  std::mt19937_64 shared_rng(1000003u * static_cast<uint64_t>(step) + 17);
  std::mt19937_64 own_rng(7919u * static_cast<uint64_t>(rank) + 104729u * static_cast<uint64_t>(step) + 5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Vec v(n);
  for (size_t i = 0; i < n; ++i) {
    const float c = normal(shared_rng);
    v[i] = common * c + noise * normal(own_rng);
  }
  return v;
}

Vec exact_average(size_t n, int ranks, int step, float common = 0.0f, float noise = 1.0f) {
  std::vector<double> s(n, 0.0);
  for (int r = 0; r < ranks; ++r) {
    Vec x = input(n, r, step, common, noise);
    for (size_t i = 0; i < n; ++i) s[i] += x[i];
  }
  Vec out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(s[i] / ranks);
  return out;
}

double norm(const Vec& a) {
  double s = 0;
  for (float v : a) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}
double distance(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return std::sqrt(s);
}

size_t expected_chunk(size_t n, int ranks) {
  const size_t per = (n + static_cast<size_t>(ranks) - 1) / static_cast<size_t>(ranks);
  constexpr size_t kBlock = comm::OneBitAllreduce::kScaleBlock;
  return (per + kBlock - 1) / kBlock * kBlock;
}

// The algorithm of Note [One-bit allreduce] for all ranks at once, in double, written from the
// formulas (not from the implementation): per scale block of 256 (chunks are whole blocks), worker
// compression with the L2 scale, average, server compression.
struct Reference {
  static constexpr size_t kBlock = comm::OneBitAllreduce::kScaleBlock;
  size_t n, chunk;
  int ranks;
  std::vector<std::vector<double>> worker_err;  // [rank][n]
  std::vector<double> server_err;               // [n], chunk j held by server j

  Reference(size_t n_, int ranks_) : n(n_), chunk(expected_chunk(n_, ranks_)), ranks(ranks_),
      worker_err(static_cast<size_t>(ranks_), std::vector<double>(n_, 0.0)), server_err(n_, 0.0) {}

  static double compress(std::vector<double>& v, size_t begin, size_t end, std::vector<double>& err) {
    double squares = 0;
    for (size_t i = begin; i < end; ++i) squares += v[i] * v[i];
    const double s = std::sqrt(squares / static_cast<double>(end - begin));
    for (size_t i = begin; i < end; ++i) {
      const double c = v[i] >= 0 ? s : -s;
      err[i] = v[i] - c;
      v[i] = c;
    }
    return s;
  }

  std::vector<double> step(const std::vector<Vec>& inputs) {
    std::vector<double> avg(n, 0.0);
    for (int r = 0; r < ranks; ++r) {
      std::vector<double> x(n);
      for (size_t i = 0; i < n; ++i) x[i] = inputs[static_cast<size_t>(r)][i] + worker_err[static_cast<size_t>(r)][i];
      for (size_t b = 0; b < n; b += kBlock) compress(x, b, std::min(n, b + kBlock), worker_err[static_cast<size_t>(r)]);
      for (size_t i = 0; i < n; ++i) avg[i] += x[i] / ranks;
    }
    for (size_t i = 0; i < n; ++i) avg[i] += server_err[i];
    for (size_t b = 0; b < n; b += kBlock) compress(avg, b, std::min(n, b + kBlock), server_err);
    return avg;
  }
};

TEST(OneBitAllreduce, LayoutAndPadding) {
  const auto& g = group();
  for (size_t n : {size_t{0}, size_t{1}, size_t{31}, size_t{33}, size_t{1000}, size_t{4099}}) {
    comm::OneBitAllreduce c(g, n);
    EXPECT_EQ(c.chunk_size(), expected_chunk(n, g.size())) << n;
    EXPECT_EQ(c.chunk_size() % 32, 0u);
    EXPECT_GE(c.padded_numel(), n);
    EXPECT_LT(c.padded_numel() - n, static_cast<size_t>(g.size()) * comm::OneBitAllreduce::kScaleBlock + c.chunk_size()) << n;
    EXPECT_EQ(c.worker_error().size(), n);
    const auto r = c.server_range();
    EXPECT_LE(r.end(), n);
    EXPECT_EQ(c.server_error().size(), r.size);
  }
}

TEST(OneBitAllreduce, MatchesDoublePrecisionReference) {
  const auto& g = group();
  for (size_t n : {size_t{1}, size_t{5}, size_t{31}, size_t{33}, size_t{100}, size_t{1000}, size_t{4099}}) {
    comm::OneBitAllreduce c(g, n);
    Reference ref(n, g.size());
    for (int step = 0; step < 3; ++step) {
      std::vector<Vec> inputs;
      for (int r = 0; r < g.size(); ++r) inputs.push_back(input(n, r, step));
      Vec data = inputs[static_cast<size_t>(g.rank())];
      c.allreduce(data);
      const auto want = ref.step(inputs);
      int bad = 0;
      for (size_t i = 0; i < n && bad < 5; ++i) {
        if (std::fabs(data[i] - want[i]) > 1e-4 * (1.0 + std::fabs(want[i]))) {
          ++bad;
          ADD_FAILURE() << "n=" << n << " step=" << step << " i=" << i << ": " << data[i] << " vs " << want[i];
        }
      }
      // Residuals too: this rank's worker error and its server chunk.
      const auto& we = ref.worker_err[static_cast<size_t>(g.rank())];
      for (size_t i = 0; i < n && bad < 5; ++i) {
        if (std::fabs(c.worker_error()[i] - we[i]) > 1e-4 * (1.0 + std::fabs(we[i]))) ++bad, ADD_FAILURE() << "worker_error i=" << i;
      }
      const auto r = c.server_range();
      for (size_t i = 0; i < r.size && bad < 5; ++i) {
        if (std::fabs(c.server_error()[i] - ref.server_err[r.offset + i]) > 1e-4) ++bad, ADD_FAILURE() << "server_error i=" << i;
      }
    }
  }
}

// One compression with the scale ||v||_2 / sqrt(m) errs by at most sqrt(2) ||v||, so after one call
// (errors zero) ||out - exact|| <= sqrt(2) M + sqrt(2) ||y|| with M = mean_r ||x_r|| (worker errors)
// and ||y|| <= ||exact|| + sqrt(2) M (the server's input): always <= (2 + sqrt(2)) M + sqrt(2) ||exact||.
// For Gaussian chunks one compression errs by sqrt(2 - 2 sqrt(2/pi)) = 0.636 of the norm. With
// correlated inputs (momenta of data-parallel replicas are close) the worker errors nearly coincide
// and the server's y is almost 1-bit already, so the result errs by ~0.64 of ||exact||; measured
// here the same ~0.64 holds for independent inputs at N = 1..4 (the server's error and the averaged
// worker errors partly cancel). Asserted at 0.70 for n = 4099 (spread ~2%).
TEST(OneBitAllreduce, ErrorAgainstExactAverageIsBounded) {
  const auto& g = group();
  const size_t n = 4099;
  struct Case { float common, noise, bound; };
  for (Case k : {Case{1.0f, 0.1f, 0.70f}, Case{0.0f, 1.0f, 0.70f}}) {
    comm::OneBitAllreduce c(g, n);
    Vec data = input(n, g.rank(), 0, k.common, k.noise);
    c.allreduce(data);
    const Vec exact = exact_average(n, g.size(), 0, k.common, k.noise);
    double mean_in = 0;
    for (int r = 0; r < g.size(); ++r) mean_in += norm(input(n, r, 0, k.common, k.noise)) / g.size();
    const double err = distance(data, exact), ex = norm(exact);
    EXPECT_LE(err, (2 + std::sqrt(2.0)) * mean_in + std::sqrt(2.0) * ex);
    EXPECT_LE(err, k.bound * ex) << "common=" << k.common << " relative error " << err / ex;
    if (g.rank() == 0) std::printf("[ info ] common=%.1f noise=%.1f: relative error %.3f\n", k.common, k.noise, err / ex);
    EXPECT_GT(err, 0.3 * ex) << "a 1-bit result cannot be this close to Gaussian data: compression skipped?";
  }
}

// Gathers the full server residual (chunk j from server j) onto every rank.
Vec full_server_error(const comm::Group& g, const comm::OneBitAllreduce& c) {
  const size_t chunk = c.chunk_size();
  Vec mine(chunk, 0.0f), all(chunk * static_cast<size_t>(g.size()));
  std::copy(c.server_error().begin(), c.server_error().end(), mine.begin());
  g.allgather(Tensor::of(mine), Tensor::of(all));
  all.resize(c.numel());
  return all;
}

// The identities that make error feedback carry the residual, per call:
//   worker:  (x_r - worker_error_r) is 1-bit: one magnitude per chunk, with x_r's signs
//   whole:   out = exact + avg_r(e_r,prev - e_r,new) + (s_prev - s_new)
// and their telescoped sum over K calls: sum out = sum exact - avg_r e_r,K - s_K.
TEST(OneBitAllreduce, ErrorFeedbackCarriesTheResidualExactly) {
  const auto& g = group();
  for (size_t n : {size_t{37}, size_t{2050}}) {
    comm::OneBitAllreduce c(g, n);
    Vec worker_prev(n, 0.0f), server_prev(n, 0.0f);
    std::vector<double> sum_out(n, 0.0), sum_exact(n, 0.0);
    const int kCalls = 30;
    for (int step = 0; step < kCalls; ++step) {
      const Vec x0 = input(n, g.rank(), step);
      Vec x(n);
      for (size_t i = 0; i < n; ++i) x[i] = x0[i] + worker_prev[i];
      Vec data = x0;
      c.allreduce(data);
      const Vec worker_new(c.worker_error().begin(), c.worker_error().end());
      // Worker: compressed = x - error is +-s per scale block with x's sign.
      constexpr size_t kBlock = comm::OneBitAllreduce::kScaleBlock;
      int bad = 0;
      for (size_t b = 0; b < n; b += kBlock) {
        const float s = x[b] - worker_new[b];
        for (size_t i = b; i < std::min(n, b + kBlock) && bad < 5; ++i) {
          const float comp = x[i] - worker_new[i];
          if (std::fabs(std::fabs(comp) - std::fabs(s)) > 1e-5f * (1 + std::fabs(s)) || (comp >= 0) != (x[i] >= 0)) {
            ++bad, ADD_FAILURE() << "worker compressed value not 1-bit at i=" << i << ": " << comp << " vs " << s;
          }
        }
      }
      // The output is 1-bit per scale block too.
      for (size_t b = 0; b < n; b += kBlock) {
        for (size_t i = b; i < std::min(n, b + kBlock); ++i) EXPECT_EQ(std::fabs(data[i]), std::fabs(data[b]));
      }
      // Whole identity: avg of worker deltas via an exact fp32 allreduce.
      Vec delta(n);
      for (size_t i = 0; i < n; ++i) delta[i] = worker_prev[i] - worker_new[i];
      g.allreduce(Tensor::of(delta), comm::ReduceOp::kAverage);
      const Vec server_new = full_server_error(g, c);
      const Vec exact = exact_average(n, g.size(), step);
      for (size_t i = 0; i < n && bad < 5; ++i) {
        const double rebuilt = static_cast<double>(exact[i]) + delta[i] + server_prev[i] - server_new[i];
        if (std::fabs(rebuilt - data[i]) > 2e-5 * (1 + std::fabs(data[i]))) {
          ++bad, ADD_FAILURE() << "n=" << n << " step=" << step << " i=" << i << ": out " << data[i] << " rebuilt " << rebuilt;
        }
      }
      for (size_t i = 0; i < n; ++i) sum_out[i] += data[i], sum_exact[i] += exact[i];
      worker_prev = worker_new;
      server_prev = server_new;
    }
    Vec avg_worker = worker_prev;
    g.allreduce(Tensor::of(avg_worker), comm::ReduceOp::kAverage);
    double worst = 0;
    for (size_t i = 0; i < n; ++i) {
      worst = std::max(worst, std::fabs(sum_out[i] + avg_worker[i] + server_prev[i] - sum_exact[i]));
    }
    EXPECT_LT(worst, 1e-3) << "telescoped sum over " << kCalls << " calls, n=" << n;
  }
}

// A constant input: error feedback makes the running mean of the outputs converge to the exact
// average (at O(1/K) once the residuals level off, ~4 ||x|| here), while one call is off by ~0.64 of
// its norm. Measured at n = 1000, K = 200: 46-48x below the one-call error; asserted at 20x.
TEST(OneBitAllreduce, ConstantInputConvergesInTheMean) {
  const auto& g = group();
  const size_t n = 1000;
  const int kCalls = 200;
  comm::OneBitAllreduce c(g, n);
  const Vec x = input(n, g.rank(), 0);
  const Vec exact = exact_average(n, g.size(), 0);
  std::vector<double> sum(n, 0.0);
  double first_error = 0;
  for (int k = 0; k < kCalls; ++k) {
    Vec data = x;
    c.allreduce(data);
    if (k == 0) first_error = distance(data, exact);
    for (size_t i = 0; i < n; ++i) sum[i] += data[i];
  }
  Vec mean(n);
  for (size_t i = 0; i < n; ++i) mean[i] = static_cast<float>(sum[i] / kCalls);
  const double mean_error = distance(mean, exact);
  if (g.rank() == 0) std::printf("[ info ] one call: %.4f, mean of %d: %.5f (x%.0f smaller)\n", first_error, kCalls, mean_error, first_error / mean_error);
  EXPECT_LT(mean_error, first_error / 20);
  // Without feedback the mean would stay at the first error: reset_errors every call shows it.
  c.reset_errors();
  Vec again = x;
  c.allreduce(again);
  EXPECT_NEAR(distance(again, exact), first_error, 1e-4 * first_error);
}

TEST(OneBitAllreduce, ByteCountersShowTheSaving) {
  auto& world = test::world();
  const auto& g = world.group();
  const size_t n = size_t{1} << 17;
  comm::OneBitAllreduce c(g, n);
  Vec data = input(n, g.rank(), 0);
  world.flush();
  world.reset_counters();
  c.allreduce(data);
  const auto one_bit = world.counters();
  world.reset_counters();
  Vec plain = input(n, g.rank(), 0);
  g.allreduce(Tensor::of(plain), comm::ReduceOp::kAverage);
  const auto fp32 = world.counters();
  const uint64_t N = static_cast<uint64_t>(g.size());
  EXPECT_EQ(one_bit.bytes_sent, 2 * (N - 1) * (c.chunk_size() / 8 + 4 * c.chunk_size() / comm::OneBitAllreduce::kScaleBlock));
  EXPECT_EQ(one_bit.bytes_received, one_bit.bytes_sent);
  EXPECT_EQ(one_bit.bytes_sent, c.wire_bytes_per_call());
  EXPECT_EQ(fp32.bytes_sent, c.fp32_allreduce_bytes());
  EXPECT_EQ(one_bit.collectives, 2u);
  if (g.size() == 1) {
    EXPECT_EQ(one_bit.bytes_sent, 0u);
  } else {
    const double ratio = static_cast<double>(fp32.bytes_sent) / static_cast<double>(one_bit.bytes_sent);
    if (g.rank() == 0) std::printf("[ info ] N=%d n=%zu: fp32 allreduce %llu B, one-bit %llu B: %.2fx\n", g.size(), n,
                                   static_cast<unsigned long long>(fp32.bytes_sent),
                                   static_cast<unsigned long long>(one_bit.bytes_sent), ratio);
    // 32 bits against 1 bit plus a 32-bit scale per 256 elements: 32 / 1.125 = 28.4.
    EXPECT_GT(ratio, 28.0);
    EXPECT_LT(ratio, 28.5);
  }
}

// Per tensor (Note [Per-tensor scales]) and the gaps between tensors: the residuals have DeepSpeed's
// padded sizes, every output element of a tensor chunk is +-that chunk's one scale, the gaps come back
// zero whatever they held, and the bytes are 1 bit per padded element plus one scale per tensor,
// each way. Runs at every world size (np 3: DeepSpeed's divider 24, tensors padded to 72).
TEST(OneBitAllreduce, PerTensorScalesPaddingAndGaps) {
  auto& world = test::world();
  const auto& g = world.group();
  const size_t N = static_cast<size_t>(g.size());
  const std::vector<memory::ShardRange> tensors = {{0, 300}, {320, 7}, {352, 1000}, {1376, 64}};
  const size_t n = 1500;  // a gap after the last tensor too
  comm::OneBitAllreduce c(g, n, tensors, comm::OneBitAllreduce::Scales::kPerTensor);
  EXPECT_TRUE(c.per_tensor());
  size_t padded = 0, chunks = 0;
  for (const auto& t : tensors) {
    const size_t p = comm::OneBitAllreduce::padded_tensor(t.size, g.size());
    const size_t unit = N * (N * 8 / std::gcd(N, size_t{8}));
    EXPECT_EQ(p % unit, 0u);
    EXPECT_GE(p, t.size);
    EXPECT_LT(p - t.size, unit);
    padded += p;
    chunks += p / N;
  }
  EXPECT_EQ(c.worker_error().size(), padded);
  EXPECT_EQ(c.server_error().size(), chunks);
  EXPECT_EQ(c.state_floats(), padded + chunks);
  // What the placement plan and the estimator size the error feedback by (engine/placement.cpp).
  EXPECT_EQ(comm::OneBitAllreduce::state_floats_for(n, g.size(), tensors, comm::OneBitAllreduce::Scales::kPerTensor),
            c.state_floats());
  Vec data = input(n, g.rank(), 0, 0.5f, 1.0f);
  for (float& v : data) v += 7.0f;  // the gaps hold garbage too
  world.flush();
  world.reset_counters();
  c.allreduce(data);
  const auto counted = world.counters();
  EXPECT_EQ(counted.bytes_sent, c.wire_bytes_per_call());
  EXPECT_EQ(c.wire_bytes_per_call(), 2 * (N - 1) * 4 * ((chunks + 31) / 32 + tensors.size()));
  size_t end = 0;
  for (const auto& t : tensors) {
    for (size_t i = end; i < t.offset; ++i) EXPECT_EQ(data[i], 0.0f) << "gap element " << i;
    const size_t chunk = comm::OneBitAllreduce::padded_tensor(t.size, g.size()) / N;
    for (size_t i = 0; i < t.size; ++i) {
      const float first = data[t.offset + (i / chunk) * chunk];
      EXPECT_EQ(std::fabs(data[t.offset + i]), std::fabs(first)) << "tensor at " << t.offset << ", element " << i;
      EXPECT_GT(std::fabs(first), 0.0f);
    }
    end = t.offset + t.size;
  }
  for (size_t i = end; i < n; ++i) EXPECT_EQ(data[i], 0.0f) << "gap element " << i;
}

// With scale blocks the gaps are padding too: zero on the way out, and the result on the tensors is
// the one of a buffer whose gaps were zero (the gaps' input does not leak into the scales).
TEST(OneBitAllreduce, BlockScalesTreatGapsAsPadding) {
  const auto& g = group();
  const std::vector<memory::ShardRange> tensors = {{0, 300}, {320, 7}, {352, 1000}};
  const size_t n = 1400;
  comm::OneBitAllreduce with_gaps(g, n, tensors, comm::OneBitAllreduce::Scales::kBlocks);
  comm::OneBitAllreduce zeroed(g, n);
  EXPECT_EQ(comm::OneBitAllreduce::state_floats_for(n, g.size(), tensors, comm::OneBitAllreduce::Scales::kBlocks),
            with_gaps.state_floats());
  EXPECT_EQ(with_gaps.state_floats(), zeroed.state_floats());
  Vec a = input(n, g.rank(), 0, 0.5f, 1.0f);
  Vec b = a;
  size_t end = 0;
  for (const auto& t : tensors) {
    for (size_t i = end; i < t.offset; ++i) {
      a[i] = 5.0f;
      b[i] = 0.0f;
    }
    end = t.offset + t.size;
  }
  for (size_t i = end; i < n; ++i) {
    a[i] = 5.0f;
    b[i] = 0.0f;
  }
  for (int call = 0; call < 3; ++call) {
    with_gaps.allreduce(a);
    zeroed.allreduce(b);
    end = 0;
    for (const auto& t : tensors) {
      for (size_t i = end; i < t.offset; ++i) b[i] = 0.0f;  // what the constructor with tensors does
      end = t.offset + t.size;
    }
    for (size_t i = end; i < n; ++i) b[i] = 0.0f;
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(a[i], b[i]) << "call " << call << ", element " << i;
  }
}

TEST(OneBitAllreduce, ZeroSizeIsANoOpAndWrongSizeThrows) {
  const auto& g = group();
  comm::OneBitAllreduce empty(g, 0);
  Vec none;
  auto& world = test::world();
  world.flush();
  world.reset_counters();
  empty.allreduce(none);
  EXPECT_EQ(world.counters().collectives, 0u);
  comm::OneBitAllreduce c(g, 10);
  Vec wrong(11);
  try {
    c.allreduce(wrong);
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("11 elements"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("built for 10"), std::string::npos) << e.what();
  }
  // Still usable afterwards (the check runs before any collective).
  Vec ok = input(10, g.rank(), 0);
  c.allreduce(ok);
  for (float v : ok) EXPECT_EQ(std::fabs(v), std::fabs(ok[0]));
}

// Built on the Group's collectives, so ranks that disagree on the buffer size get the handshake's
// CommError on every rank instead of a hang or garbage (on a dup, to leave the world group clean).
TEST(OneBitAllreduce, SizeMismatchAcrossRanksThrowsOnEveryRank) {
  const auto& g = group();
  if (g.size() == 1) GTEST_SKIP() << "needs two ranks";
  comm::Group dup = g.dup("onebit", g.config());
  const size_t n = g.rank() == 0 ? 1000 : 2000;  // chunk sizes differ, so the all-to-all sizes do
  comm::OneBitAllreduce c(dup, n);
  Vec data(n, 1.0f);
  try {
    c.allreduce(data);
    ADD_FAILURE() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("group 'onebit'"), std::string::npos) << e.what();
  }
}

}  // namespace
