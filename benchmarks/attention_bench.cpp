// Question: does the fused attention (nn/fused_attention.h) keep activation memory O(s) and run at
// least as fast as the plain kernel it replaces? (issue 34) At sequence lengths 512, 1024, 2048 and
// 8192, 8 heads of 64 (d_model 512), batch 1, fp32:
//  (1) activation bytes per layer: the live kActivation bytes an nn::CausalSelfAttention holds between
//      its forward and its backward (what it saves), and the peak of all its allocations over a
//      forward + backward, each kernel;
//  (2) forward + backward time of the attention core between the two linears (the plain
//      detail::causal_attention_forward/backward on a packed qkv against fused_attention_forward/
//      backward on the same qkv), the two run alternately so a load change on a shared machine touches
//      both alike; median of --reps, ratio fused / plain in the same run (target <= 1.0 from 1024);
//  (3) the 8192 layer at batch --arena-batch (2) in a 4 GiB device arena (memory::DeviceAllocator on a
//      CpuBackend of that capacity, the engine's allocator): forward + backward of each kernel; the
//      plain one's (B, 8, 8192, 8192) probabilities do not fit, the fused layer trains.
//
//   nice -n 19 build/release/benchmarks/attention_bench [--json out.json] [--seqs 512,1024,2048,8192]
//          [--reps 5] [--long-reps 2] [--threads 2] [--arena-mb 4096] [--arena-batch 2]
#include <cblas.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "benchmarks/support/bench_json.h"
#include "core/errors.h"
#include "memory/allocator.h"
#include "memory/cpu_backend.h"
#include "memory/cpu_features.h"
#include "nn/attention.h"
#include "nn/detail/attention.h"
#include "nn/fused_attention.h"
#include "nn/host_context.h"
#include "nn/module.h"

using namespace zs;
using memory::DType;
using memory::Tensor;

namespace {

constexpr int64_t kHeads = 8, kHeadDim = 64, kDModel = kHeads * kHeadDim;

Tensor random_tensor(memory::Shape shape, uint64_t seed) {
  Tensor t = Tensor::empty(std::move(shape), DType::kF32);
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& v : t.f32()) v = dist(gen);
  return t;
}

// A Context whose tensors come from a DeviceAllocator of fixed capacity (the engine's arena), saved
// activations from the low pool, the rest from the high one; an allocation that does not fit throws
// OutOfMemoryError naming it.
class ArenaContext : public nn::Context {
 public:
  explicit ArenaContext(size_t bytes) : backend_(bytes), alloc_(backend_, bytes, nullptr) {}
  Tensor allocate(memory::Shape shape, DType dtype, nn::MemoryUse use) override {
    const bool saved = use == nn::MemoryUse::kActivation;
    auto block = std::make_shared<memory::DeviceBlock>(alloc_.allocate_tensor(
        shape, dtype, memory::Category::kActivations,
        saved ? memory::Lifetime::kSaved : memory::Lifetime::kTransient));
    Tensor view = block->tensor();
    return Tensor(view.raw(), view.dtype(), view.shape(), view.strides(), block);
  }
  bool training() const override { return true; }

 private:
  memory::CpuBackend backend_;
  memory::DeviceAllocator alloc_;
};

// One CausalSelfAttention layer: forward + backward on x (B, T, C); the saved and peak bytes.
struct LayerMemory {
  size_t saved = 0, peak = 0;
};
LayerMemory layer_memory(nn::Context& ctx, nn::AttentionKernel kernel, int64_t B, int64_t T,
                         nn::HostContext* host) {
  nn::CausalSelfAttention layer(kDModel, kHeads);
  layer.set_kernel(kernel);
  nn::materialize(layer, 1);
  const Tensor x = random_tensor({B, T, kDModel}, 2);
  Tensor y = ctx.forward(layer, x);
  LayerMemory m;
  if (host != nullptr) m.saved = host->live_bytes(nn::MemoryUse::kActivation);
  Tensor dx = ctx.backward(layer, random_tensor(y.shape(), 3));
  if (host != nullptr) {
    for (auto use : {nn::MemoryUse::kActivation, nn::MemoryUse::kScratch, nn::MemoryUse::kGradient}) {
      m.peak += host->peak_bytes(use);
    }
  }
  return m;
}

