// The tensor-parallel layers under mpirun, at tp = 1, 2 and 4 (those dividing the world; the world
// splits into groups of tp consecutive ranks), with sequence parallelism off and on: each layer's
// forward and backward against its tp = 1 nn version on the same inputs, fp32, to 1e-5: outputs and
// input gradients are the slices each rank holds, and every parameter gradient is the slice of the
// tp = 1 gradient, over two passes (gradients accumulate).
#include <gtest/gtest.h>

#include "nn/cross_entropy.h"
#include "nn/host_context.h"
#include "nn/layers.h"
#include "tests/nn/reference.h"
#include "tests/tp/tp_test_util.h"
#include "tp/tp.h"

namespace zs::tp::layers_test {
namespace {

using namespace zs::tp::test;
using nn::HostContext;

constexpr int64_t kB = 2, kT = 8, kIn = 8, kOut = 24;  // kOut divisible by 4 x stride 3

// A random (B, T, n) activation of pass `pass`, the same on every rank.
Tensor activation(int64_t n, int pass, uint64_t salt) {
  return nn::ref::random_tensor({kB, kT, n}, 1000 * static_cast<uint64_t>(pass) + salt);
}

void check_column(int t, bool sp, int stride, bool bias) {
  SCOPED_TRACE(fmt::format("tp {} sequence_parallel {} stride {} bias {}", t, sp, stride, bias));
  comm::Group group = tp_group(t);
  const TensorParallel tp{.group = &group, .sequence_parallel = sp};
  const int r = tp.rank();
  nn::Linear ref(kIn, kOut, bias);
  ColumnParallelLinear col(kIn, kOut, tp, bias, 0.02f, stride);
  nn::materialize(ref, 3);
  nn::materialize(col, 3);
  expect_close(col.weight().data(), slice_for(col.weight(), ref.weight().data()), "initial weight");
  randomize(ref, 5);
  randomize(col, 5);
  for (int pass = 0; pass < 2; ++pass) {
    HostContext ctx;
    const Tensor x = activation(kIn, pass, 1), dy = activation(kOut, pass, 2);
    const Tensor y_ref = ctx.forward(ref, x);
    const Tensor dx_ref = ctx.backward(ref, dy);
    const bool shard = tp.sharded_sequence();
    const Tensor y = ctx.forward(col, shard ? take_slice(x, 1, t, r) : x);
    expect_close(y, take_slice(y_ref, 2, t, r, stride), "y");
    const Tensor dx = ctx.backward(col, take_slice(dy, 2, t, r, stride));
    expect_close(dx, shard ? take_slice(dx_ref, 1, t, r) : dx_ref, "dx");
  }
  expect_grads_are_slices(col, ref);
}

void check_row(int t, bool sp, bool bias) {
  SCOPED_TRACE(fmt::format("tp {} sequence_parallel {} bias {}", t, sp, bias));
  comm::Group group = tp_group(t);
  const TensorParallel tp{.group = &group, .sequence_parallel = sp};
  const int r = tp.rank();
  nn::Linear ref(kOut, kIn, bias);
  RowParallelLinear row(kOut, kIn, tp, bias);
  nn::materialize(ref, 3);
  nn::materialize(row, 3);
  expect_close(row.weight().data(), slice_for(row.weight(), ref.weight().data()), "initial weight");
  randomize(ref, 5);
  randomize(row, 5);
  for (int pass = 0; pass < 2; ++pass) {
    HostContext ctx;
    const Tensor x = activation(kOut, pass, 3), dy = activation(kIn, pass, 4);
    const Tensor y_ref = ctx.forward(ref, x);
    const Tensor dx_ref = ctx.backward(ref, dy);
    const bool shard = tp.sharded_sequence();
    const Tensor y = ctx.forward(row, take_slice(x, 2, t, r));
    expect_close(y, shard ? take_slice(y_ref, 1, t, r) : y_ref, "y");
    const Tensor dx = ctx.backward(row, shard ? take_slice(dy, 1, t, r) : dy);
    expect_close(dx, take_slice(dx_ref, 2, t, r), "dx");
  }
  expect_grads_are_slices(row, ref);
}

TEST(TensorParallelLayers, ColumnParallelLinear) {
  for (int t : tp_sizes()) {
    for (bool sp : {false, true}) {
      check_column(t, sp, 1, true);
      check_column(t, sp, 3, true);
      check_column(t, sp, 1, false);
    }
  }
}

TEST(TensorParallelLayers, RowParallelLinear) {
  for (int t : tp_sizes()) {
    for (bool sp : {false, true}) {
      check_row(t, sp, true);
      check_row(t, sp, false);
    }
  }
}

// Token ids (B, T) of pass `pass`, the same on every rank; every id of [0, vocab) appears.
Tensor token_ids(int64_t vocab, int pass) {
  Tensor ids = Tensor::empty({kB, kT}, DType::kI32);
  for (int64_t i = 0; i < ids.numel(); ++i) ids.data<int32_t>()[i] = static_cast<int32_t>((i * 7 + 3 * pass) % vocab);
  return ids;
}

TEST(TensorParallelLayers, VocabParallelEmbedding) {
  constexpr int64_t kVocab = 12;
  for (int t : tp_sizes()) {
    for (bool sp : {false, true}) {
      SCOPED_TRACE(fmt::format("tp {} sequence_parallel {}", t, sp));
      comm::Group group = tp_group(t);
      const TensorParallel tp{.group = &group, .sequence_parallel = sp};
      nn::Embedding ref(kVocab, kIn);
      VocabParallelEmbedding emb(kVocab, kIn, tp);
      nn::materialize(ref, 3);
      nn::materialize(emb, 3);
      expect_close(emb.weight().data(), slice_for(emb.weight(), ref.weight().data()), "initial weight");
      EXPECT_EQ(emb.first_row(), kVocab / t * tp.rank());
      for (int pass = 0; pass < 2; ++pass) {
        HostContext ctx;
        const Tensor ids = token_ids(kVocab, pass), dy = activation(kIn, pass, 5);
        const Tensor y_ref = ctx.forward(ref, ids);
        ctx.backward(ref, dy);
        const bool shard = tp.sharded_sequence();
        expect_close(ctx.forward(emb, ids), shard ? take_slice(y_ref, 1, t, tp.rank()) : y_ref, "y");
        EXPECT_EQ(ctx.backward(emb, shard ? take_slice(dy, 1, t, tp.rank()) : dy).raw(), nullptr);
      }
      expect_grads_are_slices(emb, ref);
      // An id outside the vocabulary fails on every rank, whoever would own it.
      Tensor bad = token_ids(kVocab, 0);
      bad.data<int32_t>()[3] = kVocab;
      HostContext ctx;
      EXPECT_THROW(ctx.forward(emb, bad), ConfigError);
      emb.clear_saved();
    }
  }
}

TEST(TensorParallelLayers, VocabParallelCrossEntropy) {
  constexpr int64_t kVocab = 16, kN = kB * kT;
  for (int t : tp_sizes()) {
    SCOPED_TRACE(fmt::format("tp {}", t));
    comm::Group group = tp_group(t);
    const TensorParallel tp{.group = &group};
    Tensor logits = nn::ref::random_tensor({kB, kT, kVocab}, 11, 2.0f);
    logits.data<float>()[5] = 40.0f;  // a row dominated by one rank's column
    const Tensor targets = token_ids(kVocab, 1);
    HostContext ctx;
    nn::SoftmaxCrossEntropy ref;
    const float loss_ref = ref.forward(ctx, logits, targets);
    const Tensor d_ref = ref.backward(ctx, 0.7f);
    VocabParallelCrossEntropy ce(tp);
    const float loss = ce.forward(ctx, take_slice(logits, 2, t, tp.rank()), targets);
    EXPECT_NEAR(loss, loss_ref, 1e-5 * std::abs(loss_ref));
    // The same bits on every rank of the group.
    Tensor all = Tensor::empty({t}, DType::kF32);
    group.allgather(Tensor::of(std::span<float>(const_cast<float*>(&loss), 1)), all);
    for (float v : all.f32()) EXPECT_EQ(v, loss);
    expect_close(ce.backward(ctx, 0.7f), take_slice(d_ref, 2, t, tp.rank()), "dlogits");

    // Against finite differences of the double-precision loss, through the gathered gradient.
    nn::ref::Vec x(logits.f32().begin(), logits.f32().end());
    std::vector<int32_t> tv(targets.data<int32_t>(), targets.data<int32_t>() + kN);
    ce.forward(ctx, take_slice(logits, 2, t, tp.rank()), targets);
    const Tensor local = ce.backward(ctx, 1.0f);
    Tensor gathered = Tensor::empty({t, kN, kVocab / t}, DType::kF32);
    group.allgather(local, gathered);
    std::vector<float> analytic(static_cast<size_t>(kN * kVocab));
    for (int p = 0; p < t; ++p)
      for (int64_t r = 0; r < kN; ++r)
        for (int64_t j = 0; j < kVocab / t; ++j)
          analytic[static_cast<size_t>(r * kVocab + p * (kVocab / t) + j)] =
              gathered.data<float>()[(p * kN + r) * (kVocab / t) + j];
    nn::ref::expect_grad_matches("dlogits", x, nn::ref::sample_indices(x.size(), 64),
                                 [&] { return nn::ref::cross_entropy(x, tv, kVocab); }, analytic);
  }
}

TEST(TensorParallelLayers, SlicesMustDivide) {
  comm::Group group = tp_group(tp_sizes().back());
  const TensorParallel tp{.group = &group};
  if (tp.size() == 1) GTEST_SKIP() << "needs tp > 1";
  EXPECT_THROW(ColumnParallelLinear(4, 4 * tp.size() + 1, tp), ModelError);
  EXPECT_THROW(ColumnParallelLinear(4, 2 * tp.size(), tp, true, 0.02f, 3), ModelError);
  EXPECT_THROW(RowParallelLinear(4 * tp.size() + 1, 4, tp), ModelError);
  // A sequence that does not split over the group names the config key.
  ColumnParallelLinear col(4, 4 * tp.size(), {.group = &group, .sequence_parallel = true});
  RowParallelLinear row(4 * tp.size(), 4, {.group = &group, .sequence_parallel = true});
  nn::materialize(col, 1);
  nn::materialize(row, 1);
  HostContext ctx;
  try {
    ctx.forward(row, Tensor::empty({2, 2 * tp.size() + 1, 4}, DType::kF32));
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.sequence_parallel"), std::string::npos) << e.what();
  }
  row.clear_saved();
}

}  // namespace
}  // namespace zs::tp::layers_test
