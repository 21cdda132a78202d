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
  // A vocabulary tp does not divide is padded (model.make_vocab_size_divisible_by), with a note.
  const RunConfig padded = parse(R"({"train_batch_size": 8, "model": {"n_layer": 1, "d_model": 32, "n_head": 4,
      "seq_len": 16, "vocab_size": 257, "tensor_parallel_size": 2, "make_vocab_size_divisible_by": 64}})", 2);
  EXPECT_EQ(padded.tensor_parallel.make_vocab_size_divisible_by, 64);
  ASSERT_FALSE(padded.notes.empty());
  EXPECT_CONTAINS(padded.notes.back(), "model.vocab_size: 257 padded to 384");
  EXPECT_CONTAINS(error(R"({"train_batch_size": 8, "model": {"n_layer": 1, "d_model": 32, "n_head": 4, "seq_len": 16,
      "tensor_parallel_size": 2, "make_vocab_size_divisible_by": 0}})", 2), "model.make_vocab_size_divisible_by");
  // MoE with tp: the experts spread over the data-parallel ranks (ranks / tp), which ep_size must divide.
  const RunConfig moe_tp = parse(R"({"train_batch_size": 8, "model": {"n_layer": 2, "d_model": 32, "n_head": 4,
      "seq_len": 16, "tensor_parallel_size": 2, "moe": {"num_experts": 4, "ep_size": 2}}})", 4);
  ASSERT_TRUE(moe_tp.model_moe.has_value());
  EXPECT_EQ(moe_tp.model_moe->moe.ep_size, 2);
  EXPECT_CONTAINS(error(R"({"train_batch_size": 8, "model": {"n_layer": 2, "d_model": 32, "n_head": 4, "seq_len": 16,
      "tensor_parallel_size": 2, "moe": {"num_experts": 4, "ep_size": 2}}})", 2),
                  "model.moe.ep_size: 2 does not divide the number of data-parallel ranks (1 = ranks / "
                  "model.tensor_parallel_size 2)");
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

// model.attention: the fused kernel by default, the plain reference on request; anything else named.
TEST(RunConfig, AttentionKernelKey) {
  auto parse = [](std::string_view text) { return parse_run_config(parse_json_text(text, "cfg.json"), 1); };
  EXPECT_EQ(parse(R"({"train_batch_size": 2, "model": {"n_layer": 1, "d_model": 32, "n_head": 4}})").model->attention,
            nn::AttentionKernel::kFused);
  EXPECT_EQ(parse(R"({"train_batch_size": 2, "model": {"n_layer": 1, "d_model": 32, "n_head": 4,
      "attention": "plain"}})").model->attention, nn::AttentionKernel::kPlain);
  const std::string e = error_of([](const boost::json::value& d) { parse_run_config(d, 1); },
                                 R"({"train_batch_size": 2, "model": {"n_layer": 1, "d_model": 32, "n_head": 4,
      "attention": "flash"}})");
  EXPECT_CONTAINS(e, "model.attention");
  EXPECT_CONTAINS(e, "flash");
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

namespace zs::run {
namespace {

// model.type: "gpt" (default), "gpt2" (GPT-2 small's defaults, max_seq_len) and "llama" (its own keys);
// a key of another type is refused naming it and the type that has it.
TEST(RunConfig, ModelTypes) {
  auto parse = [](std::string_view text) { return parse_run_config(parse_json_text(text, "cfg.json"), 1); };
  const RunConfig gpt = parse(R"({"train_batch_size": 2, "model": {"n_layer": 1, "seq_len": 16}})");
  EXPECT_EQ(gpt.model_type, "gpt");
  EXPECT_EQ(gpt.model->vocab_size, 256);
  EXPECT_EQ(gpt.model_seq_len(), 16);

  const RunConfig gpt2 = parse(R"({"train_batch_size": 2, "model": {"type": "gpt2"}})");
  ASSERT_TRUE(gpt2.model.has_value());
  EXPECT_EQ(gpt2.model->vocab_size, 50257);
  EXPECT_EQ(gpt2.model->n_layer, 12);
  EXPECT_EQ(gpt2.model->d_model, 768);
  EXPECT_EQ(gpt2.model->seq_len, 1024);
  EXPECT_TRUE(gpt2.model->tied_embeddings);
  EXPECT_EQ(nn::gpt_param_count(*gpt2.model), 124439808);  // Hugging Face's gpt2
  const RunConfig small = parse(R"({"train_batch_size": 2, "model": {"type": "gpt2", "n_layer": 1, "d_model": 32,
      "n_head": 4, "d_ff": 40, "norm_eps": 1e-6, "max_seq_len": 24, "vocab_size": 300}})");
  EXPECT_EQ(nn::gpt_d_ff(*small.model), 40);
  EXPECT_FLOAT_EQ(small.model->norm_eps, 1e-6f);
  EXPECT_EQ(small.model_seq_len(), 24);

