// The tensor-parallel layers under mpirun, at tp = 1, 2 and 4 (those dividing the world; the world
// splits into groups of tp consecutive ranks), with sequence parallelism off and on: each layer's
// forward and backward against its tp = 1 nn version on the same inputs, fp32, to 1e-5: outputs and
// input gradients are the slices each rank holds, and every parameter gradient is the slice of the
// tp = 1 gradient, over two passes (gradients accumulate).
#include <gtest/gtest.h>

#include "nn/host_context.h"
#include "nn/layers.h"
#include "tests/nn/reference.h"
#include "tests/tp/tp_test_util.h"
#include "tp/tp.h"

namespace zs::tp {
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
}  // namespace zs::tp
