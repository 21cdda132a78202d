// Pipeline: runs one step's micro-batches through the model chunks of this rank under a schedule,
// moving activations and their gradients to the neighbouring stages over the "pp" group.
//
//   pp::Pipeline pipe(topo.pipeline_parallel(), {.schedule = pp::Schedule::kOneFOneB}, factories);
//   nn::materialize(pipe.chunk(0), seed);            // or the engine places chunk(c)'s parameters
//   pp::StepStats st = pipe.run(ctx, micro_batches, /*grad_scale=*/1.0f / m);
//   // every chunk parameter's grad += grad_scale * d(loss of each micro-batch); st.loss: mean loss
//
// Chunks. A rank holds `chunks` model chunks (1, or model.virtual_pipeline_size for interleaved):
// local chunk c is global chunk c * stages + rank. Each is a StageModel: an nn::Model whose batch
// input is the token ids (the first global chunk) or the activation received from the chunk before,
// and whose forward gives the activation for the next chunk (take_output) or the loss (the last).
//
// Note [micro-batches in flight]
// nn's lifecycle rule lets a module instance hold one micro-batch's saved activations at a time
// (nn/context.h), but a stage holds several between their forwards and backwards (1F1B: stages - r).
// The pipeline therefore builds one instance of a chunk per micro-batch in flight, from the chunk's
// factory, and points every instance's parameters at the first instance's data and grad (the one the
// caller materialises or the engine places): the weights exist once, and every instance's backward
// accumulates into the same gradient. Instances are reused as micro-batches finish; the views are
// re-bound at the start of every run(), so storage the engine moves between steps is followed.
// Activation recomputation works per instance as on a plain model (its kept inputs are its own).
//
// Communication: the transfers of every rank follow pp::plan (Note [transfer order] in
// pp/schedule.h): sends and receives are async and posted in that order, a pass waits only for its
// own input, so transfers overlap the passes. Shapes and dtypes are agreed once per run: an allgather
// of (micro-batches, batch, sequence) over the group, every rank checking them (a mismatch throws on
// every rank). A peer that stops or dies ends both sides within the comm timeout with comm's
// CommError naming the op, the "pp" group and the peer.
//
// Note [send retirement]
// A send's tensor stays allocated until the send is known complete. Were that whenever a test finds
// it done, a stage's memory would depend on how far its peer is: a real run's device peak would vary
// by a boundary activation or two from run to run, and the memory estimator (estimate/measure.h),
// whose simulated group completes a transfer only when it is waited for, could not predict it. So the
// rule is fixed: a send is waited for, and its tensor freed, right after the next action of this rank
// (a pass or another transfer). It overlaps that action; its peer has posted the matching receive at
// the same point of the global order (Note [transfer order] in pp/schedule.h), and the wait cannot
// deadlock by the same argument: everything before it on either rank is earlier in that order. Every
// stage, real or simulated, then frees its sends at the same points.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "comm/group.h"
#include "nn/model.h"
#include "pp/schedule.h"

namespace zs::pp {

class StageModel : public nn::Model {
 public:
  // The activation this chunk sends on for a micro-batch of (batch, seq) tokens, fp32.
  virtual memory::Shape boundary_shape(int64_t batch, int64_t seq) const = 0;
  // After a training forward of a chunk that is not the last: its output, to send on.
  memory::Tensor take_output() { return std::exchange(output_, {}); }
  // Before the backward of a chunk that is not the last: the gradient of its output.
  void set_output_grad(memory::Tensor dy) { output_grad_ = std::move(dy); }
  // After the backward of a chunk that is not the first: the gradient of its input activation.
  memory::Tensor take_input_grad() { return std::exchange(input_grad_, {}); }
  // The parameter this chunk shares with another stage's chunk (a tied embedding, whose two copies'
  // gradients are summed: pp::GptPipeline::step), or nullptr.
  virtual nn::Parameter* shared_embedding() { return nullptr; }
  // True where no module of the chunk writes into a gradient after passing it to a child's backward:
  // ZB-H1's deferred weight gradients then keep dy without a copy (Note [deferred weight gradients]
  // in nn/context.h). False, the safe answer, unless the chunk's every module is known.
  virtual bool grads_intact() const { return false; }

 protected:
  memory::Tensor output_, output_grad_, input_grad_;
};

using ChunkFactory = std::function<std::unique_ptr<StageModel>()>;

struct PipelineConfig {
  Schedule schedule = Schedule::kOneFOneB;  // pipeline.schedule
};

struct StepStats {
  float loss = 0.0f;            // mean over the micro-batches (every rank of the group gets it)
  double seconds = 0.0;         // run() wall time on this rank
  double busy_seconds = 0.0;    // spent in forward and backward passes
  double bubble = 0.0;          // 1 - busy / seconds
  double ideal_bubble = 0.0;    // this rank's idle fraction in pp::plan's unit-time simulation
  int64_t bytes_sent = 0;       // activations and gradients sent to the neighbours
  int max_in_flight = 0;        // the most micro-batches held at once (instances per chunk, summed)
  // Per pass, in this rank's schedule_ops order: wall seconds, and CPU seconds of the calling thread
  // (the pass's whole cost where it computes on that thread alone, 1 compute thread per rank: what
  // pp::timeline replays where ranks share cores, pp_bubble_bench).
  std::vector<double> pass_seconds, pass_cpu_seconds;
};

class Pipeline {
 public:
  // `group`: the "pp" group (comm::Topology::pipeline_parallel()), this rank its stage. One factory
  // per local chunk (chunks = factories.size()); each call builds a fresh, named chunk. `first`: the
  // chunks' first instances, built by the caller from the same factories and owned by it (an engine's
  // model holding them as parts, run/gpt_pipeline.h); empty: the pipeline builds them.
  Pipeline(const comm::Group& group, const PipelineConfig& cfg, std::vector<ChunkFactory> factories,
           std::vector<StageModel*> first = {});
  ~Pipeline();

  int chunks() const { return static_cast<int>(chunks_.size()); }
  // Local chunk c's first instance: the one whose parameters hold the storage.
  StageModel& chunk(int c);
  const comm::Group& group() const { return group_; }

  // One step: forward and backward of every micro-batch; every chunk parameter's grad +=
  // grad_scale * d(micro-batch mean loss). Every rank passes the same number of micro-batches; the
  // first stage reads their inputs, the last their targets (other ranks may leave them undefined).
  StepStats run(nn::Context& ctx, std::span<const nn::Batch> micro_batches, float grad_scale);

 private:
  struct Chunk;
  StageModel& acquire(int c, int64_t mb, int* in_flight);
  StageModel& holder(int c, int64_t mb);
  void release(int c, int64_t mb);

  const comm::Group& group_;
  PipelineConfig cfg_;
  std::vector<std::unique_ptr<Chunk>> chunks_;
};

}  // namespace zs::pp
