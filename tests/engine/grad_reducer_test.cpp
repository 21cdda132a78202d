// GradReducer driven by hand: the hooks the engine calls around each module's backward
// (begin_backward, module_starting, module_done, end_backward) on a chain of nn::Linear modules, with
// gradients written straight into the views the reducer hands out.
//
//   - Real reductions (the MPI world, np 1 2 3): the reduced gradients equal the mean over ranks at
//     stages 0, 1 and 2, with and without overlap_comm and reduce_scatter, over accumulation.
//   - The in-flight bound (a simulated group, whose collectives complete only when waited for, so every
//     launched bucket stays in flight until the bound pushes it out: the worst case): at most
//     kMaxInFlight launched buckets hold staging buffers, and staging_peak_bytes() follows.
//   - Misuse: a module running its backward twice is an InternalError; unused parameters keep zero
//     gradients.
#include "engine/detail/grad_reducer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/errors.h"
#include "engine/flat_layout.h"
#include "engine/partition.h"
#include "memory/allocator.h"
#include "memory/cpu_backend.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "tests/support/mpi_test_env.h"

namespace zs::engine {
namespace {

constexpr int64_t kWidth = 8;
// One Linear(8, 8): weight 64 elements, bias 8 (padded to 32 in the layout).
constexpr size_t kLinearElements = kWidth * kWidth + kWidth;
constexpr size_t kLinearPaddedElements = kWidth * kWidth + FlatLayout::kAlignElements;
constexpr size_t kArenaBytes = 1 << 20;

// A Sequential of `n` Linear(8, 8) modules, named, with its flat layout.
class Chain {
 public:
  explicit Chain(int n) {
    for (int i = 0; i < n; ++i) layers_.push_back(&root_.append<nn::Linear>(kWidth, kWidth));
    nn::assign_names(root_);
    modules_ = root_.named_modules();
    layout_ = std::make_unique<FlatLayout>(root_.all_params());
  }
  nn::Linear& layer(int i) const { return *layers_[static_cast<size_t>(i)]; }
  int size() const { return static_cast<int>(layers_.size()); }
  const std::vector<nn::Module*>& modules() const { return modules_; }
  const FlatLayout& layout() const { return *layout_; }

 private:
  nn::Sequential root_;
  std::vector<nn::Linear*> layers_;
  std::vector<nn::Module*> modules_;
  std::unique_ptr<FlatLayout> layout_;
};

// The gradient rank `rank` computes for element `index` of the flat layout: small integers, so the
// mean over ranks is exact in fp32 up to the division.
float local_grad(int rank, size_t index) { return static_cast<float>((rank + 1) * static_cast<int>(index % 7 + 1)); }
float mean_grad(int ranks, size_t index) {
  return static_cast<float>(index % 7 + 1) * static_cast<float>(ranks + 1) / 2.0f;
}

// The reducer with its buffers: a CpuBackend arena, the gradient buffer (persistent, so the transient
// pool holds only the staging buffers) and, at stages 0-1, the parameters' grad views into it.
class Rig {
 public:
  Rig(Chain& chain, const comm::Group& group, GradReducer::Options options)
      : chain_(chain),
        group_(group),
        backend_(kArenaBytes),
        device_(backend_, kArenaBytes),
        access_(backend_),
        partition_(chain.layout().total(), group.size(), group.rank()),
        stage_(options.stage) {
    const size_t elements = stage_ >= 2 ? std::max<size_t>(1, partition_.mine.size) : chain.layout().total();
    grads_ = device_.allocate(elements * sizeof(float), memory::Category::kGrads, memory::Lifetime::kPersistent);
    backend_.fill_zero(grads_.data(), memory::Tier::kDevice, grads_.size());
    for (const ParamSlot& s : chain.layout().slots()) {
      if (stage_ < 2) {
        s.param->set_grad(memory::Tensor(grads() + s.offset, memory::DType::kF32, s.param->shape()));
      } else {
        s.param->set_grad(memory::Tensor());
      }
    }
    reducer_ = std::make_unique<GradReducer>(options, chain.layout(), partition_, group, device_, memory::DType::kF32,
                                             grads_.data(), chain.modules());
  }
  ~Rig() {
    reducer_.reset();
    for (const ParamSlot& s : chain_.layout().slots()) s.param->set_grad(memory::Tensor());
  }

