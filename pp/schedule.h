// Pipeline schedules: the order of forward and backward passes each rank runs, and the order of the
// point-to-point transfers between ranks that follows from it.
//
//   auto ops = pp::schedule_ops(pp::Schedule::kOneFOneB, {.stages = 4, .chunks = 1, .micro_batches = 8}, rank);
//   pp::Plan plan = pp::plan(pp::Schedule::kOneFOneB, shape);   // every rank's ops, sends and receives
//
// A pipeline of `stages` ranks holds stages * chunks model chunks: rank r holds the global chunks
// r, r + stages, r + 2 * stages, ... (Megatron's virtual pipeline: chunks > 1 only for interleaved).
// Micro-batch b's forward runs through global chunks 0, 1, ..., its backward back down.
//
// Schedules (Megatron-LM's megatron/core/pipeline_parallel/schedules.py):
//   kAllForwardAllBackward  every forward, then every backward (GPipe; the reference, m in flight)
//   kOneFOneB               rank r runs min(stages - r - 1, m) forwards, then one forward and one
//                           backward alternately, then the remaining backwards (at most stages - r in
//                           flight; bubble (stages - 1) / (m + stages - 1) with equal pass times)
//   kZeroBubbleH1           1F1B's memory bound with every backward split into the input gradient (B,
//                           sent on at once) and the weight gradient (W), which fills the idle time
//                           (Note [ZB-H1])
//   kInterleaved            1F1B over `chunks` virtual chunks per rank in Megatron's order: micro-batches
//                           in groups of `stages`, each group through chunk 0, then 1, ...; warm-up
//                           (stages - r - 1) * 2 + (chunks - 1) * stages forwards; needs m % stages == 0
//                           (bubble lower by about the chunk count)
//
// Note [transfer order]
// comm's point-to-point ops are synchronous and run in one order per rank (comm/group.h), so the
// transfers of all ranks must be posted in an order that cannot deadlock. plan() simulates the
// schedule with unit pass times (forward 1, backward 2) and gives every transfer the time its
// producer finishes; each rank posts its sends and receives in the order of (time, key), one global
// total order, and a receive is posted (async) at its time, before the pass that consumes it. The
// earliest unfinished transfer then always has both ends at it (everything before it on either rank is
// an earlier transfer or a pass whose inputs came earlier), so no schedule that plan() accepts can
// deadlock, whatever the real pass times are. The same simulation gives the schedule's ideal bubble.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace zs::pp {

enum class Schedule { kAllForwardAllBackward, kOneFOneB, kInterleaved, kZeroBubbleH1 };

// Note [ZB-H1]
// Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), schedule ZB-H1: the previous stage waits
// only for a backward's input gradient, so B is run and sent as soon as possible and the weight
// gradient W, which nothing waits for, moves into what would be bubble. With F = B = W in time, the
// 1F1B bubble of (stages - 1) * (F + B + W) per rank shrinks towards (stages - 1) * (F + B - W), about
// a third. The order comes from a unit-time list schedule (pp/schedule.cpp: B first, then F within
// 1F1B's bound of stages - rank micro-batches between forward and B and 2 * stages - rank - 1 between
// forward and W, then W). Layers defer W through
// nn's Note [deferred weight gradients] (nn::Linear does: the GPT's matmuls, and the tied head off
// the first chunk); a chunk's other weight gradients (norms, embeddings) are computed in B. A
// deferred W keeps the layer's input and its output gradient (a copy, or dy itself where the chunk
// keeps its gradients intact: pp::StageModel::grads_intact) until it runs.

// "afab", "1f1b", "interleaved", "zb-h1"; parse throws ConfigError naming pipeline.schedule.
std::string schedule_name(Schedule s);
Schedule parse_schedule(const std::string& name);

struct PipelineShape {
  int stages = 1;             // model.pipeline_parallel_size
  int chunks = 1;             // model.virtual_pipeline_size (interleaved only)
  int64_t micro_batches = 1;  // micro-batches of one step
  int global_chunks() const { return stages * chunks; }
};

// Throws ConfigError naming the keys: sizes >= 1; chunks > 1 only with kInterleaved;
// kInterleaved with chunks >= 2 and micro_batches % stages == 0.
void validate(Schedule s, const PipelineShape& shape);

struct Op {
  enum Kind : uint8_t { kForward, kBackward, kWeight };  // kWeight: ZB-H1's deferred weight gradients
  Kind kind;
  int64_t micro_batch;
  int chunk;  // local chunk index on the rank (global chunk = chunk * stages + rank)
  bool operator==(const Op&) const = default;
};

