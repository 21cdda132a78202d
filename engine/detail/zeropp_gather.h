// ZeRO++ (DeepSpeed's zero_hpz_partition_size, zero_quantized_weights, zero_quantized_gradients):
// the groups it runs over, and how ParamGatherer moves a module's parameters under it.
//
// Note [ZeRO++]
// ZeRO-3 gathers each module's parameters over the whole data-parallel group twice per micro-batch
// (forward and backward) and reduce-scatters its gradients once: 3 x the parameters per step, all of
// it crossing hosts. ZeRO++ (Wang et al. 2023; DeepSpeed runtime/zero) cuts what crosses hosts:
//   hpZ  a secondary copy of the parameter partition inside each host group of H consecutive dp
//        ranks: a forward gather (over every rank) also keeps this rank's 1/H part of the module's
//        range in a persistent buffer (category params, ~total/H elements), and the backward gathers
//        from those copies over the host group alone. The copies hold what the forward gathered (so
//        the backward computes with the forward's values, quantised or not) and go stale at the
//        optimizer step (invalidate); a module the backward meets without a valid copy (not gathered
//        in this step's forward) is gathered over every rank as usual. DeepSpeed gathers the forward
//        from the primary partition too, also for later micro-batches.
//   qwZ  the primary gathers carry int8 blocks (comm::QuantizedAllgather): this rank's shard part is
//        quantised, all-gathered as int8 + scales, and every part dequantised into the module's
//        buffer (this rank's own too, so every rank computes with the same values). The shards, the
//        optimizer and the checkpoints keep the exact values; only the gathered copies are
//        quantised. The wire scratch is a transient block (category params) alive for the gather.
//   qgZ  stage 3's gradient reduce-scatter in int8 blocks through two all-to-alls, inside the host
//        group and then across hosts (comm::QuantizedReduceScatter, Note [Hierarchical quantised
//        reduce-scatter]); synchronous, its scratch a transient block (category grads) alive for the
//        bucket's reduction. Without hpZ the host group is the whole dp group (one level).
// The host group is zero_hpz_partition_size consecutive ranks (DeepSpeed: one node's GPUs), which
// must divide the dp size; it is also qgZ's first level. Every allocation goes through the device
// allocator in the same code the estimator runs, so `zeroshard estimate` stays exact.
// With all three, what may cross hosts per step is the forward's int8 gathers (1.02 bytes per
// element against fp32's 4 or bf16's 2) and qgZ's second level (int8 of 1/H of the gradients),
// against ZeRO-3's two full-precision gathers and reduce-scatter: 0.115x of ZeRO-3's bytes on the
// dp and across groups at hosts of 2 (docs/benchmarks.md, "zeropp_quality").
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "comm/group.h"
#include "engine/config.h"
#include "engine/partition.h"
#include "memory/allocator.h"

namespace zs::engine {

// The host groups of Note [ZeRO++] over one data-parallel group; `host` is dp itself (and `across`
// null) when one host group spans it.
struct ZeroppGroups {
  int host_size = 1;
  const comm::Group* host = nullptr;
  const comm::Group* across = nullptr;  // null: one host group (qgZ in one level)
  std::optional<comm::Group> host_split, across_split;
};

// Null when no ZeRO++ key is on, below stage 3 or when dp has one rank. Throws ConfigError naming
// zero_optimization.zero_hpz_partition_size when it does not divide dp.size(). Collective over dp.
// expert_parallel_size: the model's first expert parameters' (0: none); ZeRO++ with experts is refused.
std::unique_ptr<ZeroppGroups> make_zeropp_groups(const comm::Group& dp, const ZeroConfig& z, int expert_parallel_size);

// How ParamGatherer gathers a module's range under ZeRO++ (Note [ZeRO++]): hpZ's secondary copies and
// qwZ's quantised gathers. Entries are ParamGatherer's, by index.
class ZeroppGather {
 public:
  struct Options {
    const comm::Group* host = nullptr;  // hpZ's group (null: no hpZ)
    bool quantized = false;             // qwZ
    bool kernels = true;                // false over the measuring backend: allocations and collectives only
  };
  ZeroppGather(const Options& options, size_t total, const comm::Group& group, memory::DeviceAllocator& device,
               memory::DType dtype, size_t entries);

  // The primary gather of `range` over the partition group: `in` this rank's owned part (counts from
  // the partition), into `out` (the whole range); quantised with qwZ. Then, with hpZ and unless
  // `persistent`, keeps this rank's secondary part of what arrived for entry `entry`.
  void gather(size_t entry, memory::ShardRange range, std::span<const size_t> counts, const memory::Tensor& in,
              const memory::Tensor& out, bool persistent);
  // hpZ: whether entry's secondary copy is valid, and the gather from it over the host group.
  bool has_secondary(size_t entry) const { return host() != nullptr && secondary_valid_[entry]; }
  void gather_secondary(size_t entry, memory::ShardRange range, const memory::Tensor& out);
  void invalidate();  // the shards changed (optimizer step): every secondary copy is stale

  size_t secondary_bytes() const { return secondary_.size(); }
  uint64_t secondary_gathers() const { return secondary_gathers_; }  // count of backward gathers served by hpZ

 private:
  const comm::Group* host() const { return options_.host; }
  Options options_;
  const comm::Group& group_;
  memory::DeviceAllocator& device_;
  memory::DType dtype_;
  std::optional<Partition> secondary_partition_;  // the layout over the host group (hpZ)
  memory::DeviceBlock secondary_;                 // this rank's part of it (persistent, category params)
  std::vector<bool> secondary_valid_;
  uint64_t secondary_gathers_ = 0;
};

}  // namespace zs::engine
