// A C++ user's mistakes with the Engine and with their own model, each reported where it happens by a
// typed error naming it (never "this is a zeroshard bug"), at ZeRO stages 0, 2 (staged gradients) and 3. After each, the
// engine either goes on and trains exactly as an engine that never saw the mistake (same parameter
// digest), or is destroyed cleanly (the guarded and ASan builds would catch a stray access). At 2 ranks
// the failed backward has reductions in flight when it is abandoned.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "engine/engine.h"
#include "examples/mlp_model.h"
#include "optim/adam.h"
#include "tests/support/mpi_test_env.h"

namespace zs::engine {
namespace {

using examples::MlpConfig;
using examples::Regressor;
using examples::TeacherData;
using memory::DType;
using memory::Tensor;

constexpr int64_t kBatch = 8;

EngineConfig mlp_config(int stage) {
  EngineConfig c;
  c.batch = resolve_batch(kBatch, 0, 1, test::world().size());
  c.zero.stage = stage;
  c.zero.stage3_param_persistence_threshold = 0;  // every stage-3 parameter is gathered and released
  c.zero.reduce_bucket_size = 256;  // several buckets: some are reducing when a backward fails
  c.optimizer = OptimizerConfig("AdamW", optim::AdamConfig{.lr = 1e-2});
  c.device.memory_mb = 16;
  c.device.backend = "guarded";  // a stray access to device memory after a failure faults
  c.seed = 7;
  return c;
}

// `what` contains every piece of `parts`, and no "zeroshard bug".
void expect_message(const std::string& what, std::initializer_list<const char*> parts) {
  for (const char* p : parts) EXPECT_NE(what.find(p), std::string::npos) << "missing '" << p << "' in: " << what;
  EXPECT_EQ(what.find("zeroshard bug"), std::string::npos) << what;
}

template <typename E, typename F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong error type: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return {};
}

// The user's network, with a switchable mistake in its own forward/backward. `fc1_` has public
// forward/backward so the "called directly" mistake compiles, as it would in a user's own layer.
class PublicLinear : public nn::Linear {
 public:
  using nn::Linear::Linear;
  using nn::Linear::backward;
  using nn::Linear::forward;
};

enum class Mistake { kNone, kSkipChildBackward, kCallChildDirectly, kRunChildTwice };

class UserNet : public nn::Module {
 public:
  explicit UserNet(const MlpConfig& c)
      : fc1_(add_child<PublicLinear>("fc1", c.d_in, c.hidden, true, 0.2f)),
        act_(add_child<nn::Gelu>("act")),
        fc2_(add_child<nn::Linear>("fc2", c.hidden, c.d_out, true, 0.1f)),
        mid_(add_child<nn::Linear>("mid", c.hidden, c.hidden, true, 0.1f)) {}
  std::string_view type_name() const override { return "UserNet"; }
  Mistake mistake = Mistake::kNone;

 protected:
  Tensor forward(nn::Context& ctx, const Tensor& x) override {
    Tensor h = mistake == Mistake::kCallChildDirectly ? fc1_.forward(ctx, x) : ctx.forward(fc1_, x);
    h = ctx.forward(mid_, ctx.forward(act_, h));
    if (mistake == Mistake::kRunChildTwice) h = ctx.forward(mid_, h);  // one instance, two uses
    return ctx.forward(fc2_, h);
  }
  Tensor backward(nn::Context& ctx, const Tensor& dy) override {
    Tensor dh = ctx.backward(act_, ctx.backward(mid_, ctx.backward(fc2_, dy)));
    if (mistake == Mistake::kSkipChildBackward) return dh;  // fc1's backward never runs
    return ctx.backward(fc1_, dh);
  }

 private:
  PublicLinear& fc1_;
  nn::Gelu& act_;
  nn::Linear& fc2_;
  nn::Linear& mid_;
};

// Mean squared error over the outputs, as examples/mlp_model.h's Regressor.
class UserModel : public nn::Model {
 public:
  explicit UserModel(const MlpConfig& c) : net_(add_child<UserNet>("net", c)) {}
  std::string_view type_name() const override { return "UserModel"; }
  UserNet& net() { return net_; }

 protected:
  float forward_loss(nn::Context& ctx, const nn::Batch& batch) override {
    Tensor pred = ctx.forward(net_, batch.inputs);
    Tensor diff = ctx.allocate(pred.shape(), DType::kF32, nn::MemoryUse::kActivation);
    if (ctx.training()) diff_ = diff;
    auto p = pred.f32(), y = batch.targets.f32(), d = diff.f32();
    double sum = 0.0;
    for (size_t i = 0; i < d.size(); ++i) {
      d[i] = p[i] - y[i];
      sum += double(d[i]) * d[i];
    }
    return float(sum / double(d.size()));
  }
  void backward_loss(nn::Context& ctx, float grad_scale) override {
    Tensor dpred = ctx.allocate(diff_.shape(), DType::kF32, nn::MemoryUse::kGradient);
    auto d = diff_.f32(), g = dpred.f32();
    for (size_t i = 0; i < d.size(); ++i) g[i] = 2.0f * grad_scale * d[i] / float(d.size());
    diff_ = {};
    ctx.backward(net_, dpred);
  }
  void clear_own_saved() override { diff_ = {}; }

 private:
  UserNet& net_;
  Tensor diff_;
};

// Fills twice the rows it is asked for (a source that ignores `count`).
class GreedySource final : public BatchSource {
 public:
  explicit GreedySource(TeacherData& data) : data_(data) {}
  void fill(nn::Batch& batch, int64_t step, int64_t first_sample, int64_t count) override {
    data_.fill(batch, step, first_sample, 2 * count);
  }

