// run::parse_run_config: the program's sections (model, model.moe, data, log) read in the engine
// parser's one pass. The whole contract (every key, every message) is in tests/engine/config_test.cpp
// and the e2e bad-config cases; here: what the split itself must keep.
#include "run/run_config.h"

#include <gtest/gtest.h>

#include "core/json.h"

namespace zs::run {
namespace {

#define EXPECT_CONTAINS(haystack, needle) EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << haystack

template <typename Parse>
std::string error_of(Parse&& parse, std::string_view text) {
  try {
    parse(parse_json_text(text, "cfg.json"));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
std::string run_error(std::string_view text) {
  return error_of([](const boost::json::value& d) { parse_run_config(d, 2); }, text);
}
std::string engine_error(std::string_view text) {
  return error_of([](const boost::json::value& d) { engine::parse_config(d, 2); }, text);
}

TEST(RunConfig, ReadsTheProgramsSectionsBesideTheEngines) {
  const RunConfig c = parse_run_config(parse_json_text(R"({"train_batch_size": 4, "seed": 7,
      "model": {"n_layer": 2, "d_model": 32, "n_head": 2, "seq_len": 16, "moe": {"num_experts": 4, "ep_size": 2}},
      "data": {"seed": 11, "min_seq_len": 8}, "log": {"level": "warn"}, "zero_optimization": {"stage": 2}})"), 2);
  ASSERT_TRUE(c.model.has_value());
  EXPECT_EQ(c.model->n_layer, 2);
  EXPECT_FALSE(c.model->tied_embeddings);  // the GPT-MoE's head is untied unless the config says so
  ASSERT_TRUE(c.model_moe.has_value());
  EXPECT_EQ(c.model_moe->moe.rng_seed, 7u);  // the gates follow the run's seed, read by the engine
  EXPECT_EQ(c.data.min_seq_len, 8);
  EXPECT_EQ(c.log.level, "warn");
  EXPECT_EQ(c.zero.stage, 2);               // the engine's part
  EXPECT_EQ(c.data_seed, std::optional<uint64_t>(11));  // recorded by the engine's checkpoints
  EXPECT_EQ(parse_run_config(parse_json_text(R"({"train_batch_size": 4})"), 1).data_seed, std::nullopt);
}

// model.tensor_parallel_size and model.sequence_parallel (Megatron's names): the batch arithmetic is over
// the data-parallel size ranks / tp; errors name the keys.
TEST(RunConfig, TensorParallelKeys) {
  auto parse = [](std::string_view text, int ranks) { return parse_run_config(parse_json_text(text, "cfg.json"), ranks); };
  const RunConfig c = parse(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
      "model": {"n_layer": 1, "d_model": 32, "n_head": 4, "seq_len": 16, "tensor_parallel_size": 2,
                "sequence_parallel": true}})", 8);
  EXPECT_EQ(c.tensor_parallel.tensor_parallel_size, 2);
  EXPECT_TRUE(c.tensor_parallel.sequence_parallel);
  EXPECT_EQ(c.batch.gradient_accumulation_steps, 1);  // 8 = 2 per rank x 1 x 4 data-parallel ranks
  const RunConfig one = parse(R"({"train_batch_size": 8, "model": {"n_layer": 1, "d_model": 32, "n_head": 4,
      "seq_len": 16, "sequence_parallel": true}})", 2);
  EXPECT_EQ(one.tensor_parallel.tensor_parallel_size, 1);
  ASSERT_FALSE(one.notes.empty());
  EXPECT_CONTAINS(one.notes.back(), "model.sequence_parallel: accepted; a no-op at model.tensor_parallel_size 1");

