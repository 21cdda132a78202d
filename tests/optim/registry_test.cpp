// The optimizer registry (optim/registry.h): every entry is consistent (defaults valid, a factory for
// the elementwise ones and none for the compressed ones, state bytes from its StateSpecs), names
// match in any case, and a config's optimizer section is read strictly with JSON paths in errors.
#include "optim/registry.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "core/errors.h"
#include "core/json.h"
#include "optim/adam.h"
#include "optim/cadam.h"
#include "optim/onebit_adam.h"
#include "tests/optim/optimizer_parse.h"

namespace zs::optim {
namespace {

using test::error_of;
using test::parse;

TEST(Registry, EveryEntryIsConsistent) {
  std::set<std::string> lowered;
  ASSERT_GE(optimizer_types().size(), 5u);
  for (const OptimizerType* t : optimizer_types()) {
    SCOPED_TRACE(std::string(t->name()));
    std::string low(t->name());
    for (char& ch : low) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    EXPECT_TRUE(lowered.insert(low).second) << "two entries match the same name";
    EXPECT_EQ(find_optimizer_type(low), t);
    EXPECT_NO_THROW(t->validate(t->default_params(), "optimizer.params"));
    const OptimizerChoice c(t->name());
    EXPECT_EQ(&c.type(), t);
    EXPECT_GT(c.lr(), 0.0);
    if (t->compressed()) {
      EXPECT_EQ(c.make(), nullptr);
      EXPECT_TRUE(c.state_specs().empty());
      EXPECT_DOUBLE_EQ(c.state_bytes_per_param(), t->compressed()->state_bytes_per_param);
    } else {
      auto o = c.make();
      ASSERT_NE(o, nullptr);
      EXPECT_DOUBLE_EQ(c.state_bytes_per_param(), o->state_bytes_per_param());
      EXPECT_EQ(c.state_specs().size(), o->state_specs().size());
    }
    // Hyper-parameters round-trip through the type-erased params.
    OptimizerChoice d = c;
    d.set_hyper({.lr = 0.125, .betas = {0.5, 0.75}, .weight_decay = 0.25});
    EXPECT_DOUBLE_EQ(d.lr(), 0.125);
    EXPECT_DOUBLE_EQ(d.hyper().betas[1], 0.75);
    EXPECT_DOUBLE_EQ(d.hyper().weight_decay, 0.25);
    EXPECT_DOUBLE_EQ(c.lr(), t->hyper(t->default_params()).lr) << "a copy's params are its own";
  }
  EXPECT_EQ(find_optimizer_type("Rmsprop"), nullptr);
}

TEST(Registry, TheExistingTypesAndTheirTraits) {
  EXPECT_EQ(OptimizerChoice().name(), "AdamW");
  EXPECT_TRUE(OptimizerChoice("adam").params<AdamConfig>().adam_w_mode);
  EXPECT_DOUBLE_EQ(OptimizerChoice("AdamW").state_bytes_per_param(), 8.0);
  EXPECT_DOUBLE_EQ(OptimizerChoice("CAdam").state_bytes_per_param(), 1.125);
  EXPECT_TRUE(OptimizerChoice("CAdam").type().sign_update());
  EXPECT_FALSE(OptimizerChoice("OneBitAdam").compressed_traits()->local_steps);
  EXPECT_TRUE(OptimizerChoice("ZeroOneAdam").compressed_traits()->local_steps);
  EXPECT_DOUBLE_EQ(OptimizerChoice("ZeroOneAdam").state_bytes_per_param(), 16.0);
  EXPECT_NE(OptimizerChoice("ZeroOneAdam").params_if<ZeroOneAdamConfig>(), nullptr);
  EXPECT_EQ(OptimizerChoice("ZeroOneAdam").params_if<OneBitAdamConfig>(), nullptr);
  EXPECT_THROW(OptimizerChoice("Rmsprop"), ConfigError);
  const OptimizerChoice typed("CAdam", CAdamConfig{.lr = 2e-5});
  EXPECT_DOUBLE_EQ(typed.lr(), 2e-5);
  const std::string elementwise = optimizer_type_list(/*elementwise_only=*/true);
  EXPECT_EQ(elementwise.find("OneBitAdam"), std::string::npos) << elementwise;
  EXPECT_NE(elementwise.find("CAdam"), std::string::npos) << elementwise;
}

TEST(Registry, ReadsTheOptimizerSectionStrictly) {
  EXPECT_FALSE(parse(R"({"type": "Adam", "params": {"adam_w_mode": false}})").params<AdamConfig>().adam_w_mode);
  EXPECT_EQ(parse(R"({"type": "onebitadam", "params": {"freeze_step": 7}})").params<OneBitAdamConfig>().freeze_step, 7);
  const std::string not_yet = error_of(R"({"type": "OneBitLamb"})");
  EXPECT_NE(not_yet.find("optimizer.type: optimizer 'OneBitLamb' is not implemented"), std::string::npos) << not_yet;
  const std::string unknown = error_of(R"({"type": "Rmsprop"})");
  EXPECT_NE(unknown.find("optimizer.type: unknown optimizer 'Rmsprop'; use Adam, AdamW"), std::string::npos) << unknown;
  EXPECT_NE(error_of(R"({"type": "AdamW", "params": {"adam_w_mode": true}})").find("optimizer.params.adam_w_mode"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"type": "CAdam", "params": {"eps": 1e-8}})").find("optimizer.params.eps"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "Adam", "params": {"betas": [0.9, 1.0]}})").find("optimizer.params.betas[1]"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "ZeroOneAdam", "params": {"max_grad_norm": 1}})").find("optimizer.params.max_grad_norm"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"params": {}})").find("optimizer.type"), std::string::npos);
  // compression_scale (issue 38): zeroshard's blocks by default, DeepSpeed's per-tensor scales on request.
  EXPECT_EQ(parse(R"({"type": "OneBitAdam"})").params<OneBitAdamConfig>().compression_scale, CompressionScale::kBlock);
  EXPECT_EQ(parse(R"({"type": "OneBitAdam", "params": {"compression_scale": "tensor"}})").params<OneBitAdamConfig>().compression_scale,
            CompressionScale::kTensor);
  EXPECT_EQ(parse(R"({"type": "ZeroOneAdam", "params": {"compression_scale": "tensor"}})").params<ZeroOneAdamConfig>().compression_scale,
            CompressionScale::kTensor);
  const std::string scale = error_of(R"({"type": "OneBitAdam", "params": {"compression_scale": "chunk"}})");
  EXPECT_NE(scale.find("optimizer.params.compression_scale"), std::string::npos) << scale;
  EXPECT_NE(scale.find("tensor"), std::string::npos) << scale;
}

