// GradReducer: turns the gradients each rank computes into reduced (averaged) gradients, bucket by
// bucket, overlapped with backward.
//
// Buckets are consecutive parameters of the flat layout (plan_buckets), filled in backward order. A
// bucket is reduced as soon as every parameter in it has its final gradient for this backward (the
// engine calls module_done after each module's backward), asynchronously when overlap_comm is on
// (stages 0-1 without it reduce every bucket at end_backward):
//   stage 0  allreduce (average) of the bucket in the full gradient buffer, at the accumulation boundary
//   stage 1  reduce-scatter (average) in place in the full gradient buffer, at the boundary; only this
//            rank's shard of the result is kept
//   stage 2+ gradients are partitioned: layers write a module's gradients into a staging buffer for
//            its bucket, allocated just before the module's backward (transient pool, lifetime
//            kSpanning: Note [Spanning blocks] in memory/alloc_policy.h; category "grads"); every
//            micro-batch, a full bucket is reduce-scattered and this rank's part is added into its
//            gradient shard, after which the staging buffer is freed. At most kMaxInFlight buckets
//            are in flight; a further one waits for the oldest, which bounds the staging memory.
//            Without overlap_comm a full bucket is still reduced when it fills, synchronously.
//            Note [reduce-scatter into the shard]: on the accumulation window's first micro-batch
//            the shard is still zero, so the reduce-scatter writes this rank's part straight into
//            it and the staging buffer's part is never added (one pass over the shard less).
// With `reduce_scatter` off (DeepSpeed's flag), stages 1+ allreduce the bucket and keep their part.
// With a comm_dtype other than the gradients' (communication_data_type), a launched bucket is first
// converted into a transient "wire" buffer of comm_dtype, reduced there (comm sums 16-bit values in
// fp32 and rounds once), and the part this rank keeps is converted back when its reduction is waited
// for (wait_all, or retiring at stage 2+); the wire buffer then goes.
// With ZeRO++'s qgZ (quantized_host), stage 2+ buckets are reduce-scattered in int8 blocks on the
// calling thread (comm::QuantizedReduceScatter; its scratch a transient block of category grads).
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "comm/group.h"
#include "engine/flat_layout.h"
#include "engine/partition.h"
#include "memory/allocator.h"
#include "nn/module.h"

namespace zs::engine {

class GradReducer {
 public:
  static constexpr size_t kMaxInFlight = 2;  // buckets reducing while the next one fills

  struct Options {
    int stage = 0;
    bool overlap_comm = true;
    bool reduce_scatter = true;
    size_t bucket_elements = 500'000'000;
    memory::Tier grads_tier = memory::Tier::kDevice;  // where `grads` lives (kHost: optimizer offloaded)
    std::optional<memory::DType> comm_dtype;  // the dtype averaged on the wire; nullopt: the gradients' own
    // ZeRO++'s qgZ (stages 2+; Note [ZeRO++] in engine/detail/zeropp_gather.h): buckets are
    // reduce-scattered in int8 blocks inside `quantized_host` and then across hosts (null: off).
    const comm::Group* quantized_host = nullptr;
    const comm::Group* quantized_across = nullptr;  // null: one level
    bool kernels = true;  // false over the measuring backend (the estimator): collectives and allocations only
  };

  // `layout` is one partition group's layout (dense, or one expert_parallel_size's), reduced over
  // `group`; `modules` may own parameters of other layouts, which this reducer ignores.
  // `grads` is the full gradient buffer (stages 0-1) or this rank's gradient shard (stages 2-3),
  // in `dtype`. For stages 0-1 the parameters' grad views must already point into it.
  GradReducer(const Options& options, const FlatLayout& layout, const Partition& partition, const comm::Group& group,
              memory::DeviceAllocator& device, memory::DType dtype, void* grads, const std::vector<nn::Module*>& modules);
  ~GradReducer();

  // Starts a backward pass. `boundary`: the last micro-batch of the accumulation window. `reduce`
  // false (stages 0-1 only): the boundary does not reduce; each rank keeps its local gradients (for
  // the optimizers that communicate compressed values themselves). `shard_zero` (stage 2+): the
  // gradient shard holds zeros (the window's first backward), so reductions may overwrite it
  // (Note [reduce-scatter into the shard] in engine/grad_reducer.cpp).
  void begin_backward(bool boundary, bool reduce = true, bool shard_zero = false);
  // Stage 2+: gives module m's parameters grad views into their buckets' staging buffers.
  void module_starting(nn::Module& m);
  // Module m's backward is done: its parameters' gradients are final for this backward.
  void module_done(nn::Module& m);
  // Launches every bucket not launched yet (unused parameters keep zero gradients). Stage 2+ also
  // waits for all of them, so no staging memory outlives the backward.
  void end_backward();
  // Waits for every reduction (before the optimizer reads the gradients).
  void wait_all();
  // A backward failed part-way (Note [a failed pass] in engine/detail/engine_impl.h): waits for the
  // reductions in flight and frees every staging buffer, leaving the gradient buffer for the caller
  // to zero. Collective in the same way as the backward it ends: every rank fails at the same point.
  void abort();

  size_t bucket_count() const { return buckets_.size(); }
  // Stage 2+: peak bytes of staging buffers alive at once.
  size_t staging_peak_bytes() const { return staging_peak_bytes_; }
  // Bytes this rank's gradient reductions sent since construction (Work::bytes_sent, comm's rule).
  uint64_t bytes_sent() const { return bytes_sent_; }

 private:
  struct Bucket {
    BucketPlan plan;
    size_t pending = 0;
    bool launched = false;
    memory::DeviceBlock staging;  // stage 2+
    memory::DeviceBlock wire;     // comm_dtype copy while reducing (only when it differs from dtype_)
    bool into_shard = false;      // stage 2+: reduced straight into the gradient shard (nothing to add)
    comm::Work work;
  };
  bool partitioned() const { return options_.stage >= 2; }
  bool active() const { return reducing_ || partitioned(); }
  bool quantized() const { return partitioned() && options_.quantized_host != nullptr && group_.size() > 1; }
  memory::Tensor bucket_tensor(Bucket& b) const;
  memory::Tensor shard_part(memory::ShardRange owned) const;  // stage 2+: `owned` in the gradient shard
  void ensure_staging(Bucket& b);
  void launch(Bucket& b);
  void retire(Bucket& b);
  void retire_finished();
  void finish(Bucket& b);  // waits for b's reduction; converts the kept part back from the wire buffer
  void reduce_quantized(Bucket& b);  // qgZ: b's reduce-scatter, synchronous

  Options options_;
  const FlatLayout& layout_;
  const Partition& partition_;
  const comm::Group& group_;
  memory::DeviceAllocator& device_;
  memory::DType dtype_;
  memory::DType comm_dtype_;
  void* grads_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_slot_;
  std::unordered_map<const nn::Module*, std::vector<size_t>> slots_of_module_;
  std::deque<size_t> in_flight_;  // stage 2+: launched, not retired, oldest first
  bool reducing_ = false;
  bool shard_zero_ = false;  // this backward's reductions may overwrite the shard (begin_backward)
  size_t staging_bytes_ = 0;
  size_t staging_peak_bytes_ = 0;
  uint64_t bytes_sent_ = 0;
};

}  // namespace zs::engine