  auto error = [&](std::string_view text, int ranks) {
    return error_of([&](const boost::json::value& d) { parse_run_config(d, ranks); }, text);
  };
  EXPECT_CONTAINS(error(R"({"train_batch_size": 8, "model": {"n_layer": 1, "d_model": 32, "n_head": 4, "seq_len": 16,
      "tensor_parallel_size": 2}})", 3), "model.tensor_parallel_size: 2 does not divide the world size (ranks) = 3");
  EXPECT_CONTAINS(error(R"({"train_batch_size": 8, "model": {"n_layer": 1, "d_model": 32, "n_head": 4, "seq_len": 16,
      "tensor_parallel_size": 0}})", 2), "model.tensor_parallel_size");
  EXPECT_CONTAINS(error(R"({"train_batch_size": 8, "model": {"n_layer": 1, "d_model": 32, "n_head": 4, "seq_len": 16,
      "tensor_parallel_size": 2, "moe": {"num_experts": 2}}})", 2),
                  "model.moe: MoE layers with model.tensor_parallel_size 2 are not supported yet");
  EXPECT_CONTAINS(error(R"({"train_batch_size": 8, "model": {"n_layer": 1, "d_model": 32, "n_head": 4, "seq_len": 16,
      "tensor_parallel_size": 2, "sequence_parallel": true}, "data": {"min_seq_len": 8}})", 2),
                  "data.min_seq_len: varying sequence lengths are not supported with model.sequence_parallel");
  // partition_activations at tp 2: sequence parallelism's shards are that split (noted); without it, refused.
  const RunConfig split = parse(R"({"train_batch_size": 8, "activation_checkpointing": {"partition_activations": true},
      "model": {"n_layer": 1, "d_model": 32, "n_head": 4, "seq_len": 16, "tensor_parallel_size": 2,
                "sequence_parallel": true}})", 2);
  ASSERT_FALSE(split.notes.empty());
  EXPECT_CONTAINS(split.notes.back(), "keeps its input as this rank's sequence shard, 1/2 of the activation");
  EXPECT_CONTAINS(error(R"({"train_batch_size": 8, "activation_checkpointing": {"partition_activations": true},
      "model": {"n_layer": 1, "d_model": 32, "n_head": 4, "seq_len": 16, "tensor_parallel_size": 2}})", 2),
                  "activation_checkpointing.partition_activations: true at model.tensor_parallel_size 2 would split");
  // The batch is checked against the data-parallel size: 6 samples over 2 data-parallel ranks of 4.
  EXPECT_CONTAINS(error(R"({"train_batch_size": 6, "train_micro_batch_size_per_gpu": 2, "model": {"n_layer": 1,
      "d_model": 32, "n_head": 4, "seq_len": 16, "tensor_parallel_size": 2}})", 4), "x data-parallel size (2)");
}

// data.format: a text by default; token files need a path; a wrong name gets a did-you-mean.
TEST(RunConfig, DataFormat) {
  auto parse = [](std::string_view text) { return parse_run_config(parse_json_text(text, "cfg.json"), 1); };
  EXPECT_EQ(parse(R"({"train_batch_size": 1})").data.format, nn::DataFormat::kText);
  const RunConfig c = parse(R"({"train_batch_size": 1, "data": {"format": "megatron", "path": "corpus_text_document"}})");
  EXPECT_EQ(c.data.format, nn::DataFormat::kMegatron);
  EXPECT_EQ(c.data.path, "corpus_text_document");
  EXPECT_EQ(parse(R"({"train_batch_size": 1, "data": {"format": "llmc", "path": "a_*.bin"}})").data.format,
            nn::DataFormat::kLlmc);
  EXPECT_CONTAINS(run_error(R"({"train_batch_size": 2, "data": {"format": "llmc"}})"),
                  "data.path: data.format \"llmc\" needs the path of its token files");
  EXPECT_CONTAINS(run_error(R"({"train_batch_size": 2, "data": {"format": "megatrom", "path": "x"}})"), "data.format");
  EXPECT_CONTAINS(run_error(R"({"train_batch_size": 2, "data": {"format": "megatrom", "path": "x"}})"), "megatron");
}

TEST(RunConfig, TheEngineAloneRefusesTheProgramsSectionsAsUnknown) {
  EXPECT_CONTAINS(engine_error(R"({"train_batch_size": 4, "model": {"n_layer": 2}})"), "model: unknown key");
  EXPECT_CONTAINS(engine_error(R"({"train_batch_size": 4, "log": {"level": "warn"}})"), "log: unknown key");
  // ...and the run's parser still suggests the sections it reads.
  EXPECT_CONTAINS(run_error(R"({"train_batch_size": 4, "modle": {}})"), "did you mean 'model'");
  EXPECT_CONTAINS(run_error(R"({"train_batch_size": 4, "data": {"pth": "x"}})"), "data.pth: unknown key; did you mean 'path'");
}

TEST(RunConfig, TheFirstProblemIsTheSameWhicheverPartReadsASection) {
  // The order of checks is the one parse_config had when it read every section: device, model, data,
  // comm, log, then the root's unknown keys, then the batch arithmetic.
  EXPECT_CONTAINS(run_error(R"({"train_batch_size": 4, "comm": {"timeout_s": -1}, "model": {"n_layer": 0}})"),
                  "model.n_layer");
  EXPECT_CONTAINS(run_error(R"({"train_batch_size": 4, "device": {"memory_mb": 0}, "model": {"n_layer": 0}})"),
                  "device.memory_mb");
  EXPECT_CONTAINS(run_error(R"({"train_batch_size": 4, "comm": {"timeout_s": -1}, "log": {"level": "loud"}})"),
                  "comm.timeout_s");
  EXPECT_CONTAINS(run_error(R"({"train_batch_size": 4, "log": {"level": "loud"}, "bogus": 1})"), "log.level");
  EXPECT_CONTAINS(run_error(R"({"train_batch_size": 3, "data": {"eval_batches": 2}})"), "data.eval_batches");
}

}  // namespace
}  // namespace zs::run
