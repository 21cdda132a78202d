// One-bit Adam and 0/1 Adam (DeepSpeed's `OneBitAdam` and `ZeroOneAdam` optimizer types): configs
// and the per-element kernels both algorithms are built from. optim knows nothing of MPI: the engine
// owns the buffers, runs the (compressed) collectives between the kernels and follows the phase
// rules below (one_bit_frozen here, ZeroOneSchedule in optim/zero_one_adam.h).
//
// One-bit Adam (arXiv 2102.02888; deepspeed/runtime/fp16/onebit/adam.py), step t:
//   t <= freeze_step (warm-up): gradients averaged exactly, then adam_update.
//   t >  freeze_step:           momentum_update with the local gradient; m <- compressed average of
//                               m (comm::OneBitAllreduce, error buffers starting at zero); frozen_update.
// 0/1 Adam (arXiv 2202.06009; zoadam.py): see optim/zero_one_adam.h for which kernels a step runs.
//
//   CompressedChunk c{.master = p, .exp_avg = m, .exp_avg_sq = v, .grad = g, .n = n};
//   const CompressedConstants k = compressed_constants(cfg, {.lr = lr, .grad_scale = 1.0f / loss_scale});
//   if (!one_bit_frozen(cfg, t)) { average(g); adam_update(c, k); }
//   else { momentum_update(c, k); reduce(std::span(m, n)); frozen_update(c, k); }
//
// Note [Differences from DeepSpeed]
// - No bias correction and decoupled weight decay, as DeepSpeed: update = m / (sqrt(v) + eps) + wd p,
//   p -= lr * update (wd = 0 for chunks with apply_weight_decay false).
// - DeepSpeed's first step() call only allocates buffers (a CUDA artefact: no update, but it counts
//   one step). It is not replicated: step 1 here is the first real update, and the phase rules are
//   DeepSpeed's, written with state['step'] = our t. Under DeepSpeed every phase change, 0/1 Adam
//   variance step and sync therefore comes one real update earlier than with the same config here.
// - DeepSpeed skips the compressed allreduce (and, in 0/1 Adam's compressed-gradient steps, the
//   whole momentum update) when the world has one rank; comm's one-bit allreduce compresses for a
//   group of one as well, so the numerics here do not depend on the world size being 1.
// - exp_avg_mask (a per-group momentum mask) and parameter groups with `non_freeze` are not supported;
//   the engine masks elements that never had a gradient instead (Note [momentum mask]).
// Checked step by step against DeepSpeed (issue 38, tests/optim/onebit_deepspeed_test.cpp: a
// reference written from adam.py and nccl.py, bit for bit at np 2, 3, 4 through the warm-up, the
// freeze and 50 compressed steps): the error feedback starts at zero at the first compressed step
// (DeepSpeed allocates it there), the momentum keeps running through the freeze and is replaced by
// its compressed average, the variance is frozen at its step-freeze_step value, weight decay is
// added to the update. What differs, deliberately:
// - Scales: zeroshard's default compresses the flat buffer in 256-element blocks, DeepSpeed per
//   tensor; compression_scale "tensor" is DeepSpeed's (comm/compressed_allreduce.h). Quality of both:
//   docs/benchmarks.md "onebit_quality" (blocks never worse at d_model 128 and 256, 0.2 points behind
//   at 512; per tensor lost up to 9.6% on one seed when compressing from the lr peak: Note
//   [compression at the lr peak], engine/compressed_step.cpp).
// - Weight decay is not applied to biases and LayerNorm weights (the engine's parameter groups);
//   DeepSpeed applies it to every parameter of a group unless the user builds groups.
// - The server averages (sum_r s_r sign_r) / N in block mode, DeepSpeed sum_r (s_r / N) sign_r (so
//   does "tensor" mode): the same numbers when N is a power of two, one rounding apart otherwise.
// - A checkpoint restores each rank's error feedback when the world size and layout match; DeepSpeed
//   resets it at every load (comm::OneBitAllreduce::reset_errors otherwise, as DeepSpeed).
//
// Kernel contract: every kernel updates the n elements of one chunk, element by element in fp32 with
// exactly the operations listed at its declaration, so results do not depend on how a partition is
// cut into chunks or pieces. Each has a scalar `_reference` twin (a plain loop, then a separate
// conversion pass) that the fast version equals bit for bit, for every ISA; the fast versions run
// GCC-vectorised loops compiled for the ISA (files built with -ffp-contract=off -fno-math-errno, so
// no fused multiply-add and a correctly rounded vector sqrt). The low-precision copy, where a kernel
// writes it, is memory::convert's (round to nearest even) of the updated master weights. Arrays a
// kernel does not list may be nullptr; no two arrays may overlap; no alignment is needed.
// Thread-safety: kernels touch only their chunk; disjoint chunks may run concurrently.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "memory/cpu_features.h"
#include "memory/dtype.h"

