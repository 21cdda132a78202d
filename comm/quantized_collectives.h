// ZeRO++'s quantised collectives (DeepSpeed's qwZ and qgZ, re-derived on comm's groups): an
// allgatherv and a hierarchical reduce-scatter that put int8 blocks on the wire (comm/quantize.h,
// Note [Int8 blocks]) instead of the tensors' own dtype.
//
//   comm::QuantizedAllgather gather(dp, counts);                // counts[r]: rank r's elements
//   memory::DeviceBlock wire = device.allocate(gather.scratch_bytes(), ...);
//   gather.run(my_piece, params, wire.data(), true);          // params: every piece, dequantised
//
//   comm::QuantizedReduceScatter reduce(host, &across, counts); // counts in rank order of the whole group
//   reduce.run(bucket, my_part, comm::ReduceOp::kAverage, scratch, true);
//
// Note [Hierarchical quantised reduce-scatter]
// The ranks form O groups ("hosts") of H consecutive ranks: rank r = o H + i, with `inner` the
// group of r's host (inner rank i) and `outer` the ranks with the same i on every host (outer rank
// o). DeepSpeed's qgZ (runtime/comm/coalesced_collectives.py, all_to_all_quant_reduce) has the same
// two stages of all-to-all:
//   1. every rank quantises each rank's piece of its input (blocks start at each piece) and sends to
//      inner peer i' the pieces of ranks {o' H + i' : every o'}; each rank dequantises what its H
//      inner peers sent and sums it in fp32, in inner rank order: the host's partial sums of the
//      pieces of ranks {o' H + i}.
//   2. (O > 1) each partial is quantised again and sent to outer peer o', who dequantises the O
//      partials of its own piece and sums them in outer rank order.
// The result (divided by H O for kAverage, rounded once to the output dtype) lands in this rank's
// piece. Bytes: stage 1 sends ~(H-1)/H of the input in int8 inside the host, stage 2 ~(O-1)/(H O) of
// it between hosts; an fp32 ring reduce-scatter sends (HO-1)/(HO) of it in fp32, all of it crossing
// hosts for the ring's host boundaries. Exact for data that int8 blocks represent exactly; else the
// error of one rank's piece is bounded by one quantisation of each input (stage 1) plus one of the
// host sums (stage 2).
// A pure all-to-all with int8 blocks: every call is two alltoallv (one with O = 1) of int32 words.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "comm/group.h"

namespace zs::comm {

// Group::allgatherv with each piece block-quantised on the wire. Every rank dequantises every piece,
// its own included, so every rank ends with the same values.
class QuantizedAllgather {
 public:
  QuantizedAllgather(const Group& group, std::span<const size_t> counts);
  // Bytes of the scratch run() needs: the wire form of every piece (int32 words).
  size_t scratch_bytes() const { return words_total_ * sizeof(int32_t); }
  // `in`: this rank's piece (counts[rank] elements; fp32, bf16 or fp16); `out`: sum(counts) elements of
  // the same dtype (must not overlap `in`). `scratch`: scratch_bytes(), 4-byte aligned. `compute`
  // false runs only the collective (the memory estimator: nothing is valid to compute on).
  // Collective over the group. Returns this rank's bytes sent (the counters' rule).
  uint64_t run(const memory::Tensor& in, const memory::Tensor& out, void* scratch, bool compute) const;

 private:
  const Group& group_;
  std::vector<size_t> counts_;
  std::vector<size_t> words_;  // int8_words(counts_[r])
  size_t words_total_ = 0;
};

// Note [Hierarchical quantised reduce-scatter]. `outer` nullptr: one level (O = 1).
class QuantizedReduceScatter {
 public:
  // counts: elements of each rank r = o * inner.size() + i of the whole group (tiling the input).
  QuantizedReduceScatter(const Group& inner, const Group* outer, std::span<const size_t> counts);
  // The scratch run() needs: the same on every rank (sized for the rank that needs most), so what a
  // rank allocates depends on the counts alone, not on its place in the hierarchy.
  size_t scratch_bytes() const;
  // `in`: the whole input (sum(counts), fp32/bf16/fp16); `out`: this rank's piece, same dtype (may be
  // its own block of `in`). Collective over both groups (inner, then outer). Returns bytes sent.
  uint64_t run(const memory::Tensor& in, const memory::Tensor& out, ReduceOp op, void* scratch, bool compute) const;

 private:
  size_t rank_of(int o, int i) const { return static_cast<size_t>(o) * static_cast<size_t>(hosts_size_) + static_cast<size_t>(i); }
  const Group& inner_;
  const Group* outer_;
  int hosts_size_ = 1;  // H
  int hosts_ = 1;       // O
  std::vector<size_t> counts_, displs_;
  size_t send1_words_ = 0, block1_words_ = 0, partial_elems_ = 0, mine_ = 0;
  size_t block1_max_ = 0, partial_max_ = 0, mine_max_ = 0;  // the largest over the ranks (scratch_bytes)
};

}  // namespace zs::comm