// The passes rank `rank` runs, in order.
std::vector<Op> schedule_ops(Schedule s, const PipelineShape& shape, int rank);

// One transfer between ranks: an activation (forward: global chunk g's output to g + 1) or its
// gradient (backward: g's input gradient to g - 1).
struct Transfer {
  Op::Kind kind;
  int64_t micro_batch;
  int from_chunk;  // global chunk that produces it
  int src, dst;    // ranks
};

// The most micro-batches rank `rank` holds at once under the schedule: those whose forward on one of
// its chunks has run and whose backward (B; ZB-H1's W passes do not count) has not. 1F1B: stages -
// rank; all-forward-all-backward: every micro-batch. pp::Pipeline builds that many chunk instances
// (Note [micro-batches in flight] in pp/pipeline.h); the memory estimator reports it per stage.
int max_in_flight(Schedule s, const PipelineShape& shape, int rank);

// A rank's program: its passes and transfers in posting order (Note [transfer order]).
struct Action {
  enum Kind : uint8_t { kRun, kSend, kRecv };
  Kind kind;
  Op op;          // kRun
  Transfer xfer;  // kSend / kRecv
};

struct Plan {
  std::vector<std::vector<Action>> ranks;  // per rank
  // Simulated with forward 1 and backward 2 (ZB-H1: B 1, W 1): the last pass's end, and each rank's idle fraction of it.
  double makespan = 0.0;
  std::vector<double> bubble;
};

// Every rank's program. Throws UsageError if the schedule cannot complete (an internal bug).
Plan plan(Schedule s, const PipelineShape& shape);

// The schedule run on a timeline: every rank runs its passes (schedule_ops) in order, each starting
// once the rank is free and the pass's input exists (the producing pass on the neighbouring chunk has
// ended, plus `transfer_s` where that chunk is on another rank). plan() takes it with unit pass times
// and no transfer time; given measured pass times it is the step the schedule would take with those
// passes on a rank of its own each: pp_bubble_bench replays each pass's CPU seconds through it where
// ranks share cores (docs/benchmarks.md, "Pipeline bubble, memory and step time"), and zeroshard
// project adds the link's time per transfer.
//
// Note [transfer delay]
// pp::Pipeline posts its sends asynchronously (send_async) and goes on with its next pass; only the
// receiving rank waits, at the pass that consumes the tensor. So a transfer is a delay between the
// producing pass's end and the earliest start of the consuming pass on the next rank, not time on
// either rank's passes: `transfer_s` (the link's latency and the tensor's bytes over its bandwidth)
// is added to a dependency between passes on different ranks, and the sender stays free. Not
// modelled: comm's executor runs a rank's transfers one at a time in posting order (Note
// [Point-to-point] in comm/p2p.cpp), and a send is waited for after the sender's next action (Note
// [send retirement] in pp/pipeline.h): transfers in flight together queue there rather than overlap.
// A transfer whose time depends on what went before it (a link that queues sends, a shaper's bucket
// that the pauses between them refill: Note [the link's bucket] in project/project_compute.cpp) is
// given as a TransferArrival instead of one time: it is asked for each transfer when its producing
// pass ends, each rank's transfers in the order of their pass ends, so it can keep a link's state.
struct Timeline {
  std::vector<std::vector<Op>> ops;           // per rank: schedule_ops
  std::vector<std::vector<double>> start;     // per rank: each pass's start
  std::vector<double> forward_end, backward_end;  // per (micro_batch * global_chunks + global chunk); B's end
  double makespan = 0.0;                      // the last pass's end
  std::vector<double> bubble;                 // per rank: 1 - its pass time / makespan
};
// `seconds[r][i]`: the time of rank r's i-th pass (schedule_ops order); empty: plan()'s unit times
// (forward 1, backward 2; ZB-H1's B and W 1 each). `transfer_s`: each transfer's time between ranks
// (Note [transfer delay]). Throws UsageError as plan().
Timeline timeline(Schedule s, const PipelineShape& shape, const std::vector<std::vector<double>>& seconds = {},
                  double transfer_s = 0.0);
// When a transfer from rank `src` to rank `dst` reaches `dst`, its producing pass having ended at `ready`
// (at least `ready`). Called once per transfer, each `src`'s in the order of their `ready`.
using TransferArrival = std::function<double(int src, int dst, double ready)>;
// The same with each transfer's arrival from `arrive` (Note [transfer delay]).
Timeline timeline(Schedule s, const PipelineShape& shape, const std::vector<std::vector<double>>& seconds,
                  const TransferArrival& arrive);

}  // namespace zs::pp