namespace zs::optim {

// How the compressed allreduce scales its 1-bit values (optimizer.params.compression_scale; the
// engine builds comm::OneBitAllreduce accordingly, comm/compressed_allreduce.h).
enum class CompressionScale {
  kBlock,   // "block": one scale per 256 elements of the flat buffer (Note [One-bit allreduce])
  kTensor,  // "tensor": DeepSpeed's, one per parameter tensor (Note [Per-tensor scales])
};

struct OneBitAdamConfig {
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t freeze_step = 100000;  // warm-up steps (exact averaging, variance updated); >= 1
  CompressionScale compression_scale = CompressionScale::kBlock;
};

struct ZeroOneAdamConfig {
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t var_freeze_step = 100000;    // variance frozen after this step (see optim/zero_one_adam.h)
  int64_t var_update_scaler = 16;      // variance-update interval doubles every this many updates
  int64_t local_step_scaler = 32678;   // local-step interval doubles every this many frozen steps...
  int64_t local_step_clipper = 16;     // ...up to this many steps between synchronisations
  CompressionScale compression_scale = CompressionScale::kBlock;
};

// Throw ConfigError naming `json_path` plus the key (e.g. "optimizer.params.freeze_step") and the
// accepted range: lr >= 0, betas in [0, 1), eps > 0, weight_decay >= 0, freeze_step >= 1 (the
// variance must be warmed up before it is frozen), var_freeze_step >= 0, scalers and clipper >= 1.
void validate(const OneBitAdamConfig& config, const std::string& json_path);
void validate(const ZeroOneAdamConfig& config, const std::string& json_path);

// One-bit Adam's phase: step t (1-based) is compressed iff t > freeze_step (DeepSpeed flips
// adam_freeze_key at the end of the step where state['step'] >= freeze_step).
bool one_bit_frozen(const OneBitAdamConfig& config, int64_t step);

// Plain fp32 views of one chunk, all n elements long (nullptr where the kernel does not use it).
struct CompressedChunk {
  float* master = nullptr;       // fp32 master weights p
  float* exp_avg = nullptr;      // m
  float* exp_avg_sq = nullptr;   // v
  float* accumulator = nullptr;  // 0/1 Adam's u (momentum accumulator); zero-initialised by the owner
  const float* grad = nullptr;   // g (local or averaged, as the phase says)
  size_t n = 0;
  // Optional bf16/fp16 copy of the updated weights, written by the kernels that change p and say so.
  void* low_precision = nullptr;
  memory::DType low_precision_dtype = memory::DType::kBF16;
  bool apply_weight_decay = true;  // false for biases and norm weights

