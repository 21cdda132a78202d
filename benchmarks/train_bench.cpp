// Question: how close does a GPT training step (engine::Engine, ZeRO stage 0, fp32) come to the best
// sgemm this machine offers on the same matrix shapes? Reports tokens/s, achieved GFLOP/s and the
// ratio to an sgemm ceiling measured in the same run.
//
//   build/release/benchmarks/train_bench [--json out.json] [--n-layer 4] [--d-model 512] [--n-head 8]
//          [--seq-len 256] [--micro-batch 8] [--vocab 256] [--steps 5] [--warmup 2] [--memory-mb 2048]
//          [--precision fp32|bf16] [--isa avx2]   (bf16 parameters; --isa avx2: the bf16 sgemm fallback)
//          [--no-ceiling]          (training steps only, for profiling; no ratio)
//          [--model llama [--n-kv-head H] [--d-ff F]]   (nn::LlamaModel; --seq-len is its max_seq_len)
//   mpirun -np 2 --oversubscribe build/release/benchmarks/train_bench      (each rank: cores / 2 threads)
//
// Default model: n_layer 4, d_model 512, n_head 8 (head size 64 as GPT-2), seq_len 256, micro batch 8,
// byte vocabulary 256 - a GPT-2-small block width cut to 4 layers so that a step is ~1 s on 2 cores.
// Its FLOPs are 92% block linears (the shapes every GPT has: N x C x 3C, N x C x C, N x C x 4C,
// N x 4C x C at N = 2048 tokens), 7% attention (T x T x 64 per head) and 1% the tied head.
//
// Method. select_blas_kernels(argv) first (OpenBLAS's best kernels for this CPU, launch/launch.h),
// set_blas_threads(local_rank_count()) so both the step and the ceiling use the same threads per
// rank. Warm-up steps, then `--steps` repetitions of (barrier, one optimizer step via
// Engine::train_batch, barrier, one ceiling pass). A step's time is the slowest rank's.
//   achieved GFLOP/s = nn::gpt_train_flops_per_token(cfg, seq_len) * tokens/s (all ranks' tokens)
//   ceiling pass     = every sgemm one training step of the model would issue, with the step's
//                      (m, n, k, transposes) and counts: per Linear forward (x W^T), dX (dY W) and
//                      dW (dY^T X); per (batch, head) the attention's q k^T, P v, dY v^T, P^T dY,
//                      dS k, dS^T q at full T x T; the tied head's three products. Contiguous operands
//                      reused across repetitions (cache-warm: a generous ceiling).
//   ceiling GFLOP/s  = FLOPs of the pass / its time, i.e. the FLOP-weighted harmonic mean of the
//                      shapes' rates; summed over ranks (each rank measures its own, concurrently).
//   ratio            = achieved / ceiling (median step vs median pass).
// The FLOP count is the model's (full T x T attention), so an attention that skips masked blocks is
// credited as in the usual model-FLOPs utilisation.
// --model llama trains nn::LlamaModel (nn/llama.h; --n-kv-head defaults to --n-head, --d-ff to LLaMA's
// rule) on the same byte corpus, for benchmarks/torch_compare.py's LLaMA case; its FLOPs per token are
// nn::llama_train_flops_per_token's and it has no sgemm ceiling (the pass above lists the GPT's
// shapes), so it runs as with --no-ceiling.
//   mfu              = the step's FLOPs as the kernels counted them (StepReport::model_flops: causal
//                      panels only, recomputation apart), summed over ranks, / median step / the
//                      ranks' summed peaks (nn::product_peak: the probe of memory/peak_flops.h for
//                      the run's compute dtype); docs/benchmarks.md, "Model FLOPs utilisation".
//   cpu_s, busy_share, cpu_mfu = the step's CPU seconds and mfu split as cpu_mfu x busy_share (Note
//                      [busy share] below): the work's own efficiency and the threads' idle share.
#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/support/bench_args.h"
#include "benchmarks/support/bench_group.h"
#include "benchmarks/support/bench_json.h"
#include "comm/comm.h"
#include "core/errors.h"
#include "core/log.h"
#include "engine/config.h"
#include "engine/dataset_source.h"
#include "engine/engine.h"
#include "launch/launch.h"
#include "memory/cpu_features.h"
#include "nn/detail/gemm.h"
#include "nn/data.h"
#include "nn/flops.h"
#include "nn/gpt.h"
#include "nn/layers.h"
#include "nn/llama.h"
#include "run/run_config.h"

using namespace zs;

