// OneBitAllreduce: an approximate average over a group's ranks that puts 1 bit per element on the
// wire, with error feedback (DeepSpeed's compressed_allreduce for one-bit Adam, re-derived on MPI).
//
//   comm::OneBitAllreduce reduce(dp, momentum.size());         // owns the error-feedback buffers
//   reduce.allreduce(momentum);                                // in place, on every rank
//   optim_step(..., [&](std::span<float> m) { reduce.allreduce(m); });   // the callable optim gets
//
// Note [One-bit allreduce]
// The n elements are cut into N server chunks of `chunk_size()` elements each (ceil(n/N) rounded up
// to a multiple of kScaleBlock = 256; the tail past n is padding that is never compressed, sent as
// zero bits and never written). Rank j is the server of chunk j. A chunk is compressed in scale
// blocks of 256 elements, each with its own scale. One call:
//   1. worker, per scale block of chunk j:  x = data + worker_error;  s = ||x||_2 / sqrt(m)  (m = real
//      elements of the block);  c = s * sign(x)  (sign(0) = +1);  worker_error = x - c.
//   2. all-to-all: block j of each rank = chunk j's sign bits + its scales (one int32 word each, the
//      float's bits), so rank j receives every rank's signs and scales for its chunk.
//   3. server, per scale block of its chunk:  y = (1/N) sum_r c_r + server_error;  t = ||y||_2 /
//      sqrt(m);  z = t * sign(y);  server_error = y - z.
//   4. allgather of every server's block (z's sign bits + scales); every rank writes z into `data`.
// Why scale blocks: one scale for a whole chunk of a flat model buffer (LayerNorm gains next to
// embedding rows, gradients orders of magnitude apart) gives every element of the chunk the same
// magnitude; training with it diverged on the test GPT where per-block scales track the layers.
// DeepSpeed compresses each parameter tensor separately, one scale per tensor and rank; a block of
// 256 is finer still and independent of how the model cuts its tensors. Measured against DeepSpeed's
// per-tensor scales (Note [Per-tensor scales]) on small GPTs, the blocks were never worse at d_model
// 128 and 256 and lost much less at 256 when compression starts at the lr peak; at 512 per tensor was
// 0.2 points better there (docs/benchmarks.md "onebit_quality").
// Scale: DeepSpeed's ||x||_2 / sqrt(m), which keeps the norm (||c|| = ||x||); the error of one
// compression is then ||x - c||^2 = 2 ||x||^2 (1 - ||x||_1 / (sqrt(m) ||x||_2)) <= 2 ||x||^2, and
// 0.64 ||x|| for Gaussian x. The least-squares scale ||x||_1 / m gives a slightly smaller one-call
// error (0.60 ||x||) but, measured with a constant input (the slowly changing momentum one-bit Adam
// feeds), its residual keeps growing (~sqrt(calls)) and the running mean converges several times
// slower (n = 1000: 12x below the one-call error after 200 calls, against ~46x with the L2 scale,
// whose residual levels off at ~4 ||x||).
// Error feedback: summed over calls k = 1..K (errors start at zero), the outputs telescope to
//   sum_k out_k = sum_k exact_k - (1/N) sum_r worker_error_r(K) - server_error(K)
// exactly (up to fp32 rounding): what one call drops is carried into the next, so the running mean of
// the outputs converges to the running mean of the exact averages, at rate O(1/K) once the residuals
// level off.
// Wire: per call each rank sends (N-1) (chunk_size()/8 + chunk_size()/64) bytes (1 bit per element
// plus a 4-byte scale per 256) in the all-to-all and again in the allgather; they are counted in
// World::counters() as those two collectives (comm/config.h). Against an fp32 ring allreduce of
// 2 (N-1)/N * 4n bytes the saving is ~28x for n >> 256 N (32 / 1.125), against bf16 ~14x.
// A group of one compresses all the same (no bytes move): one-bit Adam's numerics do not depend on
// the world size being 1 or more.
// Padding: built with the tensors' ranges, elements outside them (a flat layout's alignment gaps) are
// read as zero and written as zero, as DeepSpeed's padding: they keep a residual but no value. (Until
// issue 38 the gaps kept the last compressed value, which fed itself back into the next call's
// scales and never decayed; tests/optim/onebit_deepspeed_test.cpp checks the gaps.)
//
// Note [Per-tensor scales]
// The second constructor takes the tensors' ranges in the buffer and compresses as DeepSpeed's
// compressed_allreduce does for each parameter tensor (deepspeed/runtime/comm/nccl.py, called per
// tensor by onebit/adam.py): tensor t of n_t elements is padded with zeros to P_t, a multiple of
// N * divider (divider = 8 N / gcd(N, 8), DeepSpeed's), and cut into N server chunks of P_t / N.
//   1. worker, per tensor: x = [data_t, 0...] + worker_error_t (P_t elements, the padding included);
//      ONE scale s = ||x||_2 / sqrt(P_t) for the whole tensor; worker_error_t = x - s sign(x).
//   3. server j, per tensor: y = sum_r sign_r (s_r * (1/N)) + server_error (DeepSpeed's order: each
//      scale times 1/N, then the sum over ranks in rank order); ONE scale t = ||y||_2 / sqrt(P_t / N)
//      per tensor and chunk; server_error = y - t sign(y).
//   4. element i of tensor t becomes +-t of the chunk it lies in; the padding is dropped.
// So the padding takes part in both scales and keeps its own error feedback, as in DeepSpeed. The
// wire block for server j holds chunk j of every tensor (bits packed one after the other) and one
// scale word per tensor. Elements of the buffer outside every tensor (the layout's alignment gaps)
// are not sent and are set to zero. Bytes: 1 bit per padded element plus 4 bytes per tensor and rank,
// each way.
//
// Contract: collective over `group` (every rank constructs with the same numel and calls allreduce
// in the same order); the group's timeout and mismatch checks apply to both collectives. The group
// must outlive this object. Not thread-safe: one call at a time. Numbers: fp32 only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "comm/group.h"

