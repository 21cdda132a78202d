// Module tree: names, canonical order, Context hooks order, lifecycle checks, materialise/init.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "nn/gpt.h"
#include "nn/host_context.h"
#include "nn/param_access.h"
#include "nn/transformer.h"
#include "reference.h"

namespace zs::nn {
namespace {

using memory::DType;
using memory::Tensor;

// Records every hook call as "<hook> <module name>".
class TraceContext : public HostContext {
 public:
  std::vector<std::string> trace;

 protected:
  void before_forward(Module& m) override { trace.push_back("bf " + m.display_name()); }
  void after_forward(Module& m) override { trace.push_back("af " + m.display_name()); }
  void before_backward(Module& m) override { trace.push_back("bb " + m.display_name()); }
  void after_backward(Module& m) override { trace.push_back("ab " + m.display_name()); }
};

GptConfig tiny(bool tied = true) {
  return GptConfig{.n_layer = 1, .d_model = 8, .n_head = 2, .seq_len = 4, .vocab_size = 16, .tied_embeddings = tied};
}

Batch tiny_batch(int64_t B, int64_t T, int64_t vocab) {
  Batch b{Tensor::empty({B, T}, DType::kI32), Tensor::empty({B, T}, DType::kI32)};
  for (int64_t i = 0; i < B * T; ++i) {
    b.inputs.data<int32_t>()[i] = static_cast<int32_t>((i * 5 + 1) % vocab);
    b.targets.data<int32_t>()[i] = static_cast<int32_t>((i * 3 + 2) % vocab);
  }
  return b;
}

TEST(ModuleTest, NamesAndCanonicalOrder) {
  GptModel model(tiny(/*tied=*/false));
  std::vector<std::string> names;
  model.visit_params([&](Parameter& p) { names.push_back(p.full_name()); });
  const std::vector<std::string> expected = {
      "wte", "wpe",
      "blocks.0.ln1.weight", "blocks.0.ln1.bias", "blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias",
      "blocks.0.attn.proj.weight", "blocks.0.attn.proj.bias", "blocks.0.ln2.weight", "blocks.0.ln2.bias",
      "blocks.0.mlp.fc.weight", "blocks.0.mlp.fc.bias", "blocks.0.mlp.proj.weight", "blocks.0.mlp.proj.bias",
      "ln_f.weight", "ln_f.bias", "lm_head.weight"};
  EXPECT_EQ(names, expected);
  std::vector<std::string> modules;
  for (Module* m : model.named_modules()) modules.push_back(m->name());
  EXPECT_EQ(modules.front(), "");
  EXPECT_EQ(modules[3], "blocks.0.ln1");
  EXPECT_EQ(model.find_param("blocks.0.mlp.fc.bias")->shape(), (memory::Shape{32}));
  EXPECT_EQ(model.find_param("nope"), nullptr);
  EXPECT_TRUE(model.find_param("blocks.0.attn.qkv.bias")->has_tag(kTagNoWeightDecay));
  EXPECT_FALSE(model.find_param("blocks.0.attn.qkv.weight")->has_tag(kTagNoWeightDecay));
  EXPECT_EQ(model.params().size(), 2u);  // own parameters only: wte, wpe
  EXPECT_EQ(model.children().size(), 3u);  // blocks, ln_f, lm_head
}

TEST(ModuleTest, HooksRunInCallOrder) {
  GptModel model(tiny());
  materialize(model, 1);
  TraceContext ctx;
  Batch batch = tiny_batch(2, 4, 16);
  ctx.forward_loss(model, batch);
  const std::vector<std::string> fwd = {
      "bf <root>", "bf blocks", "bf blocks.0", "bf blocks.0.ln1", "af blocks.0.ln1", "bf blocks.0.attn",
      "bf blocks.0.attn.qkv", "af blocks.0.attn.qkv", "bf blocks.0.attn.proj", "af blocks.0.attn.proj",
      "af blocks.0.attn", "bf blocks.0.ln2", "af blocks.0.ln2", "bf blocks.0.mlp", "bf blocks.0.mlp.fc",
      "af blocks.0.mlp.fc", "bf blocks.0.mlp.gelu", "af blocks.0.mlp.gelu", "bf blocks.0.mlp.proj",
      "af blocks.0.mlp.proj", "af blocks.0.mlp", "af blocks.0", "af blocks", "bf ln_f", "af ln_f", "af <root>"};
  EXPECT_EQ(ctx.trace, fwd);
  ctx.trace.clear();
  ctx.backward_loss(model, 1.0f);
  const std::vector<std::string> bwd = {
      "bb <root>", "bb ln_f", "ab ln_f", "bb blocks", "bb blocks.0", "bb blocks.0.mlp", "bb blocks.0.mlp.proj",
      "ab blocks.0.mlp.proj", "bb blocks.0.mlp.gelu", "ab blocks.0.mlp.gelu", "bb blocks.0.mlp.fc",
      "ab blocks.0.mlp.fc", "ab blocks.0.mlp", "bb blocks.0.ln2", "ab blocks.0.ln2", "bb blocks.0.attn",
      "bb blocks.0.attn.proj", "ab blocks.0.attn.proj", "bb blocks.0.attn.qkv", "ab blocks.0.attn.qkv",
      "ab blocks.0.attn", "bb blocks.0.ln1", "ab blocks.0.ln1", "ab blocks.0", "ab blocks", "ab <root>"};
  EXPECT_EQ(ctx.trace, bwd);
}

TEST(ModuleTest, SecondForwardBeforeBackwardIsAnError) {
  Linear m(3, 2);
  materialize(m, 1);
  HostContext ctx;
  Tensor x = ref::random_tensor({1, 3}, 1);
  ctx.forward(m, x);
  try {
    ctx.forward(m, x);
    FAIL() << "expected ModelError";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("forward twice"), std::string::npos) << e.what();
  }
  ctx.backward(m, ref::random_tensor({1, 2}, 2));
  EXPECT_THROW(ctx.backward(m, ref::random_tensor({1, 2}, 2)), ModelError);
  // clear_saved() discards a forward; evaluation mode never saves and may repeat.
  ctx.forward(m, x);
  m.clear_saved();
  EXPECT_FALSE(m.forward_pending());
  ctx.forward(m, x);
  m.clear_saved();
  ctx.set_training(false);
  ctx.forward(m, x);
  ctx.forward(m, x);
  EXPECT_EQ(ctx.live_bytes(MemoryUse::kScratch), 0u);
}

TEST(ModuleTest, EvalModeMatchesTrainingForward) {
  GptModel model(tiny());
  materialize(model, 3);
  Batch batch = tiny_batch(2, 4, 16);
  HostContext train;
  HostContext eval(/*training=*/false);
  const float a = eval.forward_loss(model, batch);
  const float b = train.forward_loss(model, batch);
  EXPECT_EQ(a, b);
  EXPECT_EQ(eval.live_bytes(MemoryUse::kActivation), 0u);
}

TEST(ModuleTest, InitFillsAnySubRangeConsistently) {
  for (Init init : {Init::normal(0.5f, 0.02f), Init::uniform(-1.0f, 2.0f), Init::ones(), Init::zeros()}) {
    std::vector<float> full(1000);
    init.fill(full, 0, 42, "blocks.3.attn.qkv.weight");
    std::vector<float> part(300);
    init.fill(part, 517, 42, "blocks.3.attn.qkv.weight");
    for (size_t i = 0; i < part.size(); ++i) ASSERT_EQ(part[i], full[517 + i]) << init.describe();
    std::vector<float> other(1000);
    init.fill(other, 0, 42, "blocks.3.attn.proj.weight");
    if (init.kind() == Init::Kind::kNormal || init.kind() == Init::Kind::kUniform) {
      EXPECT_NE(other, full);
    }
  }
  std::vector<float> u(10000);
  Init::uniform(-1.0f, 2.0f).fill(u, 0, 1, "p");
  for (float v : u) ASSERT_TRUE(v >= -1.0f && v < 2.0f);
}

TEST(ModuleTest, MaterializeUsesTheCounterRng) {
  GptModel model(tiny());
  materialize(model, 77);
  Parameter& qkv = *model.find_param("blocks.0.attn.qkv.weight");
  std::vector<float> expect(static_cast<size_t>(qkv.numel()));
  qkv.init().fill(expect, 0, 77, qkv.full_name());
  auto got = qkv.data().f32();
  EXPECT_TRUE(std::equal(expect.begin(), expect.end(), got.begin()));
  for (float g : qkv.grad().f32()) ASSERT_EQ(g, 0.0f);
  // Residual projections use the GPT-2 scaled std: their spread is smaller than qkv's.
  auto stdev = [](std::span<float> v) {
    double s = 0;
    for (float x : v) s += double(x) * x;
    return std::sqrt(s / static_cast<double>(v.size()));
  };
  EXPECT_NEAR(stdev(qkv.data().f32()), 0.02, 0.004);
  EXPECT_NEAR(stdev(model.find_param("blocks.0.mlp.proj.weight")->data().f32()), 0.02 / std::sqrt(2.0), 0.003);
  for (float w : model.find_param("ln_f.weight")->data().f32()) ASSERT_EQ(w, 1.0f);
  for (float b : model.find_param("blocks.0.mlp.fc.bias")->data().f32()) ASSERT_EQ(b, 0.0f);
}

TEST(ModuleTest, MissingParameterStorageIsReported) {
  Linear m(3, 2);
  assign_names(m);
  HostContext ctx;
  try {
    ctx.forward(m, ref::random_tensor({1, 3}, 1));
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'weight' has no data"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("materialize"), std::string::npos) << e.what();
  }
}

// A layer given the wrong shape by a user's module: the model's mistake, named, not an internal assertion.
TEST(ModuleTest, WrongInputShapeIsAModelError) {
  Linear m(3, 2);
  materialize(m, 1);
  HostContext ctx;
  try {
    ctx.forward(m, ref::random_tensor({1, 4}, 1));
    FAIL() << "expected ModelError";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("Linear: expected last dimension 3, got shape (1, 4)"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("zeroshard bug"), std::string::npos) << e.what();
  }
}

// Weight sharing across modules: a module that reads another module's parameter.
class Borrower : public Module {
 public:
  Borrower() : owner_(add_child<Linear>("owner", 2, 2)), user_(add_child<Linear>("user", 2, 2)) {}
  std::string_view type_name() const override { return "Borrower"; }