  // Elements [begin, end) of every array (the low-precision pointer offset by its element size).
  CompressedChunk slice(size_t begin, size_t end) const;
};

// What is the same for every chunk of one step.
struct CompressedStep {
  double lr = 1e-3;           // this step's learning rate
  float grad_scale = 1.0f;    // multiplies every gradient first (clipping coefficient, 1 / loss scale)
  double lrs = 0.0;           // sync_finish only: ZeroOneSchedule::Plan::lrs_at_sync
};

// The per-step scalars, folded once (the kernels and the references use exactly these floats).
struct CompressedConstants {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float one_minus_beta1 = 0.1f;   // float(1.0 - beta1) in double, as torch's alpha = 1 - beta1
  float one_minus_beta2 = 0.001f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;      // replaced by 0 for chunks with apply_weight_decay false
  float lr = 1e-3f;
  float grad_scale = 1.0f;
  float lrs = 0.0f;
};
CompressedConstants compressed_constants(const OneBitAdamConfig& config, const CompressedStep& step);
CompressedConstants compressed_constants(const ZeroOneAdamConfig& config, const CompressedStep& step);

// In the formulas: gs = grad * grad_scale, d = sqrt(v) + eps, wd = weight_decay (0 if the chunk has
// apply_weight_decay false), all fp32 and evaluated left to right as written.

// Warm-up / variance-update step. Uses master, exp_avg, exp_avg_sq, grad; writes the low copy.
//   m = b1 m + (1-b1) gs;  v = b2 v + (1-b2) gs gs;  upd = m / d + wd p;  p = p - lr upd
void adam_update(const CompressedChunk& c, const CompressedConstants& k, memory::IsaLevel isa = memory::best_isa());
void adam_update_reference(const CompressedChunk& c, const CompressedConstants& k);

// Local momentum before it (one-bit Adam) is compressed. Uses exp_avg, grad.
//   m = b1 m + (1-b1) gs
void momentum_update(const CompressedChunk& c, const CompressedConstants& k,
                     memory::IsaLevel isa = memory::best_isa());
void momentum_update_reference(const CompressedChunk& c, const CompressedConstants& k);

// Update with the variance frozen (after the compressed average of m, or of the gradient in 0/1
// Adam's compressed-gradient steps). Uses master, exp_avg, exp_avg_sq; writes the low copy.
//   upd = m / d + wd p;  p = p - lr upd
void frozen_update(const CompressedChunk& c, const CompressedConstants& k, memory::IsaLevel isa = memory::best_isa());
void frozen_update_reference(const CompressedChunk& c, const CompressedConstants& k);

// 0/1 Adam's local step. Uses master, exp_avg, exp_avg_sq, accumulator, grad; writes the low copy.
//   m = b1 m + (1-b1) gs;  upd = m / d + wd p;  p = p - lr upd;  u = u - lr upd
void local_step(const CompressedChunk& c, const CompressedConstants& k, memory::IsaLevel isa = memory::best_isa());
void local_step_reference(const CompressedChunk& c, const CompressedConstants& k);

// 0/1 Adam, before u is compressed: undo the local steps and scale u into momentum units.
// Uses master, exp_avg_sq, accumulator; no low copy (sync_finish writes it).
//   p = p - u;  u = u d
void sync_prepare(const CompressedChunk& c, const CompressedConstants& k, memory::IsaLevel isa = memory::best_isa());
void sync_prepare_reference(const CompressedChunk& c, const CompressedConstants& k);

// local_step then sync_prepare in one pass (a sync step's local part); bit-identical to calling the
// two references in turn, except that no low copy is written (sync_finish writes it).
void local_step_sync_prepare(const CompressedChunk& c, const CompressedConstants& k,
                             memory::IsaLevel isa = memory::best_isa());

// 0/1 Adam, after u was replaced by its compressed average. Uses master, exp_avg, exp_avg_sq,
// accumulator and k.lrs; writes the low copy.
//   m = -(u / lrs);  p = p + u / d;  u = 0
// With lrs == 0 (every local step since the last sync had lr 0) m is left unchanged, where DeepSpeed
// would divide 0 by 0 and poison training with NaN.
void sync_finish(const CompressedChunk& c, const CompressedConstants& k, memory::IsaLevel isa = memory::best_isa());
void sync_finish_reference(const CompressedChunk& c, const CompressedConstants& k);

// Any fast kernel above, for run_parallel.
using CompressedKernel = void (*)(const CompressedChunk&, const CompressedConstants&, memory::IsaLevel);

// Runs `kernel` over `c` cut into contiguous pieces on up to `threads` threads (core/parallel.h's
// pool; the calling thread takes part). Pieces start on 64-byte lines of master, so threads never
// share a cache line of an array aligned like master. Results equal one call on the whole chunk bit
// for bit (the kernels are element-wise). threads <= 1 or a small chunk runs on the calling thread.
void run_parallel(CompressedKernel kernel, const CompressedChunk& c, const CompressedConstants& k, int threads,
                  memory::IsaLevel isa = memory::best_isa());

}  // namespace zs::optim
