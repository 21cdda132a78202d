// bf16 and fp16 training end close to fp32 training (issue: 200 steps, final loss within 2%). Trains
// on the built-in corpus, so the test runs on any clone; ZS_PRECISION_CORPUS=<text file> trains on
// another text instead (the figures in the note below came from the public-domain tinyshakespeare).
// The bound is relative to fp32 on the same text, so the built-in corpus changing with the docs does
// not move it.
//
// Note [precision test statistic]: the first version trained one seed at lr 3e-3 and failed on Zen 4
// (fp16 4.7% above fp32 with OpenBLAS's SkylakeX kernels, 2.6% with Haswell's at one thread, within 2%
// at two threads). At that rate fp32 itself has loss spikes (gradient norms 14-35 around steps 35-50)
// and one seed's tail loss is luck: over 16 seeds fp32 ended anywhere in 2.51-2.87, fp16 and bf16
// differed from fp32 by -4.5% to +4.7% per seed with no bias (mean -0.1% and +0.2%), bf16 (which
// skips no step) as much as fp16. In fp16 a spike overflows at scale 2^16 and the step is skipped, so
// the runs part ways there, and where they end differs by kernel order and thread count. At lr
// 1.5e-3 there are no such spikes: the six seeds worst at 3e-3 ended with bf16 and fp16 within 0.6%
// of fp32 on both kernel sets. So the test trains there, on three seeds, and bounds the mean tail
// loss, which leaves a real precision defect (a few percent) visible and no single run's luck decisive.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cmath>
#include <cstdlib>

#include "comm/world.h"
#include "engine/config.h"
#include "engine/dataset_source.h"
#include "engine/engine.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "optim/adam.h"
#include "run/run_config.h"

namespace zs::engine {
namespace {

constexpr int kSteps = 200;
constexpr int kTail = 20;
constexpr std::array<uint64_t, 3> kSeeds = {1234, 5, 9};  // initialisation and sampling

// Mean loss of the last kTail steps: one step's loss varies with its batch; the tail mean is what
// training reached.
nn::Dataset open_corpus(int64_t seq_len) {
  const char* path = std::getenv("ZS_PRECISION_CORPUS");
  return path != nullptr && *path != '\0' ? nn::Dataset::open(path, seq_len) : nn::Dataset::builtin(seq_len);
}

double train_tail_loss(Precision precision, uint64_t seed) {
  comm::World world(comm::World::Launch::kLocal);
  zs::run::RunConfig c;
  c.seed = seed;
  c.batch = resolve_batch(8, 8, 1, 1);
  c.precision = precision;
  c.optimizer.params<optim::AdamConfig>().lr = 1.5e-3;
  c.optimizer.params<optim::AdamConfig>().weight_decay = 0.01;
  c.gradient_clipping = 1.0;
  c.scheduler = {.type = optim::ScheduleType::kWarmupLR, .warmup_min_lr = 0.0, .warmup_max_lr = 1.5e-3,
                 .warmup_num_steps = 20, .warmup_type = optim::WarmupType::kLinear};
  c.device.memory_mb = 256;
  c.model = nn::GptConfig{.n_layer = 2, .d_model = 64, .n_head = 4, .seq_len = 64, .vocab_size = 256};
  nn::GptModel model(*c.model);
  Engine engine(model, c, world.group());
  DatasetSource source(open_corpus(c.model->seq_len), seed);
  double tail = 0.0;
  int skipped = 0;
  for (int i = 0; i < kSteps; ++i) {
    const StepReport& r = engine.train_batch(source);
    if (i >= kSteps - kTail) tail += r.loss;
    skipped += r.skipped;
  }
  // fp16 starts at scale 2^16 and may skip a few steps while the scale settles: allowed, but not
  // most of them.
  EXPECT_LT(skipped, kSteps / 10) << precision_name(precision) << " seed " << seed;
  return tail / kTail;
}

TEST(MixedPrecision, Bf16AndFp16EndWithinTwoPercentOfFp32) {
  double fp32 = 0.0, bf16 = 0.0, fp16 = 0.0;
  for (uint64_t seed : kSeeds) {
    const double a = train_tail_loss(Precision::kFp32, seed);
    const double b = train_tail_loss(Precision::kBf16, seed);
    const double h = train_tail_loss(Precision::kFp16, seed);
    std::printf("seed %llu: tail loss over the last %d of %d steps: fp32 %.4f bf16 %.4f fp16 %.4f\n",
                static_cast<unsigned long long>(seed), kTail, kSteps, a, b, h);
    fp32 += a / kSeeds.size();
    bf16 += b / kSeeds.size();
    fp16 += h / kSeeds.size();
  }
  std::printf("mean over %zu seeds: fp32 %.4f bf16 %.4f (%+.2f%%) fp16 %.4f (%+.2f%%)\n", kSeeds.size(), fp32, bf16,
              100.0 * (bf16 / fp32 - 1.0), fp16, 100.0 * (fp16 / fp32 - 1.0));
  // A uniform guess over the 256 byte values scores ln 256 = 5.55; 200 steps reach about 3.0 on the
  // built-in corpus and 2.5-2.9 on tinyshakespeare.
  EXPECT_LT(fp32, 0.6 * std::log(256.0)) << "fp32 training did not learn";
  EXPECT_NEAR(bf16, fp32, 0.02 * fp32);
  EXPECT_NEAR(fp16, fp32, 0.02 * fp32);
}

}  // namespace
}  // namespace zs::engine