namespace zs::comm {

class OneBitAllreduce {
 public:
  static constexpr size_t kScaleBlock = 256;  // elements sharing one scale
  // Elements per server chunk for `numel` elements over `ranks` ranks: ceil(numel / ranks) rounded up
  // to kScaleBlock. The error feedback is numel + chunk_for(numel, ranks) fp32 values.
  static size_t chunk_for(size_t numel, int ranks);

  // Error-feedback buffers for `numel` elements on `group` (not collective; allocates
  // numel + chunk_size() floats of state and 3 N (chunk_size()/32 + chunk_size()/256) words of wire
  // buffers).
  OneBitAllreduce(const Group& group, size_t numel);
  // With the tensors' ranges: ascending, disjoint, non-empty, inside [0, numel) (ZS_ASSERT: the
  // caller's layout). Every element outside them is padding (a flat layout's alignment gaps): read as
  // zero and left zero, as DeepSpeed's padding, so it carries no stale value from call to call.
  // kBlocks: the 256-element blocks over the whole buffer, as the first constructor. kPerTensor: Note
  // [Per-tensor scales]; error feedback of sum padded_tensor(n_t, N) (worker) plus the chunks (server).
  enum class Scales { kBlocks, kPerTensor };
  OneBitAllreduce(const Group& group, size_t numel, std::span<const memory::ShardRange> tensors, Scales scales);
  // DeepSpeed's padded size of an n-element tensor over `ranks` ranks: a multiple of N * divider.
  static size_t padded_tensor(size_t n, int ranks);
  // state_floats() of an object built with these arguments, without building one (the engine's
  // placement plan and the memory estimator size the error feedback with it): kBlocks numel +
  // chunk_for(numel, ranks); kPerTensor sum_t padded_tensor(n_t, ranks) (1 + 1/ranks).
  static size_t state_floats_for(size_t numel, int ranks, std::span<const memory::ShardRange> tensors, Scales scales);
  OneBitAllreduce(OneBitAllreduce&&) noexcept = default;
  OneBitAllreduce(const OneBitAllreduce&) = delete;
  OneBitAllreduce& operator=(const OneBitAllreduce&) = delete;
  OneBitAllreduce& operator=(OneBitAllreduce&&) = delete;