namespace {

struct GemmShape {
  std::string what;
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0;
  float beta = 0.0f;
  int64_t count = 0;  // times per training step
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
};

// Every sgemm of one training step of `cfg` at micro batch B (nn/layers.cpp, nn/attention.cpp,
// nn/gpt.cpp), full T x T attention.
std::vector<GemmShape> step_gemms(const nn::GptConfig& cfg, int64_t B) {
  const int64_t T = cfg.seq_len, C = cfg.d_model, V = cfg.vocab_size, L = cfg.n_layer, H = cfg.n_head;
  const int64_t N = B * T, hs = C / H;
  std::vector<GemmShape> s;
  auto linear = [&](const std::string& name, int64_t in, int64_t out, int64_t count) {
    s.push_back({name + " fwd", false, true, N, out, in, 1.0f, count});
    s.push_back({name + " dX", false, false, N, in, out, 0.0f, count});
    s.push_back({name + " dW", true, false, out, in, N, 1.0f, count});
  };
  linear("attn.qkv", C, 3 * C, L);
  linear("attn.proj", C, C, L);
  linear("mlp.fc", C, 4 * C, L);
  linear("mlp.proj", 4 * C, C, L);
  const int64_t heads = L * B * H;
  s.push_back({"attn q k^T", false, true, T, T, hs, 0.0f, heads});
  s.push_back({"attn P v", false, false, T, hs, T, 0.0f, heads});
  s.push_back({"attn dP = dY v^T", false, true, T, T, hs, 0.0f, heads});
  s.push_back({"attn dV = P^T dY", true, false, T, hs, T, 0.0f, heads});
  s.push_back({"attn dQ = dS k", false, false, T, hs, T, 0.0f, heads});
  s.push_back({"attn dK = dS^T q", true, false, T, hs, T, 0.0f, heads});
  linear("lm_head", C, V, 1);
  return s;
}

// Runs the GEMMs of one step on shared operands; returns the pass time and adds each shape's time.
class CeilingPass {
 public:
  explicit CeilingPass(std::vector<GemmShape> shapes) : shapes_(std::move(shapes)), per_shape_(shapes_.size()) {
    size_t most = 0;
    for (const auto& g : shapes_) most = std::max({most, size_t(g.m * g.k), size_t(g.k * g.n), size_t(g.m * g.n)});
    for (auto* buf : {&a_, &b_, &c_}) {
      buf->resize(most);
      for (size_t i = 0; i < most; ++i) (*buf)[i] = 0.01f * static_cast<float>(static_cast<int>(i % 201) - 100);
    }
  }
  double run() {
    const double t0 = bench::now_seconds();
    for (size_t i = 0; i < shapes_.size(); ++i) {
      const GemmShape& g = shapes_[i];
      const int lda = static_cast<int>(g.ta ? g.m : g.k), ldb = static_cast<int>(g.tb ? g.k : g.n);
      const double s0 = bench::now_seconds();
      for (int64_t r = 0; r < g.count; ++r) {
        cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans,
                    static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), 1.0f, a_.data(), lda,
                    b_.data(), ldb, g.beta, c_.data(), static_cast<int>(g.n));
        // Keep dW-style accumulation bounded across repetitions.
        if (g.beta != 0.0f && r % 16 == 15) std::fill_n(c_.data(), g.m * g.n, 0.0f);
      }
      per_shape_[i].push_back(bench::now_seconds() - s0);
    }
    return bench::now_seconds() - t0;
  }
  const std::vector<GemmShape>& shapes() const { return shapes_; }
  double median_shape_time(size_t i) const { return bench::median(per_shape_[i]); }
  double flops() const {
    double f = 0;
    for (const auto& g : shapes_) f += g.flops() * static_cast<double>(g.count);
    return f;
  }

 private:
  std::vector<GemmShape> shapes_;
  std::vector<std::vector<double>> per_shape_;
  std::vector<float> a_, b_, c_;
};

