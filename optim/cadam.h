// CAdam: zeroshard's compressed-state optimizer (optimizer type "CAdam").
//
// A Lion update (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms") whose only state,
// the momentum, is stored block-quantised to int8 (as in Huawei's CADAM and the 8-bit optimizers of
// Dettmers et al.): 1.125 bytes of optimizer state per parameter against Adam's 8.
//
//   optim::CAdam opt({.lr = 3e-5, .betas = {0.965, 0.99}, .weight_decay = 0.1});
//   std::vector<int8_t> q(n);                                  // exp_avg_q: zeroed
//   std::vector<float> scale((n + 31) / 32);                   // exp_avg_scale: zeroed
//   void* states[] = {q.data(), scale.data()};
//   opt.step({.master = p, .grad = g, .states = states}, {.step = 1, .lr = 3e-5});
//
// Update per element, in fp32 (Lion has no bias correction; StepContext::step only seeds the dither):
//   m   = float(q) * scale                                 (de-quantise; scale of the element's block)
//   g   = grad * grad_scale
//   c   = beta1 * m + (1 - beta1) * g                      (interpolation)
//   p   = p - lr * (sign(c) + weight_decay * p)            (decoupled decay; 0 when !apply_weight_decay)
//   m'  = beta2 * m + (1 - beta2) * g                      (momentum update)
//   low = bf16/fp16 copy of p when asked (round to nearest even, as Adam's kernels)
// sign(c) is +1 for c > 0, -1 for c < 0, c itself otherwise (so sign(+-0) = +-0 and a NaN stays NaN).
// Then each block of kBlock = 32 elements is re-quantised with a NEW scale that follows the data:
//   scale' = max|m'| over the block / 127          (fp32 divide; a block of zeros gets scale 0)
//   inv    = min(127 / max|m'|, FLT_MAX)           (fp32 divide, once per block)
//   x      = clamp(m' * inv, -127, 127)
//   q'     = min(floor(x + u), 127)                 (stochastic rounding, fp32 add; q' = 0 if scale' = 0)
// with u the element's dither in [0, 1) (Note [CAdam stochastic rounding]): q' is floor(x) + 1 with
// probability x - floor(x), else floor(x) (the add's rounding shifts that by at most 2^-17). The min
// catches x = 127 with u close enough to 1 that x + u rounds to 128. The scale is recomputed
// every step, so q never overflows (the clamp only guards rounding past 127) and gradients of any
// finite size are held (1e30 included). A block whose m' holds an inf or NaN (a non-finite gradient;
// the engine skips such steps) gets scale NaN and q 0, so its momentum stays non-finite instead of
// silently becoming finite.
//
// Note [CAdam quantisation error]: per element |float(q') * scale' - m'| < scale', up to fp32 rounding
// of inv, x and the product (relative 2^-16 of scale'); i.e. less than one quantisation step, at most
// max|m'| / 127 over the block, and E[float(q') * scale'] = m' over the dither (up to u's 24 bits and
// the rounding of x + u, 2^-17 of a step). The bound holds while scale' is a normal fp32 number
// (max|m'| >= 127 * FLT_MIN, about 1.5e-36); below that the rounding of the subnormal (or zero) scale
// adds up to 127 * 2^-150 (about 9e-44), and below max|m'| = 127 / FLT_MAX (about 3.7e-37), where
// inv saturates, the error is at most max|m'| itself.
//
// Note [CAdam stochastic rounding]: rounding to nearest (this optimizer's first format) drops every
// momentum change smaller than half a step, (1 - beta2) * |g - m| < scale / 2: at beta2 = 0.99 an
// element's momentum moved only once its gradient differed from it by more than 50 steps (about 40%
// of the block's largest |m|), so small momenta beside a large one stuck ("sticky momentum"). Rounding
// up with probability x - floor(x) makes the stored momentum unbiased: a change of a tenth of a step
// moves q one step every ten steps on average, so the EMA accumulates. The price is noise of at most
// one step per element per step. Measured: on a mixed-curvature quadratic at betas (0.965, 0.99)
// (tests/optim/cadam_test.cpp) CAdam's loss went from 2x fp32-momentum Lion's to 1.07x. On the
// example GPT (benchmarks/optimizer_compare, np 2) the tail loss moved by 0.1% at most (lr / 5:
// 2.8755 vs 2.8756 rounded to nearest; lr / 3: 2.8096 vs 2.8079, and 2.7610 vs 2.7618 at betas
// (0.9, 0.99)): what held CAdam back there was its learning rate and beta1 (below), not the rounding.
// The dither must be deterministic and identical across chunkings, threads and ISAs, so it is not
// drawn from a generator advanced per element (the element's index within a chunk depends on the
// chunking, and ParamChunk carries no global index). It hashes the element's own values: with
// x = (bits of its master weight BEFORE the step) ^ (a key that is a full hash, MurmurHash3's
// finaliser, of StepContext::step and the element's lane 0-31 within its block), h = (x ^ (x >> 16))
// times an odd constant and u = (h >> 8) * 2^-24. Blocks never split, so the lane is
// chunk-independent, and weights that start equal (e.g. norm gains of 1) still get different
// dithers. Why not the gradient's bits: the gradient of a multi-rank run differs from the
// single-process one in its last bits (a different summation order), and a dither hashed from it
// would change up to a third of all roundings, where the master weight stays bit-identical until an
// update's sign actually differs (tests/engine/optimizer_equivalence_test.cpp relies on that).
// detail/cadam_kernels.h holds the hash; every kernel computes it lane by lane with 32-bit
// wrap-around arithmetic.
//
// Learning-rate rule (Lion's): because sign() gives every element an update of size lr, use an lr 3-10x
// smaller than AdamW's for the same model, and a weight_decay 3-10x larger (the decay a step applies
// is lr * weight_decay, which then stays about the same). The Lion paper's default betas are
// (0.9, 0.99); CAdam's default beta1 is 0.965. The example GPT's short run (150 steps, benchmarks/
// optimizer_compare.cpp, np 2) wants the rule's large end and Lion's beta1: AdamW's lr / 3 and
// weight_decay x 3 with betas (0.9, 0.99) end 1.5% above AdamW's tail loss, with the default betas
// 3.3% above, and lr / 5, weight_decay x 5 (default betas) 6.2% above.
//
// Chunks: step() needs chunk starts at multiples of kBlock elements from the start of the state
// buffers (alignment_elements(); blocks are never split), state pointers at the chunk's first block;
// a chunk's length may be anything, its last block then being short (the scale still exists, the
// buffers being sized with StateSpec::bytes_for). step() runs the fused one-pass kernel of the widest
// ISA the CPU has, or of the ISA given to the constructor; step_reference() is the plain scalar loop
// the kernels agree with bit for bit. Thread-safety: as Optimizer (disjoint chunks). Determinism: the
// result is a pure function of the chunk's values, the config and the StepContext (no hidden RNG
// state), identical for every chunking, thread count and ISA.
#pragma once