 protected:
  Tensor forward(Context& ctx, const Tensor& x) override {
    weight_f32(ctx, owner_.weight());  // used outside its owner's call
    return ctx.forward(user_, x);
  }
  Tensor backward(Context& ctx, const Tensor& dy) override { return ctx.backward(user_, dy); }

 private:
  Linear& owner_;
  Linear& user_;
};

TEST(ModuleTest, AParentUsingItsChildsParameterIsAModelError) {
  Borrower m;
  materialize(m, 1);
  HostContext ctx;
  try {
    ctx.forward(m, ref::random_tensor({1, 2}, 1));
    FAIL() << "expected ModelError";
  } catch (const ModelError& e) {
    // The owner is a child of the running module: reading it is running it without the Context.
    EXPECT_NE(std::string(e.what()).find("module 'owner' (Linear) ran without the Context"), std::string::npos) << e.what();
  }
}

// A module holding a sibling's parameter (a tied weight across two modules).
class Reader : public Module {
 public:
  explicit Reader(Parameter& borrowed) : borrowed_(borrowed) {}
  std::string_view type_name() const override { return "Reader"; }

 protected:
  Tensor forward(Context& ctx, const Tensor& x) override {
    weight_f32(ctx, borrowed_);
    return x;
  }
  Tensor backward(Context&, const Tensor& dy) override { return dy; }

 private:
  Parameter& borrowed_;
};

class Siblings : public Module {
 public:
  Siblings() : lin_(add_child<Linear>("lin", 2, 2)), reader_(add_child<Reader>("reader", lin_.weight())) {}
  std::string_view type_name() const override { return "Siblings"; }

 protected:
  Tensor forward(Context& ctx, const Tensor& x) override { return ctx.forward(reader_, ctx.forward(lin_, x)); }
  Tensor backward(Context& ctx, const Tensor& dy) override { return ctx.backward(lin_, ctx.backward(reader_, dy)); }

 private:
  Linear& lin_;
  Reader& reader_;
};

TEST(ModuleTest, AParameterSharedAcrossModulesIsAModelErrorPointingToSharedWeights) {
  Siblings m;
  materialize(m, 1);
  HostContext ctx;
  try {
    ctx.forward(m, ref::random_tensor({1, 2}, 1));
    FAIL() << "expected ModelError";
  } catch (const ModelError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("module 'reader' (Reader) used parameter 'lin.weight' of another module, 'lin'"), std::string::npos)
        << what;
    EXPECT_NE(what.find("Shared weights"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace zs::nn