  GradReducer& reducer() { return *reducer_; }
  const Partition& partition() const { return partition_; }
  float* grads() { return static_cast<float*>(grads_.data()); }
  memory::PoolStats staging() const { return device_.stats().transient; }

  // One module's backward: the hooks around it and its gradients added into the views it was given.
  void run_backward_of(nn::Module& m) {
    reducer_->module_starting(m);
    add_local_grads(m);
    reducer_->module_done(m);
  }
  // A whole backward over the given layers, last first. As the engine does, the window's first
  // backward says the gradient shard is zero (the rig zeroes it once, at construction; so one
  // accumulation window per rig).
  void backward(bool boundary, const std::vector<int>& used) {
    reducer_->begin_backward(boundary, /*reduce=*/true, /*shard_zero=*/first_backward_);
    first_backward_ = false;
    for (auto it = used.rbegin(); it != used.rend(); ++it) run_backward_of(chain_.layer(*it));
    reducer_->end_backward();
  }
  // The next backward starts with `value` in every element of the gradient buffer, and says so.
  void fill_grads(float value) {
    std::fill(grads(), grads() + grads_.size() / sizeof(float), value);
    first_backward_ = value == 0.0f;
  }

 private:
  void add_local_grads(nn::Module& m) {
    for (nn::Parameter* p : m.params()) {
      const ParamSlot* slot = nullptr;
      for (const ParamSlot& s : chain_.layout().slots()) {
        if (s.param == p) slot = &s;
      }
      ASSERT_NE(slot, nullptr);
      ASSERT_TRUE(p->grad().defined()) << p->full_name();
      auto g = p->grad().f32();
      for (size_t i = 0; i < g.size(); ++i) g[i] += local_grad(group_.rank(), slot->offset + i);
    }
  }