double summed(const comm::Group& g, double v) {
  float x = static_cast<float>(v);
  if (g.size() > 1) g.allreduce(memory::Tensor(&x, memory::DType::kF32, {1}));
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  launch::select_blas_kernels(argv);
  try {
    const std::string isa_arg = bench::arg_value(argc, argv, "--isa", "");  // before any kernel is chosen
    if (!isa_arg.empty()) memory::set_isa_cap(memory::parse_isa(isa_arg, "--isa"));
    auto world = comm::World::create();
    const comm::Group& group = world.group();
    const int ranks = group.size();
    const bool root = group.rank() == 0;
    const int threads = launch::set_blas_threads(launch::local_rank_count());

    const nn::GptConfig gcfg = bench::gpt_config_arg(
        argc, argv, {.n_layer = 4, .d_model = 512, .n_head = 8, .seq_len = 256, .vocab_size = 256});
    const std::string model_arg = bench::arg_value(argc, argv, "--model", "gpt");
    if (model_arg != "gpt" && model_arg != "llama") throw ConfigError("--model: expected gpt or llama, got '" + model_arg + "'");
    const bool llama = model_arg == "llama";
    const nn::LlamaConfig lcfg{.n_layer = gcfg.n_layer, .d_model = gcfg.d_model, .n_head = gcfg.n_head,
                               .n_kv_head = bench::int_arg(argc, argv, "--n-kv-head", gcfg.n_head),
                               .d_ff = bench::int_arg(argc, argv, "--d-ff", 0, 0), .max_seq_len = gcfg.seq_len,
                               .vocab_size = gcfg.vocab_size};
    if (llama) nn::validate(lcfg);
    const int64_t micro = bench::int_arg(argc, argv, "--micro-batch", 8);
    const int64_t steps = bench::int_arg(argc, argv, "--steps", 5);
    const int64_t warmup = bench::int_arg(argc, argv, "--warmup", 2);
    // --precision bf16: bf16 parameters, products on nn/detail/gemm.h's bf16 path where the CPU has one.
    // --isa avx2 caps the library's SIMD choice (memory::set_isa_cap), which also turns that path off:
    // the bf16 step as it ran before the bf16 kernel, for a same-binary before/after.
    const std::string precision_arg = bench::arg_value(argc, argv, "--precision", "fp32");
    if (precision_arg != "fp32" && precision_arg != "bf16") {
      throw ConfigError("--precision: expected fp32 or bf16, got '" + precision_arg + "'");
    }
    // --no-ceiling: training steps only (for profiling the step); the ratio is then not measured.
    const bool with_ceiling = !llama && !bench::has_flag(argc, argv, "--no-ceiling");

    zs::run::RunConfig cfg;
    cfg.batch = engine::resolve_batch(0, micro, 1, ranks);
    if (llama) {
      cfg.model_type = "llama";
      cfg.model_llama = lcfg;
    } else {
      cfg.model = gcfg;
    }
    cfg.precision = precision_arg == "bf16" ? engine::Precision::kBf16 : engine::Precision::kFp32;
    cfg.device.memory_mb = bench::int_arg(argc, argv, "--memory-mb", 2048);
    init_logging({group.rank(), ranks}, LogConfig{.level = "warn"});
    std::unique_ptr<nn::Model> model;
    if (llama) model = std::make_unique<nn::LlamaModel>(lcfg);
    else model = std::make_unique<nn::GptModel>(gcfg);
    engine::Engine eng(*model, cfg, group);
    engine::DatasetSource source(nn::Dataset::builtin(gcfg.seq_len), 7);
    // Without the ceiling no operands either (the LLaMA's head alone would be 3 x N x V floats).
    CeilingPass ceiling(with_ceiling ? step_gemms(gcfg, micro) : std::vector<GemmShape>{});
    // Model FLOPs utilisation's denominator: this rank's cores, every rank measuring at once.
    const memory::PeakFlops& peak = nn::product_peak(cfg.compute_dtype());

    const int64_t tokens_per_step = micro * gcfg.seq_len * ranks;
    const double flops_per_token = llama ? nn::llama_train_flops_per_token(lcfg, gcfg.seq_len)
                                         : nn::gpt_train_flops_per_token(gcfg, gcfg.seq_len);
    if (root) {
      const std::string llama_shape =
          llama ? fmt::format(" n_kv_head {} d_ff {}", lcfg.n_kv_head, nn::llama_d_ff(lcfg)) : std::string();
      std::printf("train_bench: %s n_layer %lld d_model %lld n_head %lld%s seq_len %lld vocab %lld (%lld params), "
                  "micro batch %lld x %d rank(s), %s, ZeRO 0, bf16 products %s\n",
                  llama ? "LLaMA" : "GPT", (long long)gcfg.n_layer, (long long)gcfg.d_model, (long long)gcfg.n_head,
                  llama_shape.c_str(), (long long)gcfg.seq_len,
                  (long long)gcfg.vocab_size, (long long)eng.param_count(), (long long)micro, ranks, precision_arg.c_str(),
                  nn::bf16_products_description().c_str());
      std::printf("OpenBLAS core %s (preferred for this CPU: %s), %d thread(s) per rank; %lld warm-up + %lld "
                  "measured steps\n",
                  launch::loaded_blas_core().c_str(), launch::preferred_blas_core().c_str(), threads,
                  (long long)warmup, (long long)steps);
    }
    for (int64_t i = 0; i < warmup; ++i) {
      eng.train_batch(source);
      if (with_ceiling) ceiling.run();
    }
    std::vector<double> step_s, cpu_s, pass_s, fwd_s, bwd_s, opt_s;
    double loss = 0;
    uint64_t model_flops = 0, recompute_flops = 0;  // this rank's, per step (the same every step)
    for (int64_t i = 0; i < steps; ++i) {
      group.barrier();
      const double t0 = bench::now_seconds(), c0 = bench::process_cpu_seconds();
      const engine::StepReport r = eng.train_batch(source);
      const double cpu = bench::process_cpu_seconds() - c0;
      step_s.push_back(bench::slowest(group, bench::now_seconds() - t0));
      cpu_s.push_back(cpu);
      fwd_s.push_back(bench::slowest(group, r.forward_s));
      bwd_s.push_back(bench::slowest(group, r.backward_s));
      opt_s.push_back(bench::slowest(group, r.optimizer_s));
      loss = r.loss;
      model_flops = r.model_flops;
      recompute_flops = r.recompute_flops;
      group.barrier();
      if (with_ceiling) pass_s.push_back(ceiling.run());
    }
    const double t_step = bench::median(step_s);
    const double tokens_s = static_cast<double>(tokens_per_step) / t_step;
    const double achieved = flops_per_token * tokens_s / 1e9;
    const double rank_ceiling = with_ceiling ? ceiling.flops() / bench::median(pass_s) / 1e9 : 0.0;
    const double ceiling_gflops = summed(group, rank_ceiling);
    const double ratio = with_ceiling ? achieved / ceiling_gflops : 0.0;
    const double gemm_s_per_step = with_ceiling ? ceiling.flops() * ranks / (ceiling_gflops * 1e9) : 0.0;
    // MFU: the kernels' count (nn/flops.h; causal attention's skipped blocks not credited, unlike
    // flops_per_token's full T x T) over the median step and the ranks' summed peaks.
    const double step_model_flops = summed(group, static_cast<double>(model_flops));
    const double step_recompute_flops = summed(group, static_cast<double>(recompute_flops));
    const double peak_flops = summed(group, peak.flops_per_s);
    const double mfu = step_model_flops / t_step / peak_flops;
    // Note [busy share]
    // MFU = cpu_mfu x busy_share. cpu_s: the ranks' summed CPU seconds per step
    // (each rank's median; every thread of the process, the pool's polling workers included);
    // busy_share: those seconds over the step's wall time x the compute threads (1: every thread
    // busy throughout; below 1: threads idle, waiting for each other or preempted); cpu_mfu: the MFU
    // the step would reach with its CPU seconds spread over the threads without idling (the work's
    // own efficiency). The CPU figures hold under load, where the wall time is the scheduler's share.
    const double step_cpu_s = summed(group, bench::median(cpu_s));
    const double thread_count = static_cast<double>(ranks) * static_cast<double>(peak.threads);
    const double busy_share = step_cpu_s / (t_step * thread_count);
    const double cpu_mfu = step_model_flops / step_cpu_s / (peak_flops / thread_count);

    bench::Report report;
    report.benchmark = "train_bench";
    report.config = {{"model", model_arg}, {"n_layer", gcfg.n_layer}, {"d_model", gcfg.d_model}, {"n_head", gcfg.n_head},
                     {"seq_len", gcfg.seq_len}, {"vocab_size", gcfg.vocab_size}, {"micro_batch", micro},
                     {"ranks", ranks}, {"blas_threads_per_rank", threads}, {"blas_core", launch::loaded_blas_core()},
                     {"preferred_blas_core", launch::preferred_blas_core()}, {"params", eng.param_count()},
                     {"steps", steps}, {"warmup", warmup}, {"precision", precision_arg}, {"zero_stage", 0},
                     {"bf16_gemm_path", std::string(nn::detail::gemm_path_name(nn::detail::bf16_gemm_path()))},
                     {"bf16_rate_over_fma", nn::detail::bf16_gemm_choice().rate_over_fma}};
    if (llama) {
      report.config["n_kv_head"] = lcfg.n_kv_head;
      report.config["d_ff"] = nn::llama_d_ff(lcfg);
    }
    report.results.push_back(boost::json::object{
        {"step_s", t_step}, {"forward_s", bench::median(fwd_s)}, {"backward_s", bench::median(bwd_s)},
        {"optimizer_s", bench::median(opt_s)}, {"tokens_per_step", tokens_per_step}, {"tokens_per_s", tokens_s},
        {"flops_per_token", flops_per_token}, {"achieved_gflops", achieved}, {"loss", loss},
        {"model_flops_per_step", step_model_flops}, {"recompute_flops_per_step", step_recompute_flops},
        {"peak_gflops", peak_flops / 1e9}, {"mfu", mfu}, {"cpu_s", step_cpu_s}, {"busy_share", busy_share},
        {"cpu_mfu", cpu_mfu},
        {"peak", boost::json::object{{"kind", memory::peak_kind_name(peak.kind)}, {"instruction", peak.instruction},
                                     {"isa", memory::isa_name(peak.isa)}, {"threads_per_rank", peak.threads},
                                     {"probe_s", peak.probe_s}}}});
    boost::json::array shapes;
    for (size_t i = 0; i < ceiling.shapes().size(); ++i) {
      const GemmShape& g = ceiling.shapes()[i];
      const double t = ceiling.median_shape_time(i);
      shapes.push_back(boost::json::object{{"what", g.what}, {"m", g.m}, {"n", g.n}, {"k", g.k}, {"trans_a", g.ta},
                                           {"trans_b", g.tb}, {"count", g.count},
                                           {"gflops", g.flops() * static_cast<double>(g.count) / t / 1e9}});
    }
    report.baseline = {{"what", "OpenBLAS sgemm on the step's shapes, FLOP-weighted, same threads"},
                       {"ceiling_gflops", ceiling_gflops}, {"ceiling_gflops_per_rank", rank_ceiling},
                       {"gemm_s_per_step", gemm_s_per_step}, {"shapes_rank0", shapes}};
    report.ratio = ratio;

    if (root) {
      std::printf("\n%-30s %12s\n", "metric", "value");
      std::printf("%-30s %12.3f\n", "step time (s, median)", t_step);
      std::printf("%-30s %12.3f\n", "  forward (s)", bench::median(fwd_s));
      std::printf("%-30s %12.3f\n", "  backward (s)", bench::median(bwd_s));
      std::printf("%-30s %12.3f\n", "  optimizer (s)", bench::median(opt_s));
      std::printf("%-30s %12.0f\n", "tokens/s (all ranks)", tokens_s);
      std::printf("%-30s %12.1f\n", "achieved GFLOP/s", achieved);
      std::printf("%-30s %12.1f\n", "sgemm ceiling GFLOP/s", ceiling_gflops);
      std::printf("%-30s %12.3f\n", "  its GEMMs alone (s/step)", gemm_s_per_step);
      std::printf("%-30s %12.3f\n", "ratio achieved / ceiling", ratio);
      std::printf("%-30s %12.3g\n", "model FLOPs/step (kernels)", step_model_flops);
      std::printf("%-30s %12.1f  (%s, %s, %d thread(s)/rank)\n", "peak GFLOP/s (probe)", peak_flops / 1e9,
                  std::string(peak.instruction).c_str(), std::string(memory::isa_name(peak.isa)).c_str(), peak.threads);
      std::printf("%-30s %12.3f\n", "MFU", mfu);
      std::printf("%-30s %12.3f\n", "  CPU s/step (all ranks)", step_cpu_s);
      std::printf("%-30s %12.3f\n", "  busy share of the threads", busy_share);
      std::printf("%-30s %12.3f\n", "  MFU of the CPU seconds", cpu_mfu);
      if (with_ceiling) std::printf("\nceiling shapes (rank 0, %d thread(s)):\n%-20s %5s %5s %5s %3s %3s %6s %9s\n", threads, "gemm", "m",
                  "n", "k", "tA", "tB", "count", "GFLOP/s");
      for (const auto& v : shapes) {
        const auto& o = v.as_object();
        std::printf("%-20s %5lld %5lld %5lld %3d %3d %6lld %9.1f\n", o.at("what").as_string().c_str(),
                    (long long)o.at("m").as_int64(), (long long)o.at("n").as_int64(), (long long)o.at("k").as_int64(),
                    (int)o.at("trans_a").as_bool(), (int)o.at("trans_b").as_bool(), (long long)o.at("count").as_int64(),
                    o.at("gflops").as_double());
      }
    }
    const std::string path = bench::json_path_arg(argc, argv);
    if (!path.empty() && root) report.write(path);
    return 0;
  } catch (const std::exception& e) {
    comm::World::abort(std::string("train_bench: ") + e.what(), 1);
  }
}
