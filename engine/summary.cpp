#include "engine/summary.h"

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <boost/json/serialize.hpp>
#include <fstream>
#include <numeric>

#include "core/errors.h"
#include "nn/flops.h"

namespace zs::engine {
namespace {

// + host->device, device->host transfer bytes, gradient bytes, tensor-parallel bytes; model and recomputed FLOPs
// over the timed steps, the cores' peak FLOP/s (model FLOPs utilisation); a pipeline stage's schedule
// seconds and busy seconds (in microseconds) and bytes sent between stages; bytes sent across hosts,
// in all and on the exact steps
constexpr size_t kFields = 18 + memory::kNumCategories + 4 + 3 + 3 + 2;
using Fields = std::array<uint64_t, kFields>;

// Gathers K uint64 values from every rank (sent as pairs of int32: the collectives move bytes as they are).
std::vector<Fields> gather_u64(const comm::Group& group, const std::vector<Fields>& mine) {
  std::vector<Fields> all(mine.size() * static_cast<size_t>(group.size()));
  if (group.size() == 1) return mine;
  std::vector<Fields> in = mine;
  memory::Tensor input(in.data(), memory::DType::kI32, {static_cast<int64_t>(2 * kFields * in.size())});
  memory::Tensor output(all.data(), memory::DType::kI32, {static_cast<int64_t>(2 * kFields * all.size())});
  group.allgather(input, output);
  return all;
}

// Every rank's fields in world order (comm::Topology's: tp ranks consecutive, world rank = tp rank +
// tp * dp rank): gathered over dp, then those blocks over tp. Collective over both groups.
std::vector<Fields> gather_ranks(const Engine& engine, const Fields& mine) {
  std::vector<Fields> by_dp = gather_u64(engine.group(), {mine});
  const comm::Group* tp = engine.tensor_parallel();
  std::vector<Fields> world = by_dp;
  if (tp != nullptr) {
    const std::vector<Fields> blocks = gather_u64(*tp, by_dp);  // [tp rank][dp rank]
    const size_t dp = by_dp.size(), t = static_cast<size_t>(tp->size());
    world.assign(dp * t, Fields{});
    for (size_t tr = 0; tr < t; ++tr) {
      for (size_t d = 0; d < dp; ++d) world[tr + t * d] = blocks[tr * dp + d];
    }
  }
  // Pipeline stages: world rank = tp rank + tp * (dp rank + dp * pp rank), so stage blocks follow each other.
  const comm::Group* pp = engine.pipeline_parallel();
  return pp != nullptr && pp->size() > 1 ? gather_u64(*pp, world) : world;
}

}  // namespace

uint64_t rss_peak_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<uint64_t>(usage.ru_maxrss) * 1024;  // Linux reports kilobytes
}

void SummaryRecorder::record(const StepReport& report, double step_seconds, int64_t tokens) {
  losses_.push_back(report.loss);
  step_seconds_.push_back(step_seconds);
  tokens_.push_back(tokens);
  model_flops_.push_back(report.model_flops);
  recompute_flops_.push_back(report.recompute_flops);
  if (report.skipped) ++skipped_;
  // Bytes per step by kind: a compressing step (one-bit Adam / 0/1 Adam after their warm-up) against
  // one that averaged gradients.
  auto& kind = report.compressed ? compressed_steps_ : exact_steps_;
  kind.steps += 1;
  kind.bytes += report.comm_bytes_sent;
  kind.grad_bytes += report.grad_comm_bytes_sent;
  kind.inter_host_bytes += report.comm_bytes_inter_host;
  tp_bytes_ += report.tp_comm_bytes_sent;
  pp_seconds_ += report.pipeline.seconds;
  pp_busy_seconds_ += report.pipeline.busy_seconds;
  pp_bytes_ += static_cast<uint64_t>(report.pipeline.bytes_sent);
  transfers_.host_to_device_bytes += report.transfers.host_to_device_bytes;
  transfers_.device_to_host_bytes += report.transfers.device_to_host_bytes;
}

namespace {

// The steps the throughput figures cover: all but the first (warm-up) when there are several.
template <typename T>
T timed_sum(const std::vector<T>& per_step) {
  const size_t first = per_step.size() > 1 ? 1 : 0;
  return std::accumulate(per_step.begin() + static_cast<long>(first), per_step.end(), T{0});
}

double ratio(double num, double den) { return den > 0 ? num / den : 0.0; }

}  // namespace