// The attention core, forward + backward, seconds.
double time_core(nn::AttentionKernel kernel, const Tensor& qkv, const Tensor& dy) {
  nn::HostContext ctx;
  const int64_t C = kDModel, H = kHeads;
  const double t0 = bench::now_seconds();
  if (kernel == nn::AttentionKernel::kPlain) {
    nn::detail::SingleThreadedBlas blas;
    Tensor probs;
    Tensor y = nn::detail::causal_attention_forward(ctx, qkv, H, nn::detail::GemmPath::kSgemm, true, &probs, blas);
    nn::detail::AttentionScratch scratch;
    Tensor dqkv = nn::detail::causal_attention_backward(ctx, qkv, probs, dy, H, nn::detail::GemmPath::kSgemm,
                                                        &scratch, blas);
  } else {
    const nn::AttentionHeads q{qkv, 0, H}, k{qkv, C, H}, v{qkv, 2 * C, H};
    nn::FusedAttentionSaved s = nn::fused_attention_forward(ctx, q, k, v, kHeadDim, DType::kF32);
    Tensor dqkv = ctx.allocate(qkv.shape(), DType::kF32, nn::MemoryUse::kGradient);
    nn::fused_attention_backward(ctx, q, k, v, s, dy, kHeadDim, DType::kF32, {dqkv, 0, H}, {dqkv, C, H},
                                 {dqkv, 2 * C, H});
  }
  return bench::now_seconds() - t0;
}

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoll(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<int64_t> seqs = parse_list(bench::arg_value(argc, argv, "--seqs", "512,1024,2048,8192"));
  const int reps = std::stoi(bench::arg_value(argc, argv, "--reps", "5"));
  const int long_reps = std::stoi(bench::arg_value(argc, argv, "--long-reps", "2"));
  const int threads = std::stoi(bench::arg_value(argc, argv, "--threads", "2"));
  const size_t arena_mb = std::stoull(bench::arg_value(argc, argv, "--arena-mb", "4096"));
  const int64_t arena_batch = std::stoll(bench::arg_value(argc, argv, "--arena-batch", "2"));
  openblas_set_num_threads(threads);

  bench::Report report;
  report.benchmark = "attention_bench";
  report.config = {{"heads", kHeads},       {"head_dim", kHeadDim},    {"batch", 1},
                   {"threads", threads},    {"reps", reps},            {"long_reps", long_reps},
                   {"arena_mb", arena_mb},  {"arena_batch", arena_batch},
                   {"isa", std::string(memory::isa_name(memory::best_isa()))}};
  boost::json::object ratios;
  std::printf("%6s | %14s %14s | %14s %14s | %9s %9s %6s\n", "seq", "plain saved", "fused saved", "plain peak",
              "fused peak", "plain s", "fused s", "ratio");
  for (int64_t T : seqs) {
    LayerMemory mem[2];
    for (int k = 0; k < 2; ++k) {
      nn::HostContext host;
      mem[k] = layer_memory(host, k == 0 ? nn::AttentionKernel::kPlain : nn::AttentionKernel::kFused, 1, T, &host);
    }
    const Tensor qkv = random_tensor({1, T, 3 * kDModel}, 4), dy = random_tensor({1, T, kDModel}, 5);
    std::vector<double> t_plain, t_fused;
    const int n = T >= 4096 ? long_reps : reps;
    time_core(nn::AttentionKernel::kFused, qkv, dy);  // warm-up: first-touch pages, packing buffers
    for (int r = 0; r < n; ++r) {
      t_plain.push_back(time_core(nn::AttentionKernel::kPlain, qkv, dy));
      t_fused.push_back(time_core(nn::AttentionKernel::kFused, qkv, dy));
    }
    const double plain = bench::median(t_plain), fused = bench::median(t_fused);
    std::printf("%6lld | %14zu %14zu | %14zu %14zu | %9.4f %9.4f %6.3f\n", static_cast<long long>(T), mem[0].saved,
                mem[1].saved, mem[0].peak, mem[1].peak, plain, fused, fused / plain);
    report.results.push_back({{"seq", T},
                              {"plain_saved_bytes", mem[0].saved},
                              {"fused_saved_bytes", mem[1].saved},
                              {"plain_peak_bytes", mem[0].peak},
                              {"fused_peak_bytes", mem[1].peak},
                              {"plain_fwd_bwd_s", plain},
                              {"fused_fwd_bwd_s", fused},
                              {"plain_times_s", boost::json::value_from(t_plain)},
                              {"fused_times_s", boost::json::value_from(t_fused)}});
    ratios["seq" + std::to_string(T)] = fused / plain;
    if (T == seqs.front()) report.baseline = {{"kernel", "plain"}, {"what", "same-run plain attention core"}};
  }
  report.ratio = ratios;

  // (3) The longest sequence in a fixed arena.
  const int64_t T = seqs.back();
  boost::json::object arena;
  for (int k = 0; k < 2; ++k) {
    const auto kernel = k == 0 ? nn::AttentionKernel::kPlain : nn::AttentionKernel::kFused;
    const std::string name(nn::attention_kernel_name(kernel));
    try {
      ArenaContext ctx(arena_mb << 20);
      layer_memory(ctx, kernel, arena_batch, T, nullptr);
      std::printf("arena %zu MiB, batch %lld, seq %lld: %s trains\n", arena_mb, static_cast<long long>(arena_batch),
                  static_cast<long long>(T), name.c_str());
      arena[name] = "fits";
    } catch (const OutOfMemoryError& e) {
      std::printf("arena %zu MiB, batch %lld, seq %lld: %s does not fit: %s\n", arena_mb,
                  static_cast<long long>(arena_batch), static_cast<long long>(T), name.c_str(), e.what());
      arena[name] = std::string("out of memory: ") + e.what();
    }
  }
  report.results.push_back({{"arena", arena}, {"seq", T}, {"batch", arena_batch}});
  const std::string path = bench::json_path_arg(argc, argv);
  if (!path.empty()) report.write(path);
  return 0;
}