#include <array>
#include <string>

#include "memory/cpu_features.h"
#include "optim/optimizer.h"

namespace zs::optim {

struct CAdamConfig {
  double lr = 1e-4;
  std::array<double, 2> betas = {0.965, 0.99};  // {interpolation beta1, momentum beta2}
  double weight_decay = 0.0;
};

// Throws ConfigError naming `json_path` (e.g. "optimizer.params" -> "optimizer.params.betas[0]") for
// out-of-range values.
void validate(const CAdamConfig& config, const std::string& json_path);

class CAdam final : public Optimizer {
 public:
  // Elements per quantisation block (one fp32 scale each).
  static constexpr size_t kBlock = 32;

  // Uses the widest kernel the CPU supports (memory::best_isa()).
  explicit CAdam(const CAdamConfig& config);
  // Forces the kernel of `isa` (tests, benchmarks); throws ConfigError when this CPU cannot run it.
  CAdam(const CAdamConfig& config, memory::IsaLevel isa);

  std::string_view name() const override { return "CAdam"; }
  // {"exp_avg_q": int8 per element}, {"exp_avg_scale": fp32 per block of 32}; both start zeroed.
  std::span<const StateSpec> state_specs() const override;
  size_t alignment_elements() const override { return kBlock; }
  // The fused kernel: one pass, re-quantisation and low-precision copy included.
  void step(const ParamChunk& chunk, const StepContext& ctx) const override;
  // The scalar reference loops (then a separate conversion pass): the test oracle.
  void step_reference(const ParamChunk& chunk, const StepContext& ctx) const;

  const CAdamConfig& config() const { return config_; }
  memory::IsaLevel isa() const { return isa_; }

 private:
  CAdamConfig config_;
  memory::IsaLevel isa_;
};

}  // namespace zs::optim