double SummaryRecorder::tokens_per_second() const {
  return ratio(static_cast<double>(timed_sum(tokens_)), timed_sum(step_seconds_));
}

double SummaryRecorder::mfu() const {
  const double peak = nn::product_peak(engine_.config().compute_dtype()).flops_per_s;
  return ratio(static_cast<double>(timed_sum(model_flops_)), timed_sum(step_seconds_) * peak);
}

boost::json::object SummaryRecorder::build(const comm::CommCounters& counters) const {
  const comm::Group& group = engine_.group();
  // This rank's tallies per collective over the run (the comms logger's table; comm::OpStats), taken
  // before the summary's own collectives and param_digest's gathers.
  boost::json::object ops;
  // With the busiest member's bytes per call, summed (Note [Busiest member's bytes] in comm/config.h):
  // above bytes_sent where the ranks' blocks differ, as ZeRO-3's gathers of modules one shard holds.
  for (const comm::OpStats& op : group.op_stats()) {
    ops[op.name] = boost::json::object{{"count", op.count},
                                       {"bytes_sent", op.bytes_sent},
                                       {"bytes_inter_host", op.bytes_inter_host},
                                       {"busiest_bytes", op.busiest_bytes},
                                       {"busiest_inter_host_bytes", op.busiest_inter_host_bytes}};
  }
  Engine::MemoryReport mem = engine_.memory_report();
  Fields mine = {mem.model_states.params,   mem.model_states.grads,     mem.model_states.optimizer,
                                        mem.device_peak_bytes,     mem.device_reserved_peak_bytes, mem.host_peak_bytes,
                                        mem.nvme_bytes,            rss_peak_bytes(),           counters.bytes_sent,
                                        counters.bytes_received,   mem.activation_peak_bytes,
                                        mem.grad_staging_peak_bytes, mem.gathered_param_peak_bytes,
                                        mem.gathered_param_bound_bytes, exact_steps_.steps, exact_steps_.bytes,
                                        compressed_steps_.steps, compressed_steps_.bytes};
  for (size_t c = 0; c < memory::kNumCategories; ++c) mine[18 + c] = mem.device_peak_by_category[c];
  constexpr size_t kTransfers = 18 + memory::kNumCategories;
  mine[kTransfers] = transfers_.host_to_device_bytes;
  mine[kTransfers + 1] = transfers_.device_to_host_bytes;
  mine[kTransfers + 2] = exact_steps_.grad_bytes;
  mine[kTransfers + 3] = tp_bytes_;
  constexpr size_t kFlops = kTransfers + 4;
  constexpr size_t kPipeline = kFlops + 3;
  mine[kPipeline] = static_cast<uint64_t>(pp_seconds_ * 1e6);
  mine[kPipeline + 1] = static_cast<uint64_t>(pp_busy_seconds_ * 1e6);
  mine[kPipeline + 2] = pp_bytes_;
  constexpr size_t kInterHost = kPipeline + 3;
  mine[kInterHost] = counters.bytes_sent_inter_host;
  mine[kInterHost + 1] = exact_steps_.inter_host_bytes;
  const memory::PeakFlops& peak = nn::product_peak(engine_.config().compute_dtype());
  mine[kFlops] = timed_sum(model_flops_);
  mine[kFlops + 1] = timed_sum(recompute_flops_);
  mine[kFlops + 2] = static_cast<uint64_t>(peak.flops_per_s);
  const std::vector<Fields> all = gather_ranks(engine_, mine);
  // Every rank computes the digest (collective at stages >= 1 and with experts); rank 0's goes in.
  std::string digest = engine_.param_digest();

  boost::json::object s;
  const EngineConfig& cfg = engine_.config();
  const int tp = engine_.tensor_parallel_size();
  s["world_size"] = group.size() * tp;
  // dp x tp (Note [tensor-parallel parameters] in engine/engine.h): the per-rank lists below are in
  // world order, tensor-parallel ranks consecutive.
  s["data_parallel_size"] = group.size();
  s["tensor_parallel_size"] = tp;
  s["topology"] = fmt::format("dp {} x tp {}", group.size(), tp);
  if (const int pp = engine_.pipeline_parallel_size(); pp > 1) {
    // Pipeline parallelism: param_digest and params_total below are the whole model's; per stage, the
    // schedule's seconds summed over the steps (mean over the stage's ranks), its measured bubble and
    // the bytes its ranks sent to the neighbouring stages.
    s["world_size"] = group.size() * tp * pp;
    s["pipeline_parallel_size"] = pp;
    s["topology"] = fmt::format("dp {} x tp {} x pp {}", group.size(), tp, pp);
    boost::json::array stages;
    const size_t per_stage = all.size() / static_cast<size_t>(pp);
    for (size_t st = 0; st < static_cast<size_t>(pp); ++st) {
      double secs = 0, busy = 0;
      uint64_t bytes = 0;
      for (size_t r = st * per_stage; r < (st + 1) * per_stage; ++r) {
        secs += static_cast<double>(all[r][kPipeline]) * 1e-6;
        busy += static_cast<double>(all[r][kPipeline + 1]) * 1e-6;
        bytes += all[r][kPipeline + 2];
      }
      stages.push_back(boost::json::object{{"stage", static_cast<int64_t>(st)},
                                           {"seconds", secs / static_cast<double>(per_stage)},
                                           {"bubble", ratio(secs - busy, secs)},
                                           {"bytes_sent", bytes}});
    }
    s["pipeline"] = boost::json::object{{"stages", std::move(stages)}};
  }
  s["zero_stage"] = cfg.zero.stage;
  if (cfg.zero.stage == 3) {
    // ZeRO-3 and ZeRO++ (docs/design.md "ZeRO++"): the ZeRO++ keys and rank 0's bytes sent over each
    // group since the engine was made (the hierarchy's groups when there are several hosts).
    boost::json::object by_group{{"dp", group.bytes_sent()}};
    if (const comm::Group* h = engine_.zeropp_host()) by_group["hpz"] = h->bytes_sent();
    if (const comm::Group* a = engine_.zeropp_across()) by_group["hpz_across"] = a->bytes_sent();
    s["zeropp"] = boost::json::object{{"zero_hpz_partition_size", cfg.zero.zero_hpz_partition_size},
                                      {"zero_quantized_weights", cfg.zero.zero_quantized_weights},
                                      {"zero_quantized_gradients", cfg.zero.zero_quantized_gradients},
                                      {"bytes_sent_by_group", std::move(by_group)}};
  }
  s["precision"] = precision_name(cfg.precision);
  s["communication_data_type"] = memory::dtype_name(cfg.gradient_comm_dtype());
  s["steps"] = static_cast<int64_t>(losses_.size());
  s["skipped_steps"] = skipped_;
  s["params_total"] = engine_.param_count();
  if (const int pp = engine_.pipeline_parallel_size(); pp > 1) {
    // The whole model: every stage's parameters, a copy another stage counts (the tied head) once.
    int64_t mine_params = engine_.param_count();
    if (auto* stage = dynamic_cast<PipelineModel*>(&engine_.model())) {
      for (const PipelineModel::Shared& sh : stage->shared_params()) {
        if (!sh.counted) mine_params -= sh.param->full_numel();
      }
    }
    int32_t halves[2] = {static_cast<int32_t>(mine_params & 0x7fffffff), static_cast<int32_t>(mine_params >> 31)};
    std::vector<int32_t> all_halves(2 * static_cast<size_t>(pp));
    engine_.pipeline_parallel()->allgather(memory::Tensor(halves, memory::DType::kI32, {2}),
                                           memory::Tensor(all_halves.data(), memory::DType::kI32, {2 * pp}));
    int64_t params_total = 0;
    for (int q = 0; q < pp; ++q) params_total += all_halves[2 * q] + (int64_t{all_halves[2 * q + 1]} << 31);
    s["params_total"] = params_total;
  }
  s["train_batch_size"] = cfg.batch.train_batch_size;
  s["micro_batch_per_rank"] = cfg.batch.micro_batch_per_rank;
  s["gradient_accumulation_steps"] = cfg.batch.gradient_accumulation_steps;
  s["final_loss"] = losses_.empty() ? 0.0 : losses_.back();
  boost::json::array history;
  for (double l : losses_) history.push_back(l);
  s["loss_history"] = std::move(history);
  if (!evals_.empty()) {
    // Only for runs that evaluate: [{"step": optimizer steps taken, "loss": mean held-out loss}, ...].
    boost::json::array evals;
    for (const auto& [step, loss] : evals_) evals.push_back(boost::json::object{{"step", step}, {"loss", loss}});
    s["eval_loss_history"] = std::move(evals);
  }
  s["tokens_per_second"] = tokens_per_second();
  std::vector<double> times = step_seconds_;
  std::sort(times.begin(), times.end());
  boost::json::object st;
  st["median"] = times.empty() ? 0.0 : (times.size() % 2 ? times[times.size() / 2] : 0.5 * (times[times.size() / 2 - 1] + times[times.size() / 2]));
  st["min"] = times.empty() ? 0.0 : times.front();
  st["max"] = times.empty() ? 0.0 : times.back();
  s["step_time_s"] = std::move(st);
  s["param_digest"] = digest;
  {
    // Model FLOPs utilisation (docs/benchmarks.md, "Model FLOPs utilisation"): every rank's kernel-counted
    // FLOPs over the timed steps (tokens_per_second's), over their time and the ranks' summed peaks.
    uint64_t model = 0, recomputed = 0, peaks = 0;
    for (const auto& v : all) {
      model += v[kFlops];
      recomputed += v[kFlops + 1];
      peaks += v[kFlops + 2];
    }
    const double secs = timed_sum(step_seconds_);
    const double timed_steps = static_cast<double>(step_seconds_.size() > 1 ? step_seconds_.size() - 1 : step_seconds_.size());
    const double achieved = ratio(static_cast<double>(model), secs);
    s["mfu"] = boost::json::object{
        {"mfu", ratio(achieved, static_cast<double>(peaks))},
        {"hfu", ratio(ratio(static_cast<double>(model + recomputed), secs), static_cast<double>(peaks))},
        {"model_flops_per_step", ratio(static_cast<double>(model), timed_steps)},
        {"recompute_flops_per_step", ratio(static_cast<double>(recomputed), timed_steps)},
        {"achieved_flops_per_s", achieved},
        {"peak_flops_per_s", static_cast<double>(peaks)},
        {"peak", boost::json::object{{"kind", memory::peak_kind_name(peak.kind)},
                                     {"instruction", peak.instruction},
                                     {"isa", memory::isa_name(peak.isa)},
                                     {"threads_per_rank", peak.threads},
                                     {"rank0_flops_per_s", peak.flops_per_s}}}};
  }
  s["device"] = boost::json::object{{"backend", cfg.device.backend}, {"memory_mb", cfg.device.memory_mb}};
  const Engine::OffloadReport off = engine_.offload_report();
  s["offload"] = boost::json::object{{"optimizer", offload_device_name(cfg.zero.offload_optimizer.device)},
                                     {"param", offload_device_name(cfg.zero.offload_param.device)},
                                     {"rank0_host_buffer_budget_bytes", off.host_budget_bytes},
                                     {"rank0_nvme_bytes_read", off.bytes_read},
                                     {"rank0_nvme_bytes_written", off.bytes_written},
                                     {"rank0_optimizer_compute_s", off.compute_s},
                                     {"rank0_optimizer_io_wait_s", off.io_wait_s}};
  s["optimizer"] = boost::json::object{{"type", cfg.optimizer.name()}, {"state_bytes_per_param", engine_.optimizer_state_bytes_per_param()}};

  boost::json::array mem_ranks, comm_ranks;
  for (size_t r = 0; r < all.size(); ++r) {
    const auto& v = all[r];
    boost::json::object m;
    m["rank"] = static_cast<int64_t>(r);
    m["model_states_bytes"] = {{"params", v[0]}, {"grads", v[1]}, {"optimizer", v[2]}};
    m["device_peak_bytes"] = v[3];
    m["device_reserved_peak_bytes"] = v[4];
    m["host_peak_bytes"] = v[5];
    m["nvme_bytes"] = v[6];
    m["rss_peak_bytes"] = v[7];
    m["activation_peak_bytes"] = v[10];
    m["grad_staging_peak_bytes"] = v[11];
    m["gathered_param_peak_bytes"] = v[12];
    m["gathered_param_bound_bytes"] = v[13];
    boost::json::object at_peak;
    for (memory::Category c : memory::kAllCategories) at_peak[memory::category_name(c)] = v[18 + static_cast<size_t>(c)];
    m["device_peak_by_category"] = std::move(at_peak);
    // What crossed between the host and the device tier through the backend (offload's gradient and
    // parameter traffic: a GPU's PCIe bytes), in all and per step.
    const double steps = losses_.empty() ? 1.0 : static_cast<double>(losses_.size());
    m["transfers"] = {{"host_to_device_bytes", v[kTransfers]},
                      {"device_to_host_bytes", v[kTransfers + 1]},
                      {"host_to_device_per_step", static_cast<double>(v[kTransfers]) / steps},
                      {"device_to_host_per_step", static_cast<double>(v[kTransfers + 1]) / steps}};
    mem_ranks.push_back(std::move(m));
    auto mean = [](uint64_t steps, uint64_t bytes) { return steps ? static_cast<double>(bytes) / static_cast<double>(steps) : 0.0; };
    comm_ranks.push_back(boost::json::object{{"rank", static_cast<int64_t>(r)},
                                             {"bytes_sent", v[8]},
                                             {"bytes_received", v[9]},
                                             // of bytes_sent: across hosts and inside this rank's host
                                             // (Note [Bytes across hosts] in comm/config.h)
                                             {"bytes_sent_inter_host", v[kInterHost]},
                                             {"bytes_sent_intra_host", v[8] - v[kInterHost]},
                                             {"bytes_sent_per_step",
                                              {{"exact_steps", v[14]},
                                               {"exact_mean", mean(v[14], v[15])},
                                              // the gradient averaging's share of exact_mean, in
                                              // communication_data_type (half of fp32's for bf16/fp16)
                                              {"exact_gradient_mean", mean(v[14], v[kTransfers + 2])},
                                               // over the tensor-parallel group (0 at tp 1)
                                               {"tensor_parallel_mean", mean(v[14] + v[16], v[kTransfers + 3])},
                                               // of exact_mean, across hosts (0 on one host)
                                               {"exact_inter_host_mean", mean(v[14], v[kInterHost + 1])},
                                               {"compressed_steps", v[16]},
                                               {"compressed_mean", mean(v[16], v[17])},
                                               {"compressed_over_exact", v[14] && v[16] ? mean(v[16], v[17]) / mean(v[14], v[15]) : 0.0}}}});
  }
  s["memory"] = boost::json::object{{"per_rank", std::move(mem_ranks)}};
  // Activation checkpointing (engine/recompute_config.h), this rank's (rank 0's in the file):
  // what recomputes and how long the re-runs took (selective recompute runs inside attention's
  // backward, so it has no re-runs to time).
  const Engine::RecomputeReport rc = engine_.recompute_report();
  if (rc.checkpointed_modules > 0 || rc.blocks != "none") {
    const RecomputeConfig& ac = cfg.recompute;
    s["activation_checkpointing"] = boost::json::object{
        {"checkpoint_blocks", rc.blocks},
        {"checkpointed_modules", rc.checkpointed_modules},
        {"cpu_checkpointing", ac.cpu_checkpointing},
        {"contiguous_buffer_bytes", rc.contiguous_buffer_bytes},
        {"recomputes", rc.recomputes},
        {"recompute_s", rc.recompute_s},
        {"recompute_s_per_step", losses_.empty() ? 0.0 : rc.recompute_s / static_cast<double>(losses_.size())}};
  }
  // This rank's counts of collectives through the node's shared memory, and of those the ones that read
  // the peers' tensors in place (comm.shared_arena; comm/config.h), and its tallies per collective.
  s["comm"] = boost::json::object{{"per_rank", std::move(comm_ranks)},
                                  {"ops", std::move(ops)},
                                  {"shared_memory_collectives", counters.shared_memory_collectives},
                                  {"direct_collectives", counters.direct_collectives}};
  return s;
}

void SummaryRecorder::write(const std::string& path, const comm::CommCounters& counters,
                            const boost::json::object& extra) const {
  boost::json::object s = build(counters);
  for (const auto& [key, value] : extra) s[key] = value;
  // World rank 0 writes: rank 0 of the data-parallel group of tensor-parallel rank 0.
  const comm::Group* tp = engine_.tensor_parallel();
  const comm::Group* pp = engine_.pipeline_parallel();
  if (engine_.group().rank() != 0 || (tp != nullptr && tp->rank() != 0) || (pp != nullptr && pp->rank() != 0)) return;
  std::ofstream out(path);
  if (!out) throw IoError(fmt::format("--summary: cannot write '{}': check that the directory exists and is writable", path));
  out << boost::json::serialize(s) << "\n";
  if (!out) throw IoError(fmt::format("--summary: writing '{}' failed", path));
}

}  // namespace zs::engine