 private:
  TeacherData& data_;
};

class EngineMisuse : public ::testing::TestWithParam<int> {
 protected:
  const comm::Group& group_ = test::world().group();
  const int64_t micro_ = kBatch / group_.size();
  MlpConfig mlp_;
  TeacherData data_{mlp_, 7, kBatch};

  // Parameters after `steps` clean train_batch calls on a fresh engine.
  std::string clean_digest(int steps) {
    UserModel model(mlp_);
    Engine engine(model, mlp_config(GetParam()), group_);
    for (int i = 0; i < steps; ++i) engine.train_batch(data_);
    return engine.param_digest();
  }
  nn::Batch batch_of_step(int64_t step) {
    nn::Batch b;
    data_.fill(b, step, group_.rank() * micro_, micro_);
    return b;
  }
};

TEST_P(EngineMisuse, CallsOutOfOrderAreUsageErrorsAndChangeNothing) {
  UserModel model(mlp_);
  Engine engine(model, mlp_config(GetParam()), group_);
  expect_message(error_of<UsageError>([&] { engine.step(); }), {"step()", "without a backward()"});
  expect_message(error_of<UsageError>([&] { engine.backward(); }), {"backward()", "without a forward()"});
  const nn::Batch b0 = batch_of_step(0);
  engine.forward(b0);
  expect_message(error_of<UsageError>([&] { engine.forward(b0); }), {"forward() called twice"});
  expect_message(error_of<UsageError>([&] { engine.step(); }), {"forward() without its backward()"});
  expect_message(error_of<UsageError>([&] { engine.train_batch(data_); }), {"middle of an accumulation window"});
  engine.backward();
  EXPECT_TRUE(engine.step());
  expect_message(error_of<UsageError>([&] { engine.step(); }), {"without a backward() since the last step()"});
  engine.train_batch(data_);  // step 1
  EXPECT_EQ(engine.global_step(), 2);
  EXPECT_EQ(engine.param_digest(), clean_digest(2));
}

TEST_P(EngineMisuse, ASourceThatFillsMoreRowsThanAskedIsNamed) {
  UserModel model(mlp_);
  Engine engine(model, mlp_config(GetParam()), group_);
  GreedySource greedy(data_);
  const std::string count = "count " + std::to_string(micro_), rows = std::to_string(2 * micro_) + " rows";
  expect_message(error_of<UsageError>([&] { engine.train_batch(greedy); }), {"BatchSource::fill", count.c_str(), rows.c_str()});
  expect_message(error_of<UsageError>([&] { engine.eval_batch(greedy); }), {"BatchSource::fill", rows.c_str()});
  engine.train_batch(data_);
  engine.train_batch(data_);
  EXPECT_EQ(engine.param_digest(), clean_digest(2));
}

// A model mistake inside backward discards the accumulation window: the engine then trains as if the
// failed micro-batch had never run.
TEST_P(EngineMisuse, ASkippedChildBackwardIsAModelErrorNamingParentAndChild) {
  UserModel model(mlp_);
  Engine engine(model, mlp_config(GetParam()), group_);
  model.net().mistake = Mistake::kSkipChildBackward;
  expect_message(error_of<ModelError>([&] { engine.train_batch(data_); }),
                 {"'net' (UserNet) finished its backward without the backward of its child 'net.fc1'",
                  "ctx.backward(child, dy)"});
  EXPECT_FALSE(model.forward_pending());
  EXPECT_EQ(engine.global_step(), 0);
  model.net().mistake = Mistake::kNone;
  engine.train_batch(data_);
  engine.train_batch(data_);
  EXPECT_EQ(engine.param_digest(), clean_digest(2));
}

TEST_P(EngineMisuse, AChildCalledDirectlyIsAModelErrorAtEveryStage) {
  UserModel model(mlp_);
  Engine engine(model, mlp_config(GetParam()), group_);
  model.net().mistake = Mistake::kCallChildDirectly;
  expect_message(error_of<ModelError>([&] { engine.train_batch(data_); }),
                 {"module 'net.fc1' (Linear) ran without the Context", "'net.fc1.weight'", "while 'net' was running",
                  "ctx.forward(child, x)"});
  model.net().mistake = Mistake::kNone;
  engine.train_batch(data_);
  EXPECT_EQ(engine.param_digest(), clean_digest(1));
}

TEST_P(EngineMisuse, AModuleRunTwiceInOneForwardPointsToSharedWeights) {
  UserModel model(mlp_);
  Engine engine(model, mlp_config(GetParam()), group_);
  model.net().mistake = Mistake::kRunChildTwice;
  expect_message(error_of<ModelError>([&] { engine.train_batch(data_); }),
                 {"module 'net.mid' (Linear) ran forward twice", "Shared weights"});
  model.net().mistake = Mistake::kNone;
  engine.train_batch(data_);
  EXPECT_EQ(engine.param_digest(), clean_digest(1));
}

TEST_P(EngineMisuse, EngineDestroyedRightAfterAModelErrorInBackward) {
  UserModel model(mlp_);
  {
    Engine engine(model, mlp_config(GetParam()), group_);
    model.net().mistake = Mistake::kSkipChildBackward;
    EXPECT_THROW(engine.train_batch(data_), ModelError);
  }
  for (nn::Parameter* p : model.all_params()) EXPECT_FALSE(p->data().defined()) << p->full_name();
}

INSTANTIATE_TEST_SUITE_P(Stages, EngineMisuse, ::testing::Values(0, 2, 3),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

}  // namespace
}  // namespace zs::engine