// Resume compatibility is the registry's answer, by state family: the Adam-moment optimizers resume
// from one another (docs/checkpoints.md), every other type only from itself.
TEST(Registry, ResumeCompatibilityFollowsTheStateFamily) {
  const std::set<std::string> adam_family = {"Adam", "AdamW", "OneBitAdam", "ZeroOneAdam"};
  for (const OptimizerType* ours : optimizer_types()) {
    for (const OptimizerType* saved : optimizer_types()) {
      const bool both_adam = adam_family.count(std::string(ours->name())) && adam_family.count(std::string(saved->name()));
      EXPECT_EQ(ours->can_resume_from(saved->name()), both_adam || ours == saved) << ours->name() << " from " << saved->name();
    }
    EXPECT_FALSE(ours->can_resume_from("")) << ours->name();  // a checkpoint that names no optimizer
    EXPECT_FALSE(ours->can_resume_from("SGD")) << ours->name();  // a type zeroshard has no entry for
  }
  EXPECT_TRUE(OptimizerChoice("Lion").can_resume_from("Lion"));
  EXPECT_FALSE(OptimizerChoice("Lion").can_resume_from("AdamW"));
  EXPECT_TRUE(OptimizerChoice("AdamW").can_resume_from("OneBitAdam"));
}

}  // namespace
}  // namespace zs::optim
