// One-bit Adam against a step-by-step reference of DeepSpeed's OneBitAdam (issue 38), at np 2, 3 and 4.
//
// "Ours" is what engine/compressed_step.cpp runs at ZeRO stage 0: optim's kernels (adam_update in the
// warm-up; momentum_update, comm::OneBitAllreduce, frozen_update after it) on a flat buffer whose
// tensors start on 32-element boundaries, the allreduce running over MPI. The reference is written
// here from DeepSpeed's public source, not from ours: OnebitAdam.step (deepspeed/runtime/fp16/onebit/
// adam.py) for every rank, and its compressed_allreduce (deepspeed/runtime/comm/nccl.py) for all ranks
// at once, one tensor at a time: tensors padded to a multiple of N * divider, one worker scale per
// tensor and rank over the padded tensor, one server scale per tensor and chunk, sign(0) = +1. Each
// torch operation is one fp32 operation rounded once, in the order the python writes them
// (torch's own CUDA/CPU kernels may fuse a multiply-add; DeepSpeed's results then differ from these
// by rounding). Scales: ||x||_2 / sqrt(numel) with the norm taken in double and rounded once.
//
// Both sides see the same gradient stream: rank r's gradient at step t is a fixed function of
// (r, t, element), independent of the weights (so nothing but the optimizers can make them drift),
// with tensor-wise magnitudes 1e-3 .. 1 so that one scale per tensor and one per 256 elements differ.
// The warm-up's exact average is computed once and given to both (the gradient averaging is the
// reducer's, tested in engine tests). Compared after every step of the warm-up, at the freeze and
// over 50 compressed steps: each rank's weights, momentum, variance and error-feedback residuals.
//
// With per-tensor scales (compression_scale "tensor") the reference is DeepSpeed's compression; with
// zeroshard's 256-element scale blocks it is the same step loop with the compression of Note
// [One-bit allreduce] (flat buffer, chunks of ceil(n / N) rounded up to 256, one scale per block of
// real elements) written independently here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "comm/comm.h"
#include "optim/onebit_adam.h"
#include "tests/support/mpi_test_env.h"

using namespace zs;

