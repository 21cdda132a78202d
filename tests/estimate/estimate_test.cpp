// The memory estimator's rules: per-stage formulas for every dtype and world size (uneven shards
// included), agreement with the ZeRO paper's figures, and layout-exact numbers for a GPT.
#include "estimate/estimate.h"
#include "run/run_config.h"

#include <gtest/gtest.h>

#include <boost/json/serialize.hpp>

#include "engine/flat_layout.h"
#include "memory/shard.h"
#include "nn/gpt.h"
#include "optim/onebit_adam.h"

namespace zs::engine {
namespace {

constexpr uint64_t kAlign = FlatLayout::kAlignElements;

// The ZeRO paper's per-rank bytes without shard rounding, as (replicated x Ψ, sharded x Ψ / R).
struct Paper {
  uint64_t replicated, sharded;
};
Paper paper(int stage, Precision p) {
  const bool fp32 = p == Precision::kFp32;
  // bf16/fp16 + Adam: 2 + 2 + 12;  fp32 + Adam: 4 + 4 + 8.
  static constexpr Paper kMixed[] = {{16, 0}, {4, 12}, {2, 14}, {0, 16}};
  static constexpr Paper kFp32[] = {{16, 0}, {8, 8}, {4, 12}, {0, 16}};
  return fp32 ? kFp32[stage] : kMixed[stage];
}

TEST(Estimate, ParamsAreRoundedUpToTheLayoutAlignment) {
  EXPECT_EQ(estimate_input_for_params(1, 1, Precision::kBf16).model.flat_elements, 32u);
  EXPECT_EQ(estimate_input_for_params(32, 1, Precision::kBf16).model.flat_elements, 32u);
  EXPECT_EQ(estimate_input_for_params(33, 1, Precision::kBf16).model.flat_elements, 64u);
  EXPECT_EQ(estimate_input_for_params(1'500'000'000, 1, Precision::kBf16).model.flat_elements, 1'500'000'000u);
  EXPECT_THROW(estimate_input_for_params(0, 1, Precision::kBf16), ConfigError);
}

TEST(Estimate, EvenShardsMatchThePaperExactly) {
  const int R = 4;
  const uint64_t psi = kAlign * R * 1000;  // divisible by R x 32: no rounding at all
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    EstimateInput in = estimate_input_for_params(psi, R, p);
    for (int stage = 0; stage <= 3; ++stage) {
      const Paper f = paper(stage, p);
      for (int r = 0; r < R; ++r) {
        EXPECT_EQ(model_state_bytes(in, stage, r).total(), f.replicated * psi + f.sharded * psi / R)
            << precision_name(p) << " stage " << stage << " rank " << r;
      }
    }
  }
}

TEST(Estimate, CategoriesFollowTheEngineRules) {
  const uint64_t psi = 6400;
  const int R = 2;
  const uint64_t S = psi / R;
  // bf16: b = 2, master 4, Adam 8.
  EstimateInput bf = estimate_input_for_params(psi, R, Precision::kBf16);
  EXPECT_EQ(model_state_bytes(bf, 0, 1), (StateBytes{2 * psi, 2 * psi, 12 * psi}));
  EXPECT_EQ(model_state_bytes(bf, 1, 1), (StateBytes{2 * psi, 2 * psi, 12 * S}));
  EXPECT_EQ(model_state_bytes(bf, 2, 1), (StateBytes{2 * psi, 2 * S, 12 * S}));
  EXPECT_EQ(model_state_bytes(bf, 3, 1), (StateBytes{2 * S, 2 * S, 12 * S}));
  // fp32: b = 4, no separate master copy, Adam 8.
  EstimateInput f32 = estimate_input_for_params(psi, R, Precision::kFp32);
  EXPECT_EQ(model_state_bytes(f32, 0, 0), (StateBytes{4 * psi, 4 * psi, 8 * psi}));
  EXPECT_EQ(model_state_bytes(f32, 1, 0), (StateBytes{4 * psi, 4 * psi, 8 * S}));
  EXPECT_EQ(model_state_bytes(f32, 2, 0), (StateBytes{4 * psi, 4 * S, 8 * S}));
  EXPECT_EQ(model_state_bytes(f32, 3, 0), (StateBytes{4 * S, 4 * S, 8 * S}));
}

TEST(Estimate, CompressedErrorFeedbackFollowsTheCompressionScale) {
  // fp32 one-bit Adam at stage 0 over R = 3, Ψ = 6400: variance and momentum 4Ψ each; the error
  // feedback 4 (Ψ + chunk) with scale blocks (chunk: ceil(6400/3) rounded up to 256 = 2304), and per
  // tensor 4 (P + P/R) with the one tensor --params knows, padded to a multiple of 3 x 24 (P = 6408).
  const uint64_t psi = 6400;
  EstimateInput in = estimate_input_for_params(psi, 3, Precision::kFp32);
  in.compressed = true;
  EXPECT_EQ(model_state_bytes(in, 0, 1).optimizer, 4 * psi + 4 * psi + 4 * (psi + 2304));
  in.per_tensor_scales = true;
  EXPECT_EQ(model_state_bytes(in, 0, 1).optimizer, 4 * psi + 4 * psi + 4 * (6408 + 6408 / 3));
  // A GPT's exact layout: every parameter tensor padded on its own (the engine's own figure in
  // estimate_agreement_test, EstimateCompressedAgreement).
  zs::run::RunConfig cfg;
  cfg.model = nn::GptConfig{.n_layer = 1, .d_model = 30, .n_head = 3, .seq_len = 16, .vocab_size = 256};
  cfg.optimizer = OptimizerConfig("OneBitAdam", optim::OneBitAdamConfig{.compression_scale = optim::CompressionScale::kTensor});
  cfg.batch = resolve_batch(0, 3, 1, 3);
  cfg.precision = Precision::kFp32;
  const EstimateInput gpt = estimate_input_for_config(cfg, 3);
  EXPECT_TRUE(gpt.per_tensor_scales);
  uint64_t padded = 0;
  for (const memory::ShardRange& t : gpt.model.tensors) padded += (t.size + 71) / 72 * 72;
  const uint64_t gpsi = gpt.model.flat_elements;
  EXPECT_EQ(model_state_bytes(gpt, 0, 0).optimizer, 8 * gpsi + 4 * (padded + padded / 3));
}

TEST(Estimate, ExpertLayoutsAreShardedOverTheirExpertDataParallelGroup) {
  // Dense Ψ over R = 4 ranks, an expert layout Ψ_E with E = 2 over the 2 ranks {i, i+2} (rank r is
  // its rank r / 2), bf16 + Adam (2 + 2 + 12 bytes per element, whole or shard as the stage says).
  const uint64_t psi = 6400, psi_e = 3200;
  const int R = 4, E = 2;
  EstimateInput in = estimate_input_for_params(psi, R, Precision::kBf16);
  in.model.experts.push_back({E, psi_e});
  for (int stage = 0; stage <= 3; ++stage) {
    for (int r = 0; r < R; ++r) {
      const uint64_t s = psi / R, s_e = memory::shard_of(psi_e, R / E, r / E, kAlign).size;
      auto held = [&](bool sharded, uint64_t whole, uint64_t shard) { return sharded ? shard : whole; };
      const StateBytes want{2 * (held(stage == 3, psi, s) + held(stage == 3, psi_e, s_e)),
                            2 * (held(stage >= 2, psi, s) + held(stage >= 2, psi_e, s_e)),
                            12 * (held(stage >= 1, psi, s) + held(stage >= 1, psi_e, s_e))};
      EXPECT_EQ(model_state_bytes(in, stage, r), want) << "stage " << stage << " rank " << r;
    }
  }
  const auto plans = placement_plans(in, 1, 3);
  ASSERT_EQ(plans.size(), 2u);
  EXPECT_EQ(plans[1].buffers.front().group, "edp");
  EXPECT_EQ(plans[1].stepped, memory::shard_of(psi_e, R / E, 1, kAlign));
  in.ranks = 3;  // E = 2 does not divide 3 ranks
  EXPECT_THROW(model_state_bytes(in, 1, 0), ConfigError);
}

TEST(Estimate, UnevenShardsUseTheEnginePartition) {
  // Ψ = 1024 over 3 ranks: stride ceil(1024/3) = 342 -> 352 (a multiple of 32); shards 352, 352, 320.
  EstimateInput in = estimate_input_for_params(1000, 3, Precision::kBf16);
  ASSERT_EQ(in.model.flat_elements, 1024u);
  StageEstimate st = estimate_stage(in, 3);
  ASSERT_EQ(st.shards.size(), 2u);
  EXPECT_EQ(st.shards[0].first_rank, 0);
  EXPECT_EQ(st.shards[0].last_rank, 1);
  EXPECT_EQ(st.shards[0].shard_elements, 352u);
  EXPECT_EQ(st.shards[1].first_rank, 2);
  EXPECT_EQ(st.shards[1].shard_elements, 320u);
  EXPECT_EQ(st.group_of(2).device.total(), 16u * 320);
  EXPECT_EQ(st.max_model_state_bytes(), 16u * 352);
  // Stage 3 tiles the model states: the ranks together hold 16 bytes per element, once.
  uint64_t sum = 0;
  for (int r = 0; r < 3; ++r) sum += model_state_bytes(in, 3, r).total();
  EXPECT_EQ(sum, 16u * 1024);
  // Stage 1: the replicated params/grads on every rank, the optimizer states tiled.
  EXPECT_EQ(model_state_bytes(in, 1, 2), (StateBytes{2048, 2048, 12 * 320}));
}

TEST(Estimate, TinyModelsLeaveTailRanksEmpty) {
  // Ψ = 64 over 4 ranks: shards 32, 32, 0, 0 - a rank can own nothing.
  EstimateInput in = estimate_input_for_params(40, 4, Precision::kFp32);
  StageEstimate st = estimate_stage(in, 3);
  ASSERT_EQ(st.shards.size(), 2u);
  EXPECT_EQ(st.shards[1].first_rank, 2);
  EXPECT_EQ(st.shards[1].last_rank, 3);
  EXPECT_EQ(st.shards[1].shard_elements, 0u);
  EXPECT_EQ(st.shards[1].total(), 0u);
  EXPECT_EQ(model_state_bytes(in, 2, 3), (StateBytes{4 * 64, 0, 0}));
}

TEST(Estimate, AgreesWithThePaperWithinTheShardRounding) {
  for (uint64_t n : {uint64_t{123'456'789}, uint64_t{1'500'000'000}, uint64_t{7'000'000'001}}) {
    for (int R : {1, 2, 3, 5, 7, 8, 64, 1000}) {
      for (Precision p : {Precision::kFp32, Precision::kBf16}) {
        EstimateInput in = estimate_input_for_params(n, R, p);
        const double psi = static_cast<double>(in.model.flat_elements);
        for (int stage = 0; stage <= 3; ++stage) {
          const Paper f = paper(stage, p);
          const double ideal = static_cast<double>(f.replicated) * psi + static_cast<double>(f.sharded) * psi / R;
          const StageEstimate st = estimate_stage(in, stage);
          // A shard is at most 32 elements longer than Ψ/R (rounded to the alignment).
          const double slack = static_cast<double>(f.sharded * kAlign);
          EXPECT_NEAR(static_cast<double>(st.max_model_state_bytes()), ideal, slack)
              << "n " << n << " R " << R << " stage " << stage;
          EXPECT_EQ(st.paper_formula, stage == 0 ? "16Ψ" : stage == 3 ? "16Ψ/R"
                                                          : fmt::format("{}Ψ + {}Ψ/R", f.replicated, f.sharded));
        }
      }
    }
  }
}

TEST(Estimate, FormulasNameEveryMultiplier) {
  StageEstimate bf = estimate_stage(estimate_input_for_params(1 << 20, 4, Precision::kBf16), 1);
  EXPECT_EQ(bf.params_formula, "2 x Ψ (bf16 parameters, full replica)");
  EXPECT_EQ(bf.grads_formula, "2 x Ψ (bf16 gradients, full replica)");
  EXPECT_EQ(bf.optimizer_formula, "(4 fp32 master + 8 AdamW states) = 12 x S_r");
  EXPECT_EQ(bf.paper_formula, "4Ψ + 12Ψ/R");
  StageEstimate f32 = estimate_stage(estimate_input_for_params(1 << 20, 4, Precision::kFp32), 3);
  EXPECT_EQ(f32.params_formula, "4 x S_r (fp32 parameters, this rank's shard)");
  EXPECT_NE(f32.optimizer_formula.find("the fp32 parameters are the master weights"), std::string::npos);
}

TEST(Estimate, TransientBoundsWithoutTheModel) {
  EstimateInput in = estimate_input_for_params(1'000'000, 2, Precision::kBf16);
  in.zero.reduce_bucket_size = 100'000;
  in.zero.stage3_max_live_parameters = 300'000;
  EXPECT_FALSE(estimate_stage(in, 0).grad_buckets.applies);
  EXPECT_FALSE(estimate_stage(in, 1).grad_buckets.applies);
  StageEstimate s2 = estimate_stage(in, 2);
  EXPECT_EQ(s2.grad_buckets.bytes, 2u * 6 * 100'000);  // 4 + 2 assumed for the running modules
  EXPECT_FALSE(s2.gathered_params.applies);
  StageEstimate s3 = estimate_stage(in, 3);
  EXPECT_EQ(s3.gathered_params.bytes, 2u * 300'000);
  EXPECT_FALSE(s3.persistent_params.applies);   // unknown without the shapes
  EXPECT_FALSE(s3.activations_peak.applies);
  // The staging cannot exceed the model.
  in.zero.reduce_bucket_size = 500'000'000;
  EXPECT_EQ(estimate_stage(in, 2).grad_buckets.bytes, 2u * in.model.flat_elements);
}

TEST(Estimate, RejectsBadInput) {
  EstimateInput in = estimate_input_for_params(1000, 1, Precision::kBf16);
  EXPECT_THROW(estimate_stage(in, 4), ConfigError);
  EXPECT_THROW(estimate_stage(in, -1), ConfigError);
  in.ranks = 0;
  EXPECT_THROW(estimate_memory(in, {0}), ConfigError);
}

// d_model 36: most parameters need padding. Ψ by hand, each parameter rounded up to 32 elements:
//   wte 256*36 = 9216, wpe 8*36 = 288, ln1 2 x 36 -> 2 x 64, qkv.weight 3888 -> 3904, qkv.bias 108 -> 128,
//   attn.proj.weight 1296 -> 1312, attn.proj.bias 36 -> 64, ln2 2 x 64, fc.weight 5184, fc.bias 144 -> 160,
//   mlp.proj.weight 5184, mlp.proj.bias 36 -> 64, ln_f 2 x 64                            = 25888
nn::GptConfig padded_gpt() { return {.n_layer = 1, .d_model = 36, .n_head = 4, .seq_len = 8, .vocab_size = 256}; }

zs::run::RunConfig config_with(const nn::GptConfig& m, Precision p, int64_t micro_batch) {
  zs::run::RunConfig c;
  c.model = m;
  c.precision = p;
  c.batch = resolve_batch(0, micro_batch, 1, 1);
  return c;
}

TEST(Estimate, KnownModelUsesTheExactFlatLayout) {
  const nn::GptConfig m = padded_gpt();
  EstimateInput in = estimate_input_for_config(config_with(m, Precision::kBf16, 2), 3);
  EXPECT_TRUE(in.model.exact_layout);
  EXPECT_EQ(in.model.flat_elements, 25888u);
  EXPECT_EQ(in.model.param_elements, static_cast<uint64_t>(nn::gpt_param_count(m)));
  // The same Ψ as the engine's own FlatLayout, and the same shards.
  nn::GptModel model(m);
  FlatLayout layout(model.all_params());
  ASSERT_EQ(in.model.flat_elements, layout.total());
  for (int stage = 0; stage <= 3; ++stage) {
    for (int r = 0; r < 3; ++r) {
      const uint64_t shard = memory::shard_of(layout.total(), 3, r, kAlign).size;
      const uint64_t psi = layout.total();
      StateBytes want{(stage == 3 ? shard : psi) * 2, (stage >= 2 ? shard : psi) * 2, (stage >= 1 ? shard : psi) * 12};
      EXPECT_EQ(model_state_bytes(in, stage, r), want) << "stage " << stage << " rank " << r;
    }
  }
  EXPECT_EQ(in.model.largest_param_elements, 9216u);  // wte
  // Stage 3 gathers each module's own parameters as one range, ending at its last parameter (the
  // padding after it is not gathered): GPT (wte, wpe) 9504, ln1 100, qkv 3904 + 108 = 4012,
  // attn.proj 1312 + 36 = 1348, ln2 100, fc 5184 + 144 = 5328, mlp.proj 5184 + 36 = 5220, ln_f 100.
  // All are below the default threshold 1e5: persistent.
  EXPECT_EQ(in.model.persistent_modules, 8u);
  EXPECT_EQ(in.model.persistent_elements, 25712u);
  EXPECT_EQ(in.model.nonpersistent_elements, 0u);
}

TEST(Estimate, KnownModelBoundsTheTransientBuffers) {
  zs::run::RunConfig cfg = config_with(padded_gpt(), Precision::kFp32, 2);
  cfg.zero.reduce_bucket_size = 6000;
  EstimateInput in = estimate_input_for_config(cfg, 2);
  // plan_buckets(6000) from the end (sizes padded): {fc.bias, mlp.proj.*, ln_f.*} 5536,
  // {attn.proj.bias, ln2.*, fc.weight} 5376, {wpe, ln1.*, qkv.*, attn.proj.weight} 5760, {wte} 9216.
  // Staging can hold 4 + (the running chain's buckets) of them: here all 4.
  EXPECT_EQ(in.model.bucket_count, 4u);
  EXPECT_EQ(in.model.staging_buckets, 4u);
  EXPECT_EQ(estimate_stage(in, 2).grad_buckets.bytes, 4u * 25888);

  // Stage 3 with threshold 1000: ln1, ln2, ln_f (100 each) persist; the longest running chain is
  // GPT -> blocks.0 -> mlp -> fc: 9504 + 5328.
  cfg.zero.stage3_param_persistence_threshold = 1000;
  cfg.zero.stage3_prefetch_bucket_size = 1000;
  in = estimate_input_for_config(cfg, 2);
  EXPECT_EQ(in.model.persistent_modules, 3u);
  EXPECT_EQ(in.model.persistent_elements, 300u);
  EXPECT_EQ(in.model.nonpersistent_elements, 25412u);
  EXPECT_EQ(in.model.gather_chain_elements, 9504u + 5328u);
  EXPECT_EQ(in.model.gather_chain_module, "blocks.0.mlp.fc");
  StageEstimate s3 = estimate_stage(in, 3);
  EXPECT_EQ(s3.gathered_params.bytes, 4u * (9504 + 5328 + 1000));
  EXPECT_EQ(s3.persistent_params.bytes, 4u * 300);
  // The prefetch window cannot gather more than there is.
  cfg.zero.stage3_prefetch_bucket_size = 1'000'000;
  EXPECT_EQ(estimate_stage(estimate_input_for_config(cfg, 2), 3).gathered_params.bytes, 4u * 25412);
}

TEST(Estimate, StagingBoundCoversTheLargestBuckets) {
  nn::GptConfig m = padded_gpt();
  m.n_layer = 4;
  zs::run::RunConfig cfg = config_with(m, Precision::kBf16, 1);
  cfg.zero.reduce_bucket_size = 2000;
  EstimateInput in = estimate_input_for_config(cfg, 3);
  nn::GptModel model(m);
  auto buckets = plan_buckets(FlatLayout(model.all_params()), 2000);
  ASSERT_EQ(in.model.bucket_count, buckets.size());
  // 4 fixed + the chain's buckets: wte's and wpe's (the GPT's own) and at least one of a Linear.
  EXPECT_GE(in.model.staging_buckets, 7u);
  EXPECT_LT(in.model.staging_buckets, buckets.size());
  std::vector<uint64_t> sizes;
  for (const auto& b : buckets) sizes.push_back(b.range.size);
  std::sort(sizes.rbegin(), sizes.rend());
  uint64_t want = 0;
  for (uint64_t k = 0; k < in.model.staging_buckets; ++k) want += sizes[k];
  EXPECT_EQ(in.model.staging_elements, want);
  EXPECT_EQ(estimate_stage(in, 2).grad_buckets.bytes, 2 * want);
}

TEST(Estimate, MeasuredDevicePeakIsMadeOfTheStatesAndTheTransients) {
  // The measurement (estimate/measure.h) reports the arena at its peak by category. Stages 0-1 have no
  // transient but the activations, so there the peak is the device states + the activation peak; at
  // stages 2-3 gradient staging (and at 3 gathered parameters) add to it, within the bounds.
  nn::GptConfig m = padded_gpt();
  m.n_layer = 3;
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    for (int ranks : {1, 3}) {
      zs::run::RunConfig cfg = config_with(m, p, 2);
      cfg.zero.reduce_bucket_size = 2000;
      cfg.zero.stage3_param_persistence_threshold = 1000;
      cfg.zero.stage3_prefetch_bucket_size = 6000;
      const EstimateInput in = estimate_input_for_config(cfg, ranks);
      for (int stage = 0; stage <= 3; ++stage) {
        const StageEstimate st = estimate_stage(in, stage);
        for (const ShardGroup& g : st.shards) {
          const std::string what = fmt::format("{} np {} stage {} ranks {}-{}", precision_name(p), ranks, stage, g.first_rank, g.last_rank);
          const DevicePeak& d = g.device_peak;
          ASSERT_TRUE(d.applies) << what;
          uint64_t sum = 0;
          for (uint64_t b : d.by_category) sum += b;
          EXPECT_EQ(sum, d.bytes) << what;
          EXPECT_GE(d.reserved_bytes, d.bytes) << what;
          const uint64_t floor = g.device.total() + st.activations_peak.bytes;
          if (stage <= 1) {
            EXPECT_EQ(d.bytes, floor) << what;
            continue;
          }
          EXPECT_GE(d.bytes, g.device.total() + d.activations) << what;
          // Each block is rounded to 64 B, the bounds are not: allow a block per parameter.
          const uint64_t slack = 64 * 64;
          EXPECT_LE(d.bytes, floor + st.grad_buckets.bytes + st.gathered_params.bytes + st.persistent_params.bytes + slack) << what;
          const uint64_t params_at_peak = d.by_category[static_cast<size_t>(memory::Category::kParams)];
          EXPECT_EQ(params_at_peak > g.device.params, stage == 3) << what << ": gathered parameters";
        }
      }
    }
  }
  // Without the model there is nothing to run.
  const EstimateInput bare = estimate_input_for_params(1'000'000, 2, Precision::kBf16);
  const DevicePeak none = estimate_stage(bare, 3).shards[0].device_peak;
  EXPECT_FALSE(none.applies);
  EXPECT_NE(none.formula.find("--config"), std::string::npos);
}

TEST(Estimate, ConfigNeedsAModelOrParams) {
  zs::run::RunConfig cfg = config_with(padded_gpt(), Precision::kBf16, 1);
  EXPECT_THROW(estimate_input_for_config(cfg, 1, uint64_t{1000}), ConfigError);  // both
  cfg.model.reset();
  EXPECT_THROW(estimate_input_for_config(cfg, 1), ConfigError);  // neither
  EstimateInput in = estimate_input_for_config(cfg, 2, uint64_t{1000});
  EXPECT_FALSE(in.model.exact_layout);
  EXPECT_EQ(in.model.flat_elements, 1024u);
  EXPECT_EQ(in.precision, Precision::kBf16);
}

TEST(Estimate, JsonAndTableCarryTheNumbers) {
  MemoryEstimate est = estimate_memory(estimate_input_for_params(1000, 3, Precision::kBf16), {0, 3});
  boost::json::object j = estimate_to_json(est);
  EXPECT_EQ(j.at("flat_elements").as_uint64(), 1024u);
  const auto& stages = j.at("stages").as_array();
  ASSERT_EQ(stages.size(), 2u);
  const auto& s3 = stages[1].as_object();
  EXPECT_EQ(s3.at("stage").as_int64(), 3);
  const auto& tail = s3.at("per_shard_size").as_array()[1].as_object();
  EXPECT_EQ(tail.at("first_rank").as_int64(), 2);
  EXPECT_EQ(tail.at("model_states_bytes").at("total").as_uint64(), 16u * 320);
  EXPECT_EQ(s3.at("formulas").at("paper").as_string(), "16Ψ/R");
  const std::string table = format_estimate(est);
  EXPECT_NE(table.find("16Ψ/R"), std::string::npos);
  EXPECT_NE(table.find("(4 fp32 master + 8 AdamW states) = 12 x S_r"), std::string::npos);
  EXPECT_NE(table.find("5.0 KiB"), std::string::npos);  // stage 3, ranks 2: 16 x 320 bytes
}

// ---- offload (Note [estimated offload] in estimate/estimate_offload.cpp) ----------------------------------

constexpr uint64_t kPage = 4096;
uint64_t page(uint64_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

EstimateInput offloaded(uint64_t psi, int ranks, Precision p, OffloadDevice t) {
  EstimateInput in = estimate_input_for_params(psi, ranks, p);
  in.offload_optimizer = in.offload_param = t;
  return in;
}

TEST(EstimateOffload, TargetsApplyOnlyAtTheStagesThatAllowThem) {
  EstimateInput in = offloaded(6400, 2, Precision::kBf16, OffloadDevice::kNvme);
  EXPECT_FALSE(stage_offload(in, 0).any());
  EXPECT_EQ(stage_offload(in, 1).optimizer, OffloadDevice::kNvme);
  EXPECT_EQ(stage_offload(in, 2).param, OffloadDevice::kNone);
  EXPECT_EQ(stage_offload(in, 3).param, OffloadDevice::kNvme);
  // Stage 0 is the in-memory estimate, whatever the targets.
  EXPECT_EQ(tiered_state_bytes(in, 0, 1).device, model_state_bytes(estimate_input_for_params(6400, 2, Precision::kBf16), 0, 1));
  EXPECT_EQ(tiered_state_bytes(in, 0, 1).host.total() + tiered_state_bytes(in, 0, 1).nvme.total(), 0u);
  EXPECT_FALSE(offload_buffer_bytes(in, 0, 0).applies);
}

TEST(EstimateOffload, CpuMovesTheSteppedStatesAndTheGradientShardToTheHost) {
  const uint64_t psi = 6400, S = 3200;
  EstimateInput in = offloaded(psi, 2, Precision::kBf16, OffloadDevice::kCpu);
  // Stage 1: master + two Adam moments on the host, each a buffer rounded up to 4096 bytes; the whole
  // gradient buffer stays on the device.
  TieredStateBytes s1 = tiered_state_bytes(in, 1, 1);
  EXPECT_EQ(s1.device, (StateBytes{2 * psi, 2 * psi, 0}));
  EXPECT_EQ(s1.host, (StateBytes{0, 0, 3 * page(4 * S)}));
  EXPECT_EQ(s1.nvme.total(), 0u);
  // Stage 2: the gradient shard moves too.
  TieredStateBytes s2 = tiered_state_bytes(in, 2, 1);
  EXPECT_EQ(s2.device, (StateBytes{2 * psi, 0, 0}));
  EXPECT_EQ(s2.host, (StateBytes{0, page(2 * S), 3 * page(4 * S)}));
  // Stage 3 (ZeRO-Infinity on the host): the parameter shard too; nothing stays on the device.
  TieredStateBytes s3 = tiered_state_bytes(in, 3, 0);
  EXPECT_EQ(s3.device.total(), 0u);
  EXPECT_EQ(s3.host, (StateBytes{page(2 * S), page(2 * S), 3 * page(4 * S)}));
  EXPECT_EQ(model_state_bytes(in, 3, 0), s3.host);
  EXPECT_FALSE(offload_buffer_bytes(in, 3, 0).applies);  // host offload needs no swap buffers
  // Without rounding (shards of 1024-element multiples) the host holds the paper's 12 + 2 + 2 per element.
  EstimateInput even = offloaded(4 * 1024 * 10, 4, Precision::kBf16, OffloadDevice::kCpu);
  EXPECT_EQ(tiered_state_bytes(even, 3, 2).host.total(), 16u * 10240);
}

TEST(EstimateOffload, Fp32KeepsASeparateMasterOnceOffloaded) {
  const uint64_t psi = 6400, S = 3200;
  EstimateInput in = offloaded(psi, 2, Precision::kFp32, OffloadDevice::kCpu);
  // In memory fp32 steps the parameters themselves (8 S); offloaded, a 4 S fp32 master joins the states.
  EXPECT_EQ(model_state_bytes(estimate_input_for_params(psi, 2, Precision::kFp32), 2, 0).optimizer, 8 * S);
  TieredStateBytes t = tiered_state_bytes(in, 2, 0);
  EXPECT_EQ(t.device, (StateBytes{4 * psi, 0, 0}));
  EXPECT_EQ(t.host, (StateBytes{0, page(4 * S), 3 * page(4 * S)}));
  StageEstimate st = estimate_stage(in, 2);
  EXPECT_EQ(st.master_bytes_per_element, 4u);
  EXPECT_EQ(estimate_stage(in, 0).master_bytes_per_element, 0u);
  EXPECT_NE(st.optimizer_formula.find("4 fp32 master (a separate copy: offloaded)"), std::string::npos);
  EXPECT_NE(st.optimizer_formula.find("-> host"), std::string::npos);
  // Parameters alone on NVMe (offload_param only, a config setting) also separate the master, which
  // then stays on the device.
  EstimateInput params_only = estimate_input_for_params(psi, 2, Precision::kFp32);
  params_only.offload_param = OffloadDevice::kNvme;
  TieredStateBytes p = tiered_state_bytes(params_only, 3, 0);
  EXPECT_EQ(p.device, (StateBytes{0, 4 * S, 12 * S}));
  EXPECT_EQ(p.nvme, (StateBytes{page(4 * S), 0, 0}));
  // ... but not on the host: the host parameter shard is still the master.
  params_only.offload_param = OffloadDevice::kCpu;
  EXPECT_EQ(tiered_state_bytes(params_only, 3, 0).device, (StateBytes{0, 4 * S, 8 * S}));
}

TEST(EstimateOffload, PersistentFp32GradientsFollowTheGradientShard) {
  const uint64_t psi = 6400, S = 3200;
  EstimateInput in = offloaded(psi, 2, Precision::kBf16, OffloadDevice::kCpu);
  in.memory.release_fp32_grad = false;
  // Stage 1: the 4 S fp32 copy stays on the device with the whole gradient buffer.
  EXPECT_EQ(tiered_state_bytes(in, 1, 0).device.grads, 2 * psi + 4 * S);
  // Stages 2-3: both on the host, each its own 4096-rounded buffer.
  EXPECT_EQ(tiered_state_bytes(in, 2, 0).host.grads, page(2 * S) + page(4 * S));
  EXPECT_EQ(tiered_state_bytes(in, 2, 0).device.grads, 0u);
}

TEST(EstimateOffload, NvmeRegionsAndTheStepBuffers) {
  const uint64_t psi = 6400, S = 3200;
  EstimateInput in = offloaded(psi, 2, Precision::kBf16, OffloadDevice::kNvme);
  TieredStateBytes t = tiered_state_bytes(in, 3, 1);
  EXPECT_EQ(t.device.total(), 0u);
  EXPECT_EQ(t.host, (StateBytes{0, page(2 * S), 0}));  // the gradient shard
  EXPECT_EQ(t.nvme, (StateBytes{page(2 * S), 0, 3 * page(4 * S)}));
  // One sub-group (S < 32768): one buffer holding 4S + 4S + 4S + 2S, each rounded up to 4096.
  TransientBound b = offload_buffer_bytes(in, 3, 1);
  ASSERT_TRUE(b.applies);
  EXPECT_EQ(b.bytes, 3 * page(4 * S) + page(2 * S));
  EXPECT_NE(b.formula.find("min(B 4, G 1)"), std::string::npos);
  // Stage 1-2: the optimizer's items only.
  EXPECT_EQ(offload_buffer_bytes(in, 2, 1).bytes, 3 * page(4 * S));
  EXPECT_EQ(tiered_state_bytes(in, 2, 1).nvme, (StateBytes{0, 0, 3 * page(4 * S)}));
}

TEST(EstimateOffload, SubGroupsAreCappedAtTheSteppedRangeOverTheBufferCount) {
  // Ψ = 1,000,000 on one rank: ceil(Ψ / 4) = 250,000 -> 262,144 (a multiple of 32768) elements per
  // sub-group, 4 sub-groups, 4 buffers of 3 x 4 x 262,144 bytes: as much host memory as cpu offload.
  EstimateInput in = offloaded(1'000'000, 1, Precision::kBf16, OffloadDevice::kNvme);
  EXPECT_EQ(offload_buffer_bytes(in, 1, 0).bytes, 4u * 3 * 4 * 262'144);
  // sub_group_size 100,000 -> 131,072: 8 sub-groups, still 4 buffers, of half the size.
  in.zero.sub_group_size = 100'000;
  EXPECT_EQ(offload_buffer_bytes(in, 1, 0).bytes, 4u * 3 * 4 * 131'072);
  // buffer_count 3: ceil(Ψ / 3) -> 344,064 > 131,072, so sub_group_size decides; 3 buffers.
  in.zero.offload_optimizer_buffer_count = 3;
  EXPECT_EQ(offload_buffer_bytes(in, 1, 0).bytes, 3u * 3 * 4 * 131'072);
  // Fewer sub-groups than buffers: one buffer per sub-group. 40,000 elements: ceil(40,000 / 3) ->
  // 32,768, 2 sub-groups (32,768 + 7,232); the buffer fits the larger.
  EstimateInput small = offloaded(40'000, 1, Precision::kBf16, OffloadDevice::kNvme);
  small.zero.offload_optimizer_buffer_count = 3;
  EXPECT_EQ(offload_buffer_bytes(small, 3, 0).bytes, 2u * (3 * 4 * 32'768 + 2 * 32'768));
  // Only the parameters on NVMe: offload_param.buffer_count (5) buffers of b n.
  EstimateInput params_only = estimate_input_for_params(1'000'000, 1, Precision::kBf16);
  params_only.offload_param = OffloadDevice::kNvme;
  params_only.offload_optimizer = OffloadDevice::kCpu;
  // ceil(Ψ / 5) = 200,000 -> 229,376; 5 sub-groups of which the last has 82,496.
  EXPECT_EQ(offload_buffer_bytes(params_only, 3, 0).bytes, 5u * 2 * 229'376);
  EXPECT_NE(estimate_stage(params_only, 3).offload_buffers_formula.find("offload_param.buffer_count"), std::string::npos);
}

TEST(EstimateOffload, BlockQuantisedStatesAreRegionsOfTheirOwn) {
  zs::run::RunConfig cfg = config_with(padded_gpt(), Precision::kBf16, 1);
  cfg.optimizer = OptimizerConfig("CAdam");
  EstimateInput in = estimate_input_for_config(cfg, 1);
  in.offload_optimizer = OffloadDevice::kNvme;
  ASSERT_FALSE(in.optimizer_states.empty());
  const uint64_t S = in.model.flat_elements;  // one rank
  uint64_t want = page(4 * S), want_buffer = page(4 * S);
  for (const optim::StateSpec& spec : in.optimizer_states) {
    want += page(spec.bytes_for(S));
    want_buffer += page(spec.bytes_for(S));
  }
  EXPECT_EQ(tiered_state_bytes(in, 2, 0).nvme.optimizer, want);
  EXPECT_EQ(offload_buffer_bytes(in, 2, 0).bytes, want_buffer);
}

TEST(EstimateOffload, CompressedOptimizersAndReuseCannotBeOffloaded) {
  zs::run::RunConfig cfg = config_with(padded_gpt(), Precision::kBf16, 1);
  cfg.optimizer = OptimizerConfig("OneBitAdam");
  EstimateInput in = estimate_input_for_config(cfg, 2);
  in.offload_optimizer = OffloadDevice::kCpu;
  EXPECT_NO_THROW(estimate_stage(in, 0));  // no optimizer offload at stage 0
  try {
    estimate_memory(in, {0, 1});
    ADD_FAILURE() << "OneBitAdam with --offload cpu was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--offload cpu: OneBitAdam keeps whole-model momentum"), std::string::npos) << e.what();
  }
  EstimateInput reuse = estimate_input_for_params(6400, 2, Precision::kBf16);
  reuse.memory.reuse_fp32_param = true;
  reuse.offload_optimizer = OffloadDevice::kNvme;
  try {
    estimate_stage(reuse, 2);
    ADD_FAILURE() << "reuse_fp32_param with --offload nvme was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("memory.reuse_fp32_param"), std::string::npos) << e.what();
  }
}

TEST(EstimateOffload, ConfigSuppliesTargetsAndLimits) {
  zs::run::RunConfig cfg = config_with(padded_gpt(), Precision::kBf16, 1);
  cfg.zero.stage = 3;
  cfg.zero.offload_optimizer = {.device = OffloadDevice::kNvme, .nvme_path = "/x", .buffer_count = 3};
  cfg.zero.offload_param = {.device = OffloadDevice::kCpu, .nvme_path = "", .buffer_count = 7, .buffer_size = 1234};
  cfg.zero.sub_group_size = 65'536;
  EstimateInput in = estimate_input_for_config(cfg, 2);
  EXPECT_EQ(in.offload_optimizer, OffloadDevice::kNvme);
  EXPECT_EQ(in.offload_param, OffloadDevice::kCpu);
  EXPECT_EQ(in.zero.offload_optimizer_buffer_count, 3);
  EXPECT_EQ(in.zero.offload_param_buffer_count, 7);
  EXPECT_EQ(in.zero.offload_param_buffer_size, 1234);
  EXPECT_EQ(in.zero.sub_group_size, 65'536);
}

TEST(EstimateOffload, NvmeParameterStagingBound) {
  // padded_gpt's modules (own ranges, ascending): 100 (ln1, ln2, ln_f), 1348, 4012, 5220, 5328, 9504.
  zs::run::RunConfig cfg = config_with(padded_gpt(), Precision::kBf16, 1);
  cfg.zero.stage3_prefetch_bucket_size = 4000;
  EstimateInput in = estimate_input_for_config(cfg, 1);
  in.offload_optimizer = in.offload_param = OffloadDevice::kNvme;
  EXPECT_EQ(in.model.module_elements.size(), 8u);
  EXPECT_EQ(in.model.module_elements.back(), 9504u);
  // Window min(4000, 5 x 1e8) = 4000: at most 4 modules fit (100 + 100 + 100 + 1348), + 1 fetching.
  TransientBound t = estimate_stage(in, 3).nvme_param_staging;
  ASSERT_TRUE(t.applies);
  EXPECT_EQ(t.bytes, 2u * (4000 + 9504) + 8192u * 5);
  // A small buffer_count x buffer_size narrows the window (engine.cpp's prefetch for NVMe).
  in.zero.offload_param_buffer_size = 50;
  in.zero.offload_param_buffer_count = 4;  // window 200: two 100s fit
  EXPECT_EQ(estimate_stage(in, 3).nvme_param_staging.bytes, 2u * (200 + 9504) + 8192u * 3);
  // The staging holds this rank's owned parts only: at most its shard.
  EstimateInput three = estimate_input_for_config(cfg, 3);
  three.offload_param = OffloadDevice::kNvme;
  EXPECT_EQ(estimate_stage(three, 3).nvme_param_staging.bytes, 2u * 8640 + 8192u * 5);
  EXPECT_FALSE(estimate_stage(three, 2).nvme_param_staging.applies);
  // Without the modules there is no bound, only the formula.
  TransientBound unknown = estimate_stage(offloaded(1000, 1, Precision::kBf16, OffloadDevice::kNvme), 3).nvme_param_staging;
  EXPECT_FALSE(unknown.applies);
  EXPECT_NE(unknown.formula.find("unknown with --params"), std::string::npos);
}

TEST(EstimateOffload, JsonAndTableShowEveryTier) {
  MemoryEstimate est = estimate_memory(offloaded(6400, 2, Precision::kBf16, OffloadDevice::kNvme), {0, 3});
  boost::json::object j = estimate_to_json(est);
  EXPECT_EQ(j.at("offload").at("optimizer").as_string(), "nvme");
  const auto& s3 = j.at("stages").as_array()[1].as_object();
  EXPECT_EQ(s3.at("offload").at("param").as_string(), "nvme");
  const auto& g = s3.at("per_shard_size").as_array()[0].as_object();
  EXPECT_EQ(g.at("by_tier").at("nvme").at("params").as_uint64(), page(6400));
  EXPECT_EQ(g.at("by_tier").at("host").at("grads").as_uint64(), page(6400));
  EXPECT_EQ(g.at("model_states_bytes").at("total").as_uint64(), 0u);  // the device arena's
  EXPECT_EQ(g.at("host_offload_buffers").at("bytes").as_uint64(), 3 * page(12800) + page(6400));
  EXPECT_EQ(g.at("tiers").at("host").as_uint64(), page(6400) + 3 * page(12800) + page(6400));
  EXPECT_TRUE(s3.at("transient").at("nvme_param_staging").as_object().at("bytes").is_null());
  const auto& s0 = j.at("stages").as_array()[0].as_object();
  EXPECT_EQ(s0.at("offload").at("optimizer").as_string(), "none");
  EXPECT_TRUE(s0.at("per_shard_size").as_array()[0].at("host_offload_buffers").is_null());
  const std::string table = format_estimate(est);
  EXPECT_NE(table.find("by tier"), std::string::npos);
  EXPECT_NE(table.find("nvme "), std::string::npos);
  EXPECT_NE(table.find("the NVMe step's buffers"), std::string::npos);
  EXPECT_NE(table.find("none at this stage"), std::string::npos);
  EXPECT_NE(table.find("-> NVMe swap file"), std::string::npos);
  // Without offload the table keeps its one-row-per-shard form.
  EXPECT_EQ(format_estimate(estimate_memory(estimate_input_for_params(6400, 2, Precision::kBf16), {1})).find("by tier"),
            std::string::npos);
}

TEST(Estimate, FormatsBytesInBinaryUnits) {
  EXPECT_EQ(format_bytes(96), "96 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(uint64_t{3} << 30), "3.00 GiB");
}

TEST(Estimate, FormatsBytesInDecimalUnitsBesideThem) {
  EXPECT_EQ(format_bytes_si(999), "999 B");
  EXPECT_EQ(format_bytes_si(1536), "1.5 kB");
  EXPECT_EQ(format_bytes_si(uint64_t{3} << 30), "3.22 GB");
  EXPECT_EQ(format_bytes_si(2'500'000'000'000), "2.50 TB");
}

// Rows whose figures are all equal print once (stage 0 replicates whatever S_r is); rows that differ
// stay apart; without a model nothing unknown is printed as "?".
TEST(Estimate, TableCollapsesEqualRowsAndOmitsWhatItCannotKnow) {
  MemoryEstimate est = estimate_memory(estimate_input_for_params(1000, 3, Precision::kBf16), {0, 3});
  const std::string table = format_estimate(est);
  EXPECT_NE(table.find("0       0-2                320..352"), std::string::npos) << table;
  EXPECT_NE(table.find("3       0-1                     352"), std::string::npos) << table;
  EXPECT_NE(table.find("3       2                       320"), std::string::npos) << table;
  EXPECT_EQ(table.find('?'), std::string::npos) << table;
  EXPECT_NE(table.find("device peak per rank and activations: not estimated; needs the model"), std::string::npos) << table;
  EXPECT_NE(table.find("persistent params: needs the module shapes"), std::string::npos) << table;
  // The JSON keeps one entry per shard size.
  EXPECT_EQ(estimate_to_json(est).at("stages").as_array()[0].at("per_shard_size").as_array().size(), 2u);
}

}  // namespace
}  // namespace zs::engine