  Chain& chain_;
  const comm::Group& group_;
  memory::CpuBackend backend_;
  memory::DeviceAllocator device_;
  memory::DeviceAccess access_;
  Partition partition_;
  int stage_;
  bool first_backward_ = true;
  memory::DeviceBlock grads_;
  std::unique_ptr<GradReducer> reducer_;
};

std::vector<int> all_layers(const Chain& chain) {
  std::vector<int> v;
  for (int i = 0; i < chain.size(); ++i) v.push_back(i);
  return v;
}

// ---------------------------------------------------------------------------------------------------
// Real reductions over the MPI world.

struct ReduceCase {
  int stage;
  bool overlap_comm;
  bool reduce_scatter;
};

class GradReducerReduce : public ::testing::TestWithParam<ReduceCase> {};

// The elements of the flat layout whose reduced value this rank holds afterwards: everything at stage
// 0, its own shard at stages 1+ (stage 1 keeps only its shard of the result).
memory::ShardRange checked_range(int stage, const Partition& partition, size_t total) {
  return stage == 0 ? memory::ShardRange{0, total} : partition.mine;
}

// The reduced value of flat element `index` after `micro_batches` backwards that each add the local
// gradient to the parameters in `used` (padding and unused parameters stay zero).
float expected_grad(const Chain& chain, const std::vector<int>& used, int ranks, size_t index, int micro_batches) {
  for (const ParamSlot& s : chain.layout().slots()) {
    if (index < s.offset || index >= s.offset + s.numel) continue;
    for (int u : used) {
      for (nn::Parameter* p : chain.layer(u).params()) {
        if (p == s.param) return static_cast<float>(micro_batches) * mean_grad(ranks, index);
      }
    }
  }
  return 0.0f;
}

void expect_reduced(Rig& rig, const Chain& chain, int stage, const std::vector<int>& used, int ranks,
                    int micro_batches) {
  const memory::ShardRange range = checked_range(stage, rig.partition(), chain.layout().total());
  const size_t base = stage >= 2 ? rig.partition().mine.offset : 0;
  size_t wrong = 0;
  for (size_t i = range.offset; i < range.end(); ++i) {
    const float want = expected_grad(chain, used, ranks, i, micro_batches);
    const float got = rig.grads()[i - base];
    if (std::abs(got - want) > 1e-5f * std::max(1.0f, std::abs(want))) {
      if (++wrong <= 5) ADD_FAILURE() << "element " << i << ": " << got << ", expected " << want;
    }
  }
  EXPECT_EQ(wrong, 0u) << "of " << range.size << " elements checked";
}

TEST_P(GradReducerReduce, AveragedGradientsAreTheMeanOverRanks) {
  const ReduceCase c = GetParam();
  const comm::Group& world = test::world().group();
  Chain chain(5);
  // 100 elements: every bucket holds one Linear (72 elements) but the next one does not fit.
  Rig rig(chain, world, {.stage = c.stage, .overlap_comm = c.overlap_comm, .reduce_scatter = c.reduce_scatter,
                         .bucket_elements = 100});
  ASSERT_EQ(rig.reducer().bucket_count(), 5u);
  rig.backward(/*boundary=*/true, all_layers(chain));
  rig.reducer().wait_all();
  expect_reduced(rig, chain, c.stage, all_layers(chain), world.size(), 1);
  EXPECT_EQ(rig.staging().live_blocks, 0u) << "staging memory outlived the backward";
}

TEST_P(GradReducerReduce, AccumulatesOverMicroBatches) {
  const ReduceCase c = GetParam();
  const comm::Group& world = test::world().group();
  Chain chain(4);
  // Buckets smaller than a Linear: one parameter each, so one module fills two buckets.
  Rig rig(chain, world, {.stage = c.stage, .overlap_comm = c.overlap_comm, .reduce_scatter = c.reduce_scatter,
                         .bucket_elements = 64});
  ASSERT_EQ(rig.reducer().bucket_count(), 8u);
  rig.backward(/*boundary=*/false, all_layers(chain));
  rig.backward(/*boundary=*/false, all_layers(chain));
  rig.backward(/*boundary=*/true, all_layers(chain));
  rig.reducer().wait_all();
  expect_reduced(rig, chain, c.stage, all_layers(chain), world.size(), 3);
}

TEST_P(GradReducerReduce, UnusedParametersKeepZeroGradients) {
  const ReduceCase c = GetParam();
  const comm::Group& world = test::world().group();
  Chain chain(4);
  // Layers 1 and 3 never run; layer 1 shares its bucket with layer 0 (150 elements: two Linears).
  Rig rig(chain, world, {.stage = c.stage, .overlap_comm = c.overlap_comm, .reduce_scatter = c.reduce_scatter,
                         .bucket_elements = 2 * kLinearElements});
  ASSERT_EQ(rig.reducer().bucket_count(), 2u);
  const std::vector<int> used{0, 2};
  rig.backward(/*boundary=*/true, used);
  rig.reducer().wait_all();
  expect_reduced(rig, chain, c.stage, used, world.size(), 1);
  if (c.stage >= 2) {
    // Every staging view was withdrawn with its bucket.
    for (const ParamSlot& s : chain.layout().slots()) EXPECT_FALSE(s.param->grad().defined()) << s.param->full_name();
  }
}

// Note [reduce-scatter into the shard]: a backward told the shard is not zero adds its part into
// what the shard holds (a later micro-batch of the window); told it is zero, the reduction lands in
// the shard as it is. Both give the mean on top of what was there before.
TEST_P(GradReducerReduce, AddsIntoAShardNotKnownToBeZero) {
  const ReduceCase c = GetParam();
  const comm::Group& world = test::world().group();
  Chain chain(3);
  Rig rig(chain, world, {.stage = c.stage, .overlap_comm = c.overlap_comm, .reduce_scatter = c.reduce_scatter,
                         .bucket_elements = 100});
  rig.fill_grads(0.5f);
  rig.backward(/*boundary=*/true, all_layers(chain));
  rig.reducer().wait_all();
  const memory::ShardRange range = checked_range(c.stage, rig.partition(), chain.layout().total());
  const size_t base = c.stage >= 2 ? rig.partition().mine.offset : 0;
  size_t wrong = 0;
  for (size_t i = range.offset; i < range.end(); ++i) {
    const float want = 0.5f + expected_grad(chain, all_layers(chain), world.size(), i, 1);
    if (std::abs(rig.grads()[i - base] - want) > 1e-5f * std::max(1.0f, std::abs(want)) && ++wrong <= 5) {
      ADD_FAILURE() << "element " << i << ": " << rig.grads()[i - base] << ", expected " << want;
    }
  }
  EXPECT_EQ(wrong, 0u) << "of " << range.size << " elements checked";
}

INSTANTIATE_TEST_SUITE_P(Stages, GradReducerReduce,
                         ::testing::Values(ReduceCase{0, true, true}, ReduceCase{0, false, true},
                                           ReduceCase{1, true, true}, ReduceCase{1, false, true},
                                           ReduceCase{1, true, false}, ReduceCase{2, true, true},
                                           ReduceCase{2, false, true}, ReduceCase{2, true, false},
                                           ReduceCase{3, true, true}),
                         [](const ::testing::TestParamInfo<ReduceCase>& info) {
                           return "stage" + std::to_string(info.param.stage) +
                                  (info.param.overlap_comm ? "_overlap" : "_nooverlap") +
                                  (info.param.reduce_scatter ? "_reducescatter" : "_allreduce");
                         });

// ---------------------------------------------------------------------------------------------------
// The in-flight bound, over a simulated group of four.

TEST(GradReducerInFlight, AtMostMaxInFlightLaunchedBucketsHoldStaging) {
  const comm::Group group = comm::Group::simulated(1, 4);
  Chain chain(6);
  Rig rig(chain, group, {.stage = 2, .overlap_comm = true, .bucket_elements = kLinearElements});
  ASSERT_EQ(rig.reducer().bucket_count(), 6u);  // one Linear per bucket
  constexpr size_t kBucketBytes = kLinearPaddedElements * sizeof(float);
  constexpr size_t kMax = GradReducer::kMaxInFlight;

  rig.reducer().begin_backward(/*boundary=*/false);
  size_t done = 0;
  for (int i = chain.size() - 1; i >= 0; --i) {
    rig.reducer().module_starting(chain.layer(i));
    // The launched buckets still held, plus the one this module fills.
    EXPECT_EQ(rig.staging().live_blocks, std::min(done, kMax) + 1) << "before the backward of layer " << i;
    rig.reducer().module_done(chain.layer(i));
    ++done;
    // Nothing completes on its own: the bound alone retired the older buckets.
    EXPECT_EQ(rig.staging().live_blocks, std::min(done, kMax)) << "after the backward of layer " << i;
  }
  rig.reducer().end_backward();
  EXPECT_EQ(rig.staging().live_blocks, 0u);

  EXPECT_EQ(rig.reducer().staging_peak_bytes(), (kMax + 1) * kBucketBytes);
  EXPECT_LT(rig.reducer().staging_peak_bytes(), rig.reducer().bucket_count() * kBucketBytes);
  EXPECT_EQ(rig.staging().peak_allocated_bytes, rig.reducer().staging_peak_bytes());
}

TEST(GradReducerInFlight, BoundHoldsWhenAModuleFillsSeveralBuckets) {
  const comm::Group group = comm::Group::simulated(0, 3);
  Chain chain(5);
  // One parameter per bucket: every module fills two buckets (its bias, then its weight).
  Rig rig(chain, group, {.stage = 3, .overlap_comm = true, .bucket_elements = kWidth * kWidth});
  ASSERT_EQ(rig.reducer().bucket_count(), 10u);
  constexpr size_t kMax = GradReducer::kMaxInFlight;
  constexpr size_t kLargestBucketBytes = kWidth * kWidth * sizeof(float);
  for (int step = 0; step < 2; ++step) {
    rig.reducer().begin_backward(/*boundary=*/step == 1);
    for (int i = chain.size() - 1; i >= 0; --i) {
      rig.reducer().module_starting(chain.layer(i));
      EXPECT_LE(rig.staging().live_blocks, kMax + 2);
      rig.reducer().module_done(chain.layer(i));
      // Every bucket this module filled was launched; at most kMaxInFlight are still held.
      EXPECT_LE(rig.staging().live_blocks, kMax) << "after the backward of layer " << i;
    }
    rig.reducer().end_backward();
    EXPECT_EQ(rig.staging().live_blocks, 0u);
  }
  EXPECT_LE(rig.reducer().staging_peak_bytes(), (kMax + 2) * kLargestBucketBytes);
  EXPECT_LT(rig.reducer().staging_peak_bytes(), chain.layout().total() * sizeof(float));
}

// At stages 0-1 nothing is staged: the buckets reduce in the gradient buffer itself.
TEST(GradReducerInFlight, NoStagingAtStagesZeroAndOne) {
  const comm::Group group = comm::Group::simulated(0, 2);
  for (int stage : {0, 1}) {
    Chain chain(3);
    Rig rig(chain, group, {.stage = stage, .bucket_elements = kLinearElements});
    rig.backward(/*boundary=*/true, all_layers(chain));
    rig.reducer().wait_all();
    EXPECT_EQ(rig.reducer().staging_peak_bytes(), 0u) << "stage " << stage;
    EXPECT_EQ(rig.staging().alloc_count, 0u) << "stage " << stage;
  }
}

// With overlap_comm off, stage 2+ still launches a full bucket, and reduces it at once (as DeepSpeed
// does): otherwise every bucket's staging buffer would be alive at once, the whole gradient staged.
TEST(GradReducerInFlight, StagingIsBoundedWithoutOverlapComm) {
  const comm::Group group = comm::Group::simulated(0, 2);
  Chain chain(6);
  Rig rig(chain, group, {.stage = 2, .overlap_comm = false, .bucket_elements = kLinearElements});
  rig.backward(/*boundary=*/true, all_layers(chain));
  EXPECT_LE(rig.reducer().staging_peak_bytes(),
            (GradReducer::kMaxInFlight + 1) * kLinearPaddedElements * sizeof(float));
}

// ---------------------------------------------------------------------------------------------------
// Misuse.

TEST(GradReducerMisuse, AModuleRunningItsBackwardTwiceIsAnInternalError) {
  const comm::Group group = comm::Group::simulated(0, 2);
  for (int stage : {0, 1, 2, 3}) {
    for (bool overlap : {true, false}) {
      Chain chain(3);
      Rig rig(chain, group, {.stage = stage, .overlap_comm = overlap, .bucket_elements = kLinearElements});
      rig.reducer().begin_backward(/*boundary=*/true);
      rig.run_backward_of(chain.layer(2));
      try {
        rig.run_backward_of(chain.layer(2));
        ADD_FAILURE() << "stage " << stage << (overlap ? " overlap" : "") << ": a second backward went unnoticed";
      } catch (const InternalError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("2."), std::string::npos) << "the message names the module or parameter: " << what;
      }
    }
  }
}

TEST(GradReducerMisuse, StageTwoGradientsAreAlwaysReduced) {
  const comm::Group group = comm::Group::simulated(0, 2);
  Chain chain(2);
  Rig rig(chain, group, {.stage = 2, .bucket_elements = kLinearElements});
  EXPECT_THROW(rig.reducer().begin_backward(/*boundary=*/true, /*reduce=*/false), InternalError);
}

// Stages 0-1 with `reduce` off keep each rank's local gradients (the compressed optimizers).
TEST(GradReducerLocal, ReduceOffKeepsLocalGradients) {
  const comm::Group group = comm::Group::simulated(1, 2);
  Chain chain(3);
  Rig rig(chain, group, {.stage = 0, .bucket_elements = kLinearElements});
  rig.reducer().begin_backward(/*boundary=*/true, /*reduce=*/false);
  for (int i = chain.size() - 1; i >= 0; --i) rig.run_backward_of(chain.layer(i));
  rig.reducer().end_backward();
  rig.reducer().wait_all();
  for (const ParamSlot& s : chain.layout().slots()) {
    for (size_t i = 0; i < s.numel; ++i) ASSERT_EQ(rig.grads()[s.offset + i], local_grad(1, s.offset + i));
  }
}

}  // namespace
}  // namespace zs::engine