namespace {

using Vec = std::vector<float>;
constexpr size_t kAlign = 32;  // engine::FlatLayout::kAlignElements
constexpr int kFreeze = 6;
constexpr int kCompressed = 50;

const comm::Group& group() { return test::world().group(); }

// The tensors: odd sizes (padding at every N), one larger than a block chunk, a bias-sized one.
struct Layout {
  std::vector<memory::ShardRange> tensors;
  std::vector<float> magnitude;  // gradient size per tensor
  size_t total = 0;
};
Layout layout() {
  Layout l;
  const size_t sizes[] = {300, 1000, 64, 7, 513, 96};
  const float mags[] = {1.0f, 1e-2f, 0.3f, 1e-3f, 3e-2f, 0.1f};
  size_t at = 0;
  for (size_t t = 0; t < std::size(sizes); ++t) {
    l.tensors.push_back({at, sizes[t]});
    l.magnitude.push_back(mags[t]);
    at = (at + sizes[t] + kAlign - 1) / kAlign * kAlign;
  }
  l.total = at;
  return l;
}

// splitmix64: a fixed, platform-independent stream.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
float uniform(uint64_t key) { return static_cast<float>(static_cast<double>(mix(key) >> 11) * 0x1.0p-53 * 2.0 - 1.0); }

// Rank r's gradient at step t: a shared drift per element plus rank noise, times the tensor's size.
Vec gradient(const Layout& l, int rank, int step) {
  Vec g(l.total, 0.0f);
  for (size_t t = 0; t < l.tensors.size(); ++t) {
    for (size_t i = 0; i < l.tensors[t].size; ++i) {
      const size_t e = l.tensors[t].offset + i;
      const float shared = uniform(e * 7919u + 1) + 0.3f * uniform(e * 104729u + static_cast<uint64_t>(step) * 31u);
      const float own = uniform((static_cast<uint64_t>(rank) << 40) ^ (static_cast<uint64_t>(step) << 24) ^ e);
      g[e] = l.magnitude[t] * (shared + 0.8f * own);
    }
  }
  return g;
}

Vec average(const Layout& l, int ranks, int step) {
  Vec s(l.total, 0.0f);
  for (int r = 0; r < ranks; ++r) {
    const Vec g = gradient(l, r, step);
    for (size_t i = 0; i < l.total; ++i) s[i] += g[i];
  }
  for (float& x : s) x /= static_cast<float>(ranks);
  return s;
}

double lr_at(int step) { return step <= kFreeze ? 1e-3 * step / kFreeze : 1e-3 * (1.0 - 0.01 * (step - kFreeze)); }

optim::OneBitAdamConfig config(optim::CompressionScale scale) {
  return {.lr = 1e-3, .betas = {0.9, 0.95}, .eps = 1e-8, .weight_decay = 0.01, .freeze_step = kFreeze,
          .compression_scale = scale};
}

// ------------------------------------------------------------------------------------------------
// The reference: DeepSpeed's OnebitAdam on every rank, its state per rank.

struct RefRank {
  Vec p, m, v;
  std::vector<Vec> worker_error, server_error;  // per tensor (per tensor mode) or one (block mode)
};

float sgn(float x) { return x >= 0.0f ? 1.0f : -1.0f; }  // sign().add_(1).bool() * 2 - 1

// torch.linalg.norm(x) / np.sqrt(x.numel()), the norm in double rounded once.
float ds_scale(const float* x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return n == 0 ? 0.0f : static_cast<float>(std::sqrt(s) / std::sqrt(static_cast<double>(n)));
}

// nccl.py's compressed_allreduce of `bufs[r]` (one tensor, n elements) for all N ranks at once.
void ds_compressed_allreduce(std::vector<Vec>& bufs, std::vector<Vec*> worker, std::vector<Vec*> server) {
  const size_t n_ranks = bufs.size();
  const size_t n = bufs[0].size();
  const size_t unit = n_ranks * (n_ranks * 8 / std::gcd(n_ranks, size_t{8}));
  const size_t padded = (n + unit - 1) / unit * unit;
  const size_t chunk = padded / n_ranks;
  std::vector<Vec> x(n_ranks);
  Vec scale(n_ranks);
  for (size_t r = 0; r < n_ranks; ++r) {
    Vec& e = *worker[r];
    if (e.empty()) e.assign(padded, 0.0f);
    x[r].assign(padded, 0.0f);  // torch.cat([buffer_m, zeros]) then add_(worker_error)
    for (size_t i = 0; i < padded; ++i) x[r][i] = (i < n ? bufs[r][i] : 0.0f) + e[i];
    scale[r] = ds_scale(x[r].data(), padded);
    for (size_t i = 0; i < padded; ++i) e[i] = x[r][i] - scale[r] * sgn(x[r][i]);
  }
  Vec out(padded);
  const float inv = static_cast<float>(1.0 / static_cast<double>(n_ranks));  // mul_(1 / self.size)
  for (size_t j = 0; j < n_ranks; ++j) {
    Vec& se = *server[j];
    if (se.empty()) se.assign(chunk, 0.0f);
    Vec y(chunk, 0.0f);
    for (size_t i = 0; i < chunk; ++i) {
      float acc = 0.0f;
      for (size_t r = 0; r < n_ranks; ++r) acc += sgn(x[r][j * chunk + i]) * (scale[r] * inv);  // .sum(0)
      y[i] = acc + se[i];  // compensated_server_m.add_(server_error)
    }
    const float t = ds_scale(y.data(), chunk);
    for (size_t i = 0; i < chunk; ++i) {
      se[i] = y[i] - t * sgn(y[i]);
      out[j * chunk + i] = t * sgn(y[i]);
    }
  }
  for (size_t r = 0; r < n_ranks; ++r) bufs[r].assign(out.begin(), out.begin() + static_cast<ptrdiff_t>(n));
}

// Note [One-bit allreduce]'s compression of the whole flat buffer, for all ranks at once.
void block_compressed_allreduce(std::vector<Vec>& bufs, std::vector<RefRank>& ranks) {
  const size_t n_ranks = bufs.size();
  const size_t n = bufs[0].size();
  constexpr size_t kBlock = 256;
  const size_t chunk = ((n + n_ranks - 1) / n_ranks + kBlock - 1) / kBlock * kBlock;
  std::vector<Vec> c(n_ranks, Vec(n));
  for (size_t r = 0; r < n_ranks; ++r) {
    Vec& e = ranks[r].worker_error[0];
    if (e.empty()) e.assign(n, 0.0f);
    for (size_t b = 0; b < n; b += kBlock) {  // chunks are whole blocks, so blocks never straddle two
      const size_t end = std::min(n, b + kBlock);
      Vec x(end - b);
      for (size_t i = b; i < end; ++i) x[i - b] = bufs[r][i] + e[i];
      const float s = ds_scale(x.data(), x.size());
      for (size_t i = b; i < end; ++i) {
        c[r][i] = s * sgn(x[i - b]);
        e[i] = x[i - b] - c[r][i];
      }
    }
  }
  Vec out(n);
  for (size_t j = 0; j < n_ranks; ++j) {
    Vec& se = ranks[j].server_error[0];
    if (se.empty()) se.assign(chunk, 0.0f);
    for (size_t b = j * chunk; b < std::min(n, (j + 1) * chunk); b += kBlock) {
      const size_t end = std::min(n, b + kBlock);
      Vec y(end - b);
      for (size_t i = b; i < end; ++i) {
        float acc = 0.0f;
        for (size_t r = 0; r < n_ranks; ++r) acc += c[r][i];
        y[i - b] = se[i - j * chunk] + acc * (1.0f / static_cast<float>(n_ranks));
      }
      const float t = ds_scale(y.data(), y.size());
      for (size_t i = b; i < end; ++i) {
        out[i] = t * sgn(y[i - b]);
        se[i - j * chunk] = y[i - b] - out[i];
      }
    }
  }
  for (size_t r = 0; r < n_ranks; ++r) bufs[r] = out;
}

void zero_gaps(const Layout& l, Vec& v) {
  size_t end = 0;
  for (const memory::ShardRange& tr : l.tensors) {
    std::fill(v.begin() + static_cast<ptrdiff_t>(end), v.begin() + static_cast<ptrdiff_t>(tr.offset), 0.0f);
    end = tr.offset + tr.size;
  }
  std::fill(v.begin() + static_cast<ptrdiff_t>(end), v.end(), 0.0f);
}

// OnebitAdam.step for step t on every rank (state['step'] = t: Note [Differences from DeepSpeed]).
void reference_step(const Layout& l, std::vector<RefRank>& ranks, int t, optim::CompressionScale scale) {
  const optim::OneBitAdamConfig cfg = config(scale);
  const float b1 = static_cast<float>(cfg.betas[0]), b2 = static_cast<float>(cfg.betas[1]);
  const float a1 = static_cast<float>(1.0 - cfg.betas[0]), a2 = static_cast<float>(1.0 - cfg.betas[1]);
  const float eps = static_cast<float>(cfg.eps), wd = static_cast<float>(cfg.weight_decay);
  const float neg_lr = static_cast<float>(-lr_at(t));
  const int n_ranks = static_cast<int>(ranks.size());
  const bool frozen = t > cfg.freeze_step;  // adam_freeze_key flips at the end of step freeze_step
  const Vec avg = frozen ? Vec{} : average(l, n_ranks, t);
  for (int r = 0; r < n_ranks; ++r) {
    const Vec g = frozen ? gradient(l, r, t) : avg;  // enable_backward_allreduce is off once frozen
    RefRank& s = ranks[static_cast<size_t>(r)];
    for (const memory::ShardRange& tr : l.tensors) {
      for (size_t i = tr.offset; i < tr.offset + tr.size; ++i) {
        s.m[i] = s.m[i] * b1 + a1 * g[i];                         // exp_avg.mul_(beta1).add_(1 - beta1, grad)
        if (!frozen) s.v[i] = s.v[i] * b2 + a2 * g[i] * g[i];    // exp_avg_sq.mul_(beta2).addcmul_(...)
      }
    }
  }
  if (frozen) {
    std::vector<Vec> flat(static_cast<size_t>(n_ranks));
    for (int r = 0; r < n_ranks; ++r) flat[static_cast<size_t>(r)] = ranks[static_cast<size_t>(r)].m;
    if (scale == optim::CompressionScale::kBlock) {
      // The alignment gaps between the tensors are DeepSpeed's padding: zero data on the way in (their
      // residuals kept), nothing kept on the way out.
      for (Vec& f : flat) zero_gaps(l, f);
      block_compressed_allreduce(flat, ranks);
      for (Vec& f : flat) zero_gaps(l, f);
      for (int r = 0; r < n_ranks; ++r) ranks[static_cast<size_t>(r)].m = flat[static_cast<size_t>(r)];
    } else {
      for (size_t t_i = 0; t_i < l.tensors.size(); ++t_i) {
        const memory::ShardRange tr = l.tensors[t_i];
        std::vector<Vec> bufs;
        std::vector<Vec*> worker, server;
        for (RefRank& s : ranks) {
          bufs.emplace_back(s.m.begin() + static_cast<ptrdiff_t>(tr.offset), s.m.begin() + static_cast<ptrdiff_t>(tr.offset + tr.size));
          worker.push_back(&s.worker_error[t_i]);
          server.push_back(&s.server_error[t_i]);
        }
        ds_compressed_allreduce(bufs, worker, server);
        for (int r = 0; r < n_ranks; ++r) {
          std::copy(bufs[static_cast<size_t>(r)].begin(), bufs[static_cast<size_t>(r)].end(),
                    ranks[static_cast<size_t>(r)].m.begin() + static_cast<ptrdiff_t>(tr.offset));
        }
      }
    }
  }
  for (RefRank& s : ranks) {
    for (const memory::ShardRange& tr : l.tensors) {
      for (size_t i = tr.offset; i < tr.offset + tr.size; ++i) {
        float update = s.m[i] / (std::sqrt(s.v[i]) + eps);
        update += wd * s.p[i];           // weight_decay > 0
        s.p[i] += neg_lr * update;       // p.add_(-lr * update)
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Ours: this rank's state, stepped as engine/compressed_step.cpp steps it at stage 0.

struct Ours {
  Vec p, m, v;
  comm::OneBitAllreduce reduce;
};

void our_step(const Layout& l, Ours& o, int t, optim::CompressionScale scale) {
  const optim::OneBitAdamConfig cfg = config(scale);
  const optim::CompressedConstants k = optim::compressed_constants(cfg, {.lr = lr_at(t), .grad_scale = 1.0f});
  auto chunk = [&](const memory::ShardRange& tr, const float* g) {
    return optim::CompressedChunk{.master = o.p.data() + tr.offset, .exp_avg = o.m.data() + tr.offset,
                                  .exp_avg_sq = o.v.data() + tr.offset, .grad = g == nullptr ? nullptr : g + tr.offset,
                                  .n = tr.size};
  };
  if (!optim::one_bit_frozen(cfg, t)) {
    const Vec avg = average(l, group().size(), t);
    for (const memory::ShardRange& tr : l.tensors) optim::adam_update(chunk(tr, avg.data()), k);
    return;
  }
  const Vec g = gradient(l, group().rank(), t);
  for (const memory::ShardRange& tr : l.tensors) optim::momentum_update(chunk(tr, g.data()), k);
  o.reduce.allreduce(o.m);
  for (const memory::ShardRange& tr : l.tensors) optim::frozen_update(chunk(tr, nullptr), k);
}

struct Diff {
  double max_rel = 0;  // max |ours - ref| / max(|ref|, 1e-30) over the elements
  size_t unequal = 0;  // elements not bit-identical
};
void compare(const Vec& ours, const Vec& ref, Diff& d) {
  ASSERT_EQ(ours.size(), ref.size());
  for (size_t i = 0; i < ours.size(); ++i) {
    if (ours[i] == ref[i]) continue;
    ++d.unequal;
    d.max_rel = std::max(d.max_rel, std::abs(static_cast<double>(ours[i]) - ref[i]) / std::max(1e-30, std::abs(static_cast<double>(ref[i]))));
  }
}

class AgainstDeepSpeed : public ::testing::TestWithParam<optim::CompressionScale> {};

TEST_P(AgainstDeepSpeed, StatesAndWeightsMatchThroughWarmUpFreezeAndCompressedSteps) {
  const comm::Group& g = group();
  if (g.size() == 1) GTEST_SKIP() << "DeepSpeed skips the compression on one rank; run at np 2 and 4";
  const optim::CompressionScale scale = GetParam();
  const Layout l = layout();
  const size_t n_ranks = static_cast<size_t>(g.size());
  Vec p0(l.total, 0.0f);
  for (const memory::ShardRange& tr : l.tensors) {
    for (size_t i = tr.offset; i < tr.offset + tr.size; ++i) p0[i] = 0.05f * uniform(i * 3u + 99);
  }
  std::vector<RefRank> ref(n_ranks);
  for (RefRank& s : ref) {
    s.p = p0;
    s.m.assign(l.total, 0.0f);
    s.v.assign(l.total, 0.0f);
    const size_t buffers = scale == optim::CompressionScale::kTensor ? l.tensors.size() : 1;
    s.worker_error.resize(buffers);
    s.server_error.resize(buffers);
  }
  Ours o{.p = p0, .m = Vec(l.total, 0.0f), .v = Vec(l.total, 0.0f),
         .reduce = comm::OneBitAllreduce(g, l.total, l.tensors,
                                         scale == optim::CompressionScale::kTensor ? comm::OneBitAllreduce::Scales::kPerTensor
                                                                                   : comm::OneBitAllreduce::Scales::kBlocks)};
  const RefRank& mine = ref[static_cast<size_t>(g.rank())];
  Diff warm, compressed;
  for (int t = 1; t <= kFreeze + kCompressed; ++t) {
    reference_step(l, ref, t, scale);
    our_step(l, o, t, scale);
    Diff& d = t <= kFreeze ? warm : compressed;
    compare(o.p, mine.p, d);
    compare(o.m, mine.m, d);
    compare(o.v, mine.v, d);
    if (t > kFreeze) {
      // The residuals: ours are laid out as the reference's buffers, one after the other.
      Vec worker, server;
      for (const Vec& e : mine.worker_error) worker.insert(worker.end(), e.begin(), e.end());
      if (scale == optim::CompressionScale::kTensor) {
        // Server residuals: each rank keeps its own chunk of every tensor (ref: server_error[t] is
        // held by ranks[j] for chunk j, so mine.server_error is exactly this rank's chunks).
        for (const Vec& e : mine.server_error) server.insert(server.end(), e.begin(), e.end());
      } else {
        const Vec& e = mine.server_error[0];
        server.assign(e.begin(), e.begin() + static_cast<ptrdiff_t>(o.reduce.server_error().size()));
      }
      compare(Vec(o.reduce.worker_error().begin(), o.reduce.worker_error().end()), worker, d);
      compare(Vec(o.reduce.server_error().begin(), o.reduce.server_error().end()), server, d);
    }
  }
  // The same arithmetic on both sides, one rounding per operation in the same order: bit for bit. The
  // one place where the formulas differ is the scale, ||x|| / sqrt(m) (reference) against
  // sqrt(sum x^2 / m) (ours), both in double and rounded once to fp32: equal here on every scale.
  // The server's average is DeepSpeed's sum_r s_r (1/N) per tensor and Note [One-bit allreduce]'s
  // (sum_r s_r) (1/N) with blocks, on both sides, so np 3 is bit for bit too.
  EXPECT_EQ(warm.unequal, 0u) << "warm-up differs, max relative " << warm.max_rel;
  EXPECT_EQ(compressed.unequal, 0u) << "compressed steps differ, max relative " << compressed.max_rel;
  std::printf("rank %d, %s scales: warm-up %zu unequal; compressed %zu unequal, max relative %.3g\n", g.rank(),
              scale == optim::CompressionScale::kTensor ? "tensor" : "block", warm.unequal, compressed.unequal,
              compressed.max_rel);
}

INSTANTIATE_TEST_SUITE_P(Scales, AgainstDeepSpeed,
                         ::testing::Values(optim::CompressionScale::kBlock, optim::CompressionScale::kTensor),
                         [](const auto& info) {
                           return info.param == optim::CompressionScale::kTensor ? std::string("PerTensor")
                                                                                 : std::string("Blocks256");
                         });

}  // namespace