  // Replaces `data` (numel() elements, every rank) by the compressed average over the ranks
  // (Note [One-bit allreduce]) and updates both error buffers. Throws CommError when data.size() !=
  // numel() (naming both; nothing changed) and for the collectives' own failures (timeout,
  // mismatch), after which `data` and the error buffers are indeterminate (reset_errors, or end the job).
  void allreduce(std::span<float> data);

  // Zeroes both error buffers (e.g. when one-bit Adam leaves its warm-up, or on a checkpoint load).
  void reset_errors();

  size_t numel() const { return numel_; }
  bool per_tensor() const { return per_tensor_; }
  // Elements per server chunk: a multiple of kScaleBlock; per tensor, the sum of the tensors' chunks.
  size_t chunk_size() const { return chunk_; }
  size_t padded_numel() const { return chunk_ * static_cast<size_t>(size_); }
  // This rank's server chunk of the buffer: elements [offset, offset + size), clipped to numel().
  // Scale blocks only (per tensor, a rank serves one chunk of every tensor).
  memory::ShardRange server_range() const;
  // Worker residual and this rank's server residual, for checkpoints and tests. Scale blocks: numel()
  // and server_range().size elements; per tensor: each tensor's padded residual in turn, and this
  // rank's chunk of each tensor in turn. Valid until the next allreduce or reset_errors.
  std::span<const float> worker_error() const { return worker_error_; }
  std::span<const float> server_error() const { return {server_error_.data(), server_len_}; }
  std::span<float> worker_error() { return worker_error_; }
  std::span<float> server_error() { return {server_error_.data(), server_len_}; }
  // Floats of error-feedback state this object holds (both residuals).
  size_t state_floats() const { return worker_error_.size() + server_error_.size(); }

  // Bytes this rank sends (and receives) per allreduce call, as counted in World::counters(), and
  // what an fp32 ring allreduce of numel() elements counts, for the saving reported in summaries.
  uint64_t wire_bytes_per_call() const;
  uint64_t fp32_allreduce_bytes() const;

 private:
  // One tensor of the per-tensor mode: where it is in the buffer, in the residuals and in a block.
  struct TensorPlan {
    size_t offset = 0, numel = 0, padded = 0, chunk = 0;  // chunk = padded / N
    size_t worker_at = 0, server_at = 0;                 // offsets in worker_error_, server_error_
    size_t bit_at = 0;                                   // first sign bit of its chunk in a block
  };
  // The three local phases of allreduce (Note [One-bit allreduce] steps 1, 3, 4) for each mode.
  void init_blocks();    // the scale-block layout of chunks and residuals
  void allocate_wire();  // send_, recv_, gathered_ for block_words_
  void zero_gaps(std::span<float> data) const;
  void worker_blocks(std::span<float> data);
  void server_blocks();
  void write_blocks(std::span<float> data) const;
  void worker_tensors(std::span<const float> data);
  void server_tensors();
  void write_tensors(std::span<float> data) const;

  const Group* group_;
  size_t numel_ = 0;
  int size_ = 1;
  int rank_ = 0;
  size_t chunk_ = 0;         // elements per chunk
  size_t sign_words_ = 0;    // sign words at the start of a block; then the scale words
  size_t block_words_ = 0;   // sign words + one scale word per scale block (per tensor)
  size_t server_len_ = 0;    // elements of server_error() (the tail past numel_ is never used)
  bool per_tensor_ = false;
  std::vector<TensorPlan> tensors_;
  std::vector<memory::ShardRange> gaps_;  // elements outside every tensor (constructed with tensors)
  std::vector<float> worker_error_;  // numel_ (per tensor: sum of padded)
  std::vector<float> server_error_;  // chunk_ (scale blocks: the tail past numel_ stays 0)
  std::vector<uint32_t> send_;       // N blocks
  std::vector<uint32_t> recv_;       // N blocks: every rank's block for my chunk
  std::vector<uint32_t> gathered_;   // N blocks: every server's compressed chunk
};

}  // namespace zs::comm