  const RunConfig llama = parse(R"({"train_batch_size": 2, "model": {"type": "llama", "n_layer": 2, "d_model": 64,
      "n_head": 8, "n_kv_head": 2, "d_ff": 100, "rope_theta": 500000, "norm_eps": 1e-5, "max_seq_len": 48,
      "vocab_size": 1000}})");
  EXPECT_FALSE(llama.model.has_value());
  ASSERT_TRUE(llama.model_llama.has_value());
  EXPECT_EQ(llama.model_llama->n_kv_head, 2);
  EXPECT_EQ(llama.model_llama->d_ff, 100);
  EXPECT_DOUBLE_EQ(llama.model_llama->rope_theta, 500000.0);
  EXPECT_EQ(llama.model_seq_len(), 48);
  const RunConfig mha = parse(R"({"train_batch_size": 2, "model": {"type": "llama", "n_head": 8}})");
  EXPECT_EQ(mha.model_llama->n_kv_head, 8);  // absent: one kv head per query head
  EXPECT_EQ(nn::llama_d_ff(*mha.model_llama), 768);

  EXPECT_CONTAINS(run_error(R"({"train_batch_size": 2, "model": {"type": "gpt2", "rope_theta": 10}})"),
                  "model.rope_theta: applies to model.type \"llama\"");
  EXPECT_CONTAINS(run_error(R"({"train_batch_size": 2, "model": {"type": "gpt2", "seq_len": 10}})"),
                  "model.seq_len: applies to model.type \"gpt\"");
  EXPECT_CONTAINS(run_error(R"({"train_batch_size": 2, "model": {"max_seq_len": 10}})"), "model.max_seq_len: applies");
  EXPECT_CONTAINS(run_error(R"({"train_batch_size": 2, "model": {"type": "llama", "tied_embeddings": true}})"),
                  "model.tied_embeddings: applies");
  EXPECT_CONTAINS(run_error(R"({"train_batch_size": 2, "model": {"type": "llama", "n_head": 4, "n_kv_head": 3}})"),
                  "model.n_kv_head: 3 does not divide model.n_head = 4");
  EXPECT_CONTAINS(run_error(R"({"train_batch_size": 2, "model": {"type": "llama", "moe": {"num_experts": 2}}})"),
                  "model.moe: applies to model.type \"gpt\"");
  EXPECT_CONTAINS(run_error(R"({"train_batch_size": 2, "model": {"type": "llama", "n_kv_head": 1,
      "tensor_parallel_size": 2}})"), "model.tensor_parallel_size: 2 does not divide model.n_kv_head = 1");
  EXPECT_CONTAINS(run_error(R"({"train_batch_size": 2, "model": {"type": "llama", "tensor_parallel_size": 2,
      "sequence_parallel": true}})"), "model.sequence_parallel: not built for model.type \"llama\"");
  EXPECT_EQ(parse_run_config(parse_json_text(R"({"train_batch_size": 2, "model": {"type": "llama",
      "tensor_parallel_size": 2}})"), 2).tensor_parallel.tensor_parallel_size, 2);
  EXPECT_CONTAINS(run_error(R"({"train_batch_size": 2, "model": {"type": "llama", "n_kv_heads": 2}})"),
                  "n_kv_heads");
  EXPECT_CONTAINS(run_error(R"({"train_batch_size": 2, "model": {"type": "bert"}})"), "model.type");
  EXPECT_CONTAINS(run_error(R"({"train_batch_size": 2, "model": {"type": "gpt2", "d_ff": 40, "tensor_parallel_size": 2}})"),
                  "model.d_ff / model.norm_eps: the tensor-parallel GPT builds");
  EXPECT_CONTAINS(run_error(R"({"train_batch_size": 2, "model": {"type": "llama", "max_seq_len": 8},
      "data": {"min_seq_len": 9}})"), "data.min_seq_len: 9 exceeds model.max_seq_len = 8");
}

}  // namespace
}  // namespace zs::run
