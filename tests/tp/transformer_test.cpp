// ParallelAttention, ParallelMlp and ParallelBlock under mpirun at tp = 1, 2 and 4, sequence parallelism
// off and on, against nn::CausalSelfAttention, nn::Mlp and nn::Block (fp32, 1e-5), and the block's
// parameter gradients against finite differences of tests/nn/reference.h's double-precision block.
#include <gtest/gtest.h>

#include <functional>
#include <limits>

#include "nn/host_context.h"
#include "nn/transformer.h"
#include "tests/nn/reference.h"
#include "tests/tp/tp_test_util.h"
#include "tp/tp.h"

namespace zs::tp::transformer_test {
namespace {

using namespace zs::tp::test;
using nn::HostContext;

constexpr int64_t kB = 2, kT = 8, kC = 16, kHeads = 4;

// Runs `ref` and `par` (the same layer at tp = 1 and at this group's tp) on two passes of (B, T, C)
// inputs and checks outputs, input gradients and parameter gradients. Sequence shards in and out with
// sequence parallelism.
void check_against(nn::Module& ref, nn::Module& par, const TensorParallel& tp, bool scores_only = false) {
  nn::materialize(ref, 3);
  nn::materialize(par, 3);
  randomize(ref, 9, 0.2f);
  randomize(par, 9, 0.2f);
  const int t = tp.size(), r = tp.rank();
  const bool shard = tp.sharded_sequence();
  for (int pass = 0; pass < 2; ++pass) {
    HostContext ctx;
    const Tensor x = nn::ref::random_tensor({kB, kT, kC}, 100 + pass);
    const Tensor dy = nn::ref::random_tensor({kB, kT, kC}, 200 + pass);
    const Tensor y_ref = ctx.forward(ref, x);
    const Tensor dx_ref = ctx.backward(ref, dy);
    auto mine = [&](const Tensor& full) { return shard ? take_slice(full, 1, t, r) : full; };
    expect_close(ctx.forward(par, mine(x)), mine(y_ref), "y");
    expect_close(ctx.backward(par, mine(dy)), mine(dx_ref), "dx");
  }
  expect_grads_are_slices(par, ref);
}

TEST(TensorParallelTransformer, AttentionMlpAndBlockEqualTheirNnVersions) {
  for (int t : tp_sizes()) {
    for (bool sp : {false, true}) {
      SCOPED_TRACE(fmt::format("tp {} sequence_parallel {}", t, sp));
      comm::Group group = tp_group(t);
      const TensorParallel tp{.group = &group, .sequence_parallel = sp};
      {
        SCOPED_TRACE("attention");
        nn::CausalSelfAttention ref(kC, kHeads);
        ParallelAttention par(kC, kHeads, tp);
        check_against(ref, par, tp);
      }
      {
        SCOPED_TRACE("attention, selective recompute");
        nn::CausalSelfAttention ref(kC, kHeads);
        ParallelAttention par(kC, kHeads, tp);
        par.set_recompute_scores(true);
        check_against(ref, par, tp);
      }
      {
        SCOPED_TRACE("mlp");
        nn::Mlp ref(kC);
        ParallelMlp par(kC, tp);
        check_against(ref, par, tp);
      }
      {
        SCOPED_TRACE("block");
        nn::Block ref(kC, kHeads);
        ParallelBlock par(kC, kHeads, tp);
        check_against(ref, par, tp);
      }
      {
        SCOPED_TRACE("block, recomputed");
        nn::Block ref(kC, kHeads);
        ParallelBlock par(kC, kHeads, tp);
        par.set_recomputed(true);  // the re-run repeats the collectives on every rank
        check_against(ref, par, tp);
      }
    }
  }
}

// The block's gradient of L = sum(y * r) against central differences of the double-precision block,
// for elements each rank holds.
TEST(TensorParallelTransformer, BlockGradientsMatchFiniteDifferences) {
  for (int t : tp_sizes()) {
    for (bool sp : {false, true}) {
      SCOPED_TRACE(fmt::format("tp {} sequence_parallel {}", t, sp));
      comm::Group group = tp_group(t);
      const TensorParallel tp{.group = &group, .sequence_parallel = sp};
      nn::Block ref(kC, kHeads);
      ParallelBlock par(kC, kHeads, tp);
      nn::materialize(ref, 3);
      nn::materialize(par, 3);
      randomize(ref, 4, 0.2f);
      randomize(par, 4, 0.2f);
      const Tensor x = nn::ref::random_tensor({kB, kT, kC}, 7), dy = nn::ref::random_tensor({kB, kT, kC}, 8);
      const bool shard = tp.sharded_sequence();
      HostContext ctx;
      ctx.forward(par, shard ? take_slice(x, 1, t, tp.rank()) : x);
      ctx.backward(par, shard ? take_slice(dy, 1, t, tp.rank()) : dy);
      nn::ref::ParamMap full = nn::ref::params_of(ref);
      const nn::ref::Vec xv = nn::ref::to_double(x), rv = nn::ref::to_double(dy);
      auto loss = [&] {
        const nn::ref::Vec y = nn::ref::block(xv, full, "", kB, kT, kC, kHeads);
        double l = 0;
        for (size_t i = 0; i < y.size(); ++i) l += y[i] * rv[i];
        return l;
      };
      par.visit_params([&](nn::Parameter& p) {
        nn::ref::Vec& values = full.at(p.full_name());
        // The analytic gradient at full indices; the ones this rank holds are checked.
        std::vector<float> analytic(values.size(), std::numeric_limits<float>::quiet_NaN());
        const std::vector<float> local = values_of_grad(p);
        std::vector<size_t> held;
        p.for_each_full_run(0, static_cast<uint64_t>(p.numel()), [&](uint64_t l, uint64_t g, uint64_t n) {
          for (uint64_t i = 0; i < n; ++i) {
            analytic[g + i] = local[l + i];
            held.push_back(g + i);
          }
        });
        std::vector<size_t> indices;
        for (size_t k : nn::ref::sample_indices(held.size(), 12)) indices.push_back(held[k]);
        nn::ref::expect_grad_matches(p.full_name(), values, indices, loss, analytic);
      });
    }
  }
}

// The bytes one block's forward and backward send on each rank (comm/config.h's counting rule, from
// the World's counters), on (B, T, C) activations of n = B T C elements and N ranks:
//   without sequence parallelism: Megatron's four all-reduces of n (attn.proj and mlp.proj forward,
//     attn.qkv and mlp.fc backward), 2 (N-1)/N n elements each;
//   with it: four reduce-scatters (the row layers' outputs forward, the column layers' input gradients
//     backward) and six all-gathers (the column layers' inputs forward and again backward, as
//     Megatron's backward re-gathers them, and the row layers' output gradients), (N-1)/N n elements
//     each, plus the all-reduces of the replicated gradients computed on shards (ln1 and ln2: 2C
//     elements each; attn.proj.bias and mlp.proj.bias: C each).
TEST(TensorParallelTransformer, BlockSendsMegatronsBytes) {
  const int t = tp_sizes().back();
  if (t == 1) GTEST_SKIP() << "needs tp > 1";
  comm::Group group = tp_group(t);
  const uint64_t N = static_cast<uint64_t>(t), n = kB * kT * kC, f = sizeof(float);
  auto allreduce_bytes = [&](uint64_t m) { return 2 * (N - 1) * m / N * f; };
  for (bool sp : {false, true}) {
    SCOPED_TRACE(fmt::format("tp {} sequence_parallel {}", t, sp));
    const TensorParallel tp{.group = &group, .sequence_parallel = sp};
    ParallelBlock par(kC, kHeads, tp);
    nn::materialize(par, 3);
    const Tensor x = nn::ref::random_tensor({kB, sp ? kT / t : kT, kC}, 1);
    HostContext ctx;
    const uint64_t before = group.counters().bytes_sent;
    const Tensor y = ctx.forward(par, x);
    ctx.backward(par, y);
    const uint64_t sent = group.counters().bytes_sent - before;
    const uint64_t want = sp ? 10 * ((N - 1) * n / N * f) + 2 * allreduce_bytes(2 * kC) + 2 * allreduce_bytes(kC)
                             : 4 * allreduce_bytes(n);
    EXPECT_EQ(sent, want);
  }
}

}  // namespace
}  // namespace zs::tp::transformer_test
