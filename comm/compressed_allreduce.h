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
// 256 is finer still and independent of how the model cuts its tensors.
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
  size_t chunk_size() const { return chunk_; }           // elements per server chunk, multiple of kScaleBlock
  size_t padded_numel() const { return chunk_ * static_cast<size_t>(size_); }
  // This rank's server chunk of the buffer: elements [offset, offset + size), clipped to numel().
  memory::ShardRange server_range() const;
  // Worker residual (numel() elements) and this rank's server residual (server_range().size
  // elements), for checkpoints and tests. Valid until the next allreduce or reset_errors.
  std::span<const float> worker_error() const { return worker_error_; }
  std::span<const float> server_error() const { return {server_error_.data(), server_range().size}; }
  std::span<float> worker_error() { return worker_error_; }
  std::span<float> server_error() { return {server_error_.data(), server_range().size}; }

  // Bytes this rank sends (and receives) per allreduce call, as counted in World::counters(), and
  // what an fp32 ring allreduce of numel() elements counts, for the saving reported in summaries.
  uint64_t wire_bytes_per_call() const;
  uint64_t fp32_allreduce_bytes() const;

 private:
  const Group* group_;
  size_t numel_ = 0;
  int size_ = 1;
  int rank_ = 0;
  size_t chunk_ = 0;         // elements per chunk
  size_t block_words_ = 0;   // chunk_/32 sign words + 1 scale word
  std::vector<float> worker_error_;  // numel_
  std::vector<float> server_error_;  // chunk_ (the tail past numel_ stays 0)
  std::vector<uint32_t> send_;       // N blocks
  std::vector<uint32_t> recv_;       // N blocks: every rank's block for my chunk
  std::vector<uint32_t> gathered_;   // N blocks: every server's compressed chunk
};

}  // namespace zs::comm
