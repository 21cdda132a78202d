// tp_mlp: your own tensor-parallel model (tp/, docs/tensor_parallel.md), trained with plain SGD.
//
//   build/release/examples/tp_mlp [STEPS] [--sequence-parallel]            # tp = 1
//   mpirun -np 2 build/release/examples/tp_mlp 20 --sequence-parallel      # tp = 2
//
// Every rank of the world forms one tensor-parallel group (tp = the world size; comm::Topology builds
// it). The model is a two-layer MLP regressor, fc column-parallel and proj row-parallel, trained by
// mean squared error to imitate a fixed "teacher" function; every rank sees the same batch, holds its
// slice of fc and proj, and prints (rank 0) the same losses at every tp degree, to fp32 rounding:
// the slices start as the tp = 1 model's tensors (nn::materialize) and SGD updates each slice alone.
// With --sequence-parallel the inputs are split along the sequence before fc (which gathers them) and
// proj's output comes back as this rank's sequence shard; the loss sums the shards over the group.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "comm/topology.h"
#include "comm/world.h"
#include "core/rng.h"
#include "launch/launch.h"
#include "nn/nn.h"
#include "tp/tp.h"

namespace {

using zs::memory::DType;
using zs::memory::Tensor;
namespace nn = zs::nn;
namespace tp = zs::tp;

constexpr int64_t kBatch = 4, kSeq = 8, kD = 16, kHidden = 64;

class TpRegressor : public nn::Model {
 public:
  TpRegressor(tp::TensorParallel par)
      : par_(par),
        fc_(add_child<tp::ColumnParallelLinear>("fc", kD, kHidden, par)),      // weight (hidden/tp, d)
        gelu_(add_child<nn::Gelu>("gelu")),
        proj_(add_child<tp::RowParallelLinear>("proj", kHidden, kD, par)) {}  // weight (d, hidden/tp)
  std::string_view type_name() const override { return "TpRegressor"; }

 protected:
  // inputs, targets (B, T, d) fp32, the same on every rank.
  float forward_loss(nn::Context& ctx, const nn::Batch& batch) override {
    const bool shard = par_.sharded_sequence();
    // With sequence parallelism, fc takes this rank's positions (it gathers the rest itself).
    const Tensor x = shard ? tp::scatter_sequence(ctx, par_, batch.inputs, nn::MemoryUse::kScratch) : batch.inputs;
    const Tensor y = ctx.forward(proj_, ctx.forward(gelu_, ctx.forward(fc_, x)));  // whole, or this rank's shard
    targets_ = shard ? tp::scatter_sequence(ctx, par_, batch.targets, nn::MemoryUse::kActivation) : batch.targets;
    diff_ = ctx.allocate(y.shape(), DType::kF32, nn::MemoryUse::kActivation);
    float sum[1] = {0.0f};
    for (int64_t i = 0; i < y.numel(); ++i) {
      diff_.data<float>()[i] = y.data<float>()[i] - targets_.data<float>()[i];
      sum[0] += diff_.data<float>()[i] * diff_.data<float>()[i];
    }
    if (shard) tp::all_reduce(par_, Tensor::of(sum));  // the shards' squares, summed over the group
    return sum[0] / static_cast<float>(batch.targets.numel());
  }
  void backward_loss(nn::Context& ctx, float grad_scale) override {
    Tensor dy = ctx.allocate(diff_.shape(), DType::kF32, nn::MemoryUse::kGradient);
    const float s = 2.0f * grad_scale / static_cast<float>(kBatch * kSeq * kD);
    for (int64_t i = 0; i < dy.numel(); ++i) dy.data<float>()[i] = s * diff_.data<float>()[i];
    diff_ = targets_ = {};
    ctx.backward(fc_, ctx.backward(gelu_, ctx.backward(proj_, dy)));
  }
  void clear_own_saved() override { diff_ = targets_ = {}; }

 private:
  tp::TensorParallel par_;
  tp::ColumnParallelLinear& fc_;
  nn::Gelu& gelu_;
  tp::RowParallelLinear& proj_;
  Tensor diff_, targets_;
};

// Step `step`'s batch, the same on every rank: x random, target = the teacher's function of x.
nn::Batch make_batch(int64_t step) {
  nn::Batch b{Tensor::empty({kBatch, kSeq, kD}, DType::kF32), Tensor::empty({kBatch, kSeq, kD}, DType::kF32)};
  zs::CounterRng rng(static_cast<uint64_t>(step), "tp_mlp.inputs");
  float* x = b.inputs.data<float>();
  float* t = b.targets.data<float>();
  for (int64_t i = 0; i < b.inputs.numel(); ++i) x[i] = rng.normal(static_cast<uint64_t>(i));
  for (int64_t r = 0; r < kBatch * kSeq; ++r) {
    for (int64_t j = 0; j < kD; ++j) t[r * kD + j] = std::sin(x[r * kD + j] + 0.5f * x[r * kD + (j + 1) % kD]);
  }
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  zs::launch::select_blas_kernels(argv);  // first: may re-exec with faster OpenBLAS kernels
  int64_t steps = 20;
  bool sequence_parallel = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    char* end = nullptr;
    const long long n = std::strtoll(arg.c_str(), &end, 10);
    if (arg == "--sequence-parallel") {
      sequence_parallel = true;
    } else if (*end == '\0' && n >= 1) {
      steps = n;
    } else {
      std::fprintf(stderr, "usage: %s [STEPS] [--sequence-parallel]\n", argv[0]);
      return 2;
    }
  }
  std::optional<zs::comm::World> world;
  try {
    world.emplace(zs::comm::World::create());  // under mpirun: MPI; otherwise a world of one
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tp_mlp: error: %s\n", e.what());
    return 1;
  }
  zs::launch::set_blas_threads(zs::launch::local_rank_count());  // share the cores between local ranks
  try {
    // One tensor-parallel group of every rank (a bad degree is a ConfigError naming the key).
    zs::comm::Topology topo(world->group(), {.tensor_parallel_size = world->size()});
    TpRegressor model({.group = &topo.tensor_parallel(), .sequence_parallel = sequence_parallel});
    nn::materialize(model, /*seed=*/1);  // each rank: its slices of the tp = 1 model's initial tensors
    nn::HostContext ctx;
    constexpr float kLr = 0.2f;
    float first = 0.0f, last = 0.0f;
    for (int64_t step = 0; step < steps; ++step) {
      const float loss = ctx.forward_loss(model, make_batch(step));  // the same on every rank
      ctx.backward_loss(model, 1.0f);
      // SGD on this rank's slices (and on proj.bias: whole, with the same gradient on every rank).
      model.visit_params([&](nn::Parameter& p) {
        float* w = p.data().data<float>();
        const float* g = p.grad().data<float>();
        for (int64_t i = 0; i < p.numel(); ++i) w[i] -= kLr * g[i];
      });
      nn::zero_grads(model);
      if (step == 0) first = loss;
      last = loss;
      if (world->rank() == 0) std::printf("step %3lld  loss %.6f\n", static_cast<long long>(step), loss);
    }
    const bool fell = last < first;
    if (world->rank() == 0) {
      std::printf("tp %d%s: loss %s from %.6f to %.6f in %lld steps\n", world->size(),
                  sequence_parallel ? " with sequence parallelism" : "", fell ? "fell" : "did NOT fall", first, last,
                  static_cast<long long>(steps));
      std::fflush(stdout);
    }
    return fell ? 0 : 1;
  } catch (const std::exception& e) {
    zs::comm::World::abort(e.what(), 1);  // ends every rank: others may be blocked in a collective
  }
}
