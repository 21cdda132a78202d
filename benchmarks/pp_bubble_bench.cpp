// Question: how much of a pipeline step is bubble under each schedule, against the formulas? And how
// many micro-batches' activations does each stage hold?
//
//   mpirun -np 2 build/release/benchmarks/pp_bubble_bench [--json out.json] [--micro-batches 4,8,16]
//          [--reps 5] [--d 512] [--layers 16] [--seq 64] [--batch 4] [--vocab 256]
//          [--partition compute|parameters|uniform] [--schedules afab,1f1b,interleaved,zb-h1]
//   mpirun -np 4 --oversubscribe ... (pp 4: ranks share cores; read the replayed column, below)
//   ... --schedules 1f1b,zb-h1 --reps 3   (docs/benchmarks.md's default rows; 1F1B always runs)
//   ... --d 256 --layers 8 --reps 3       (its second row set: the small model, every schedule)
// The default model (16 blocks of d_model 512) is the one whose proportions come nearest the
// formulas' premises on this CPU: four blocks a stage at pp 4 keep the head and loss (byte
// vocabulary) within a few % of a stage, and F, B and W are nearer equal than at d_model 256
// (docs/benchmarks.md, "Model proportions").
//
// The world is one pipeline (pp = ranks) of the built-in GPT (pp::GptPipeline, partitioned by
// --partition: "compute" by default, Note [compute partition] in pp/gpt.cpp; no recomputation), one compute thread per rank (launch::set_blas_threads; the JSON says
// how many). Per micro-batch count m: a warm-up step of every schedule, then --reps rounds, each
// running every schedule once in turn (interleaved, so load drifts hit all alike), each step after a
// barrier. Two bubbles per step, the median over rounds reported:
//   measured   1 - (a rank's wall seconds in its passes) / (its step's wall seconds), mean over
//              ranks: what this machine did. Honest only where every rank has a core to itself (pp 2
//              on 2 cores); with ranks sharing cores an idle rank lends its core to a busy one, its
//              passes stretch and the bubble shrinks or grows with the OS's choices.
//   replayed   the step the schedule would take with the passes this step measured, each rank on a
//              core of its own: every pass's CPU seconds (its thread's CPU time, which waiting for a
//              core does not add to), replayed through the schedule's dependencies (pp::timeline;
//              transfers taken as free); mean over ranks of 1 - pass time / makespan. At pp 2 it is
//              checked against the measured bubble; at pp 4 on 2 cores it is the figure (the
//              oversubscription still inflates pass CPU times a little through shared caches).
//   repl_med   the same replay with every pass at the median of its kind (forward, backward, W) on its
//              rank and chunk in that step: without the pass-to-pass jitter other processes' load
//              adds, with the stages' and the pass kinds' own costs.
// Beside them: the schedule's ideal bubble (pp::plan's unit times: forward 1, backward 2) and 1F1B's
// formula (pp - 1) / (m + pp - 1); ratios measured / formula, replayed / formula, and each schedule's
// replayed bubble over 1F1B's in the same round (issue #35: 1F1B within 15% of the formula,
// interleaved lower by about its chunk count, ZB-H1 at most 0.5x of 1F1B). Pass times are not even
// (the last stage computes the head and loss; the first the embedding), so the formula, which assumes
// equal stages, is met only as far as the partition balances them: pass_imbalance is the largest
// rank's pass seconds over the mean. Two formulas take the measured costs instead:
//   f_stages   1F1B's bubble with unequal stages: stage s spends t_s per micro-batch (its pass CPU
//              seconds / m), the slowest paces the steady state, so the step takes
//              sum_s t_s + (m - 1) max_s t_s and stage s idles 1 - m t_s / that (mean over stages;
//              (pp - 1) / (m + pp - 1) when all t_s are equal). Exact for 1F1B where the slowest
//              stage is the last (the head's).
//   f_zb       ZB-H1's bubble with the measured mean F, B, W (Qi et al.): (pp - 1)(F + B - W) idle
//              per rank against 1F1B's (pp - 1)(F + B + W), over the step m (F + B + W) + that idle;
//              f_zb / formula is the ZB-H1 / 1F1B ratio these pass costs allow with equal stages.
//              No order does better with ZB-H1's memory (docs/benchmarks.md, "Second rerun"), and it
//              is at most 0.5 exactly when x = (F + B - W) / (F + B + W) <= m / (2 m + pp - 1): the
//              JSON's zb_h1_x and zb_h1_x_for_half (F = B = W: x = 1/3).
// Per stage: its peak activation bytes (nn::HostContext's kActivation peak over the steps: every
// micro-batch in flight, received activations, pending sends; independent of timing) and the most
// micro-batches it held at once (all-forward-all-backward: m; 1F1B: pp - stage).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "benchmarks/support/bench_json.h"
#include "comm/comm.h"
#include "core/rng.h"
#include "launch/launch.h"
#include "nn/host_context.h"
#include "pp/pp.h"

using namespace zs;

namespace {

struct Sched {
  pp::Schedule s;
  int chunks;
};

std::vector<nn::Batch> micro_batches(int64_t m, int64_t B, int64_t T) {
  std::vector<nn::Batch> mbs;
  for (int64_t k = 0; k < m; ++k) {
    nn::Batch b{memory::Tensor::empty({B, T}, memory::DType::kI32), memory::Tensor::empty({B, T}, memory::DType::kI32)};
    CounterRng rng(static_cast<uint64_t>(k), "bench tokens");
    for (int64_t i = 0; i < B * T; ++i) {
      b.inputs.data<int32_t>()[i] = static_cast<int32_t>(rng.uniform(2 * static_cast<uint64_t>(i)) * 256) % 256;
      b.targets.data<int32_t>()[i] = static_cast<int32_t>(rng.uniform(2 * static_cast<uint64_t>(i) + 1) * 256) % 256;
    }
    mbs.push_back(b);
  }
  return mbs;
}

// One step's figures on rank 0 (the others get zeros): measured and replayed bubble, step seconds,
// the largest rank's pass seconds over the mean.
struct StepFigures {
  double measured = 0, replayed = 0, typical = 0, seconds = 0, imbalance = 0, stage_formula = 0;
  double pass_ms[3] = {0, 0, 0};  // mean CPU milliseconds of a forward, a backward (ZB-H1: B), a W pass
  std::vector<double> stage_ms;   // the same per stage: stage_ms[3 * r + kind]
};

StepFigures step_figures(const pp::StepStats& st, pp::Schedule s, const pp::PipelineShape& shape, int me) {
  const int p = shape.stages;
  const auto n = static_cast<int>(st.pass_cpu_seconds.size());  // every rank runs as many passes
  std::vector<double> all(static_cast<size_t>(n * p));
  MPI_Gather(st.pass_cpu_seconds.data(), n, MPI_DOUBLE, all.data(), n, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  double v[2] = {st.bubble, st.seconds};
  MPI_Reduce(me == 0 ? MPI_IN_PLACE : v, v, 2, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  StepFigures f;
  if (me != 0) return f;
  std::vector<std::vector<double>> secs(static_cast<size_t>(p));
  std::vector<double> busy;
  for (int r = 0; r < p; ++r) {
    secs[static_cast<size_t>(r)].assign(all.begin() + r * n, all.begin() + (r + 1) * n);
    busy.push_back(std::accumulate(secs[static_cast<size_t>(r)].begin(), secs[static_cast<size_t>(r)].end(), 0.0));
  }
  const pp::Timeline tl = pp::timeline(s, shape, secs);
  f.measured = v[0] / p;
  f.seconds = v[1] / p;
  f.replayed = std::accumulate(tl.bubble.begin(), tl.bubble.end(), 0.0) / p;
  // The same with every pass at its kind's median on its rank and chunk: what is left without the
  // pass-to-pass jitter (other processes' load) but with the stages' and the pass kinds' real costs.
  std::vector<std::vector<double>> typical = secs;
  for (int r = 0; r < p; ++r) {
    const auto& ops = tl.ops[static_cast<size_t>(r)];
    for (size_t i = 0; i < ops.size(); ++i) {
      std::vector<double> same;
      for (size_t j = 0; j < ops.size(); ++j) {
        if (ops[j].kind == ops[i].kind && ops[j].chunk == ops[i].chunk) same.push_back(secs[static_cast<size_t>(r)][j]);
      }
      typical[static_cast<size_t>(r)][i] = bench::median(same);
    }
  }
  const pp::Timeline smooth = pp::timeline(s, shape, typical);
  f.typical = std::accumulate(smooth.bubble.begin(), smooth.bubble.end(), 0.0) / p;
  double sum[3] = {0, 0, 0}, count[3] = {0, 0, 0};
  for (int r = 0; r < p; ++r) {
    for (size_t i = 0; i < tl.ops[static_cast<size_t>(r)].size(); ++i) {
      const int k = tl.ops[static_cast<size_t>(r)][i].kind;
      sum[k] += secs[static_cast<size_t>(r)][i];
      count[k] += 1;
    }
  }
  for (int k = 0; k < 3; ++k) f.pass_ms[k] = count[k] > 0 ? 1e3 * sum[k] / count[k] : 0.0;
  f.stage_ms.assign(3 * static_cast<size_t>(p), 0.0);
  for (int r = 0; r < p; ++r) {
    double rs[3] = {0, 0, 0}, rc[3] = {0, 0, 0};
    for (size_t i = 0; i < tl.ops[static_cast<size_t>(r)].size(); ++i) {
      const int k = tl.ops[static_cast<size_t>(r)][i].kind;
      rs[k] += secs[static_cast<size_t>(r)][i];
      rc[k] += 1;
    }
    for (int k = 0; k < 3; ++k) f.stage_ms[3 * static_cast<size_t>(r) + k] = rc[k] > 0 ? 1e3 * rs[k] / rc[k] : 0.0;
  }
  f.imbalance = *std::max_element(busy.begin(), busy.end()) / (std::accumulate(busy.begin(), busy.end(), 0.0) / p);
  // f_stages (above): busy[r] / m is stage r's cost per micro-batch.
  const double most = *std::max_element(busy.begin(), busy.end()), m = static_cast<double>(shape.micro_batches);
  const double step = (std::accumulate(busy.begin(), busy.end(), 0.0) + (m - 1.0) * most) / m;
  for (double b : busy) f.stage_formula += (1.0 - b / step) / p;
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  launch::select_blas_kernels(argv);
  try {
    auto world = comm::World::create();
    const int threads = launch::set_blas_threads(launch::local_rank_count());
    comm::Topology topo(world.group(), {.pipeline_parallel_size = world.size()});
    const comm::Group& group = topo.pipeline_parallel();
    const int p = group.size(), me = world.rank();
    const int reps = std::stoi(bench::arg_value(argc, argv, "--reps", "5"));
    const int64_t d = std::stoll(bench::arg_value(argc, argv, "--d", "512"));
    const int64_t layers = std::stoll(bench::arg_value(argc, argv, "--layers", "16"));
    const int64_t T = std::stoll(bench::arg_value(argc, argv, "--seq", "64"));
    const int64_t B = std::stoll(bench::arg_value(argc, argv, "--batch", "4"));
    const int64_t vocab = std::stoll(bench::arg_value(argc, argv, "--vocab", "256"));
    const pp::PartitionConfig partition{.method = pp::parse_partition_method(bench::arg_value(argc, argv, "--partition", "compute"))};
    std::vector<int64_t> ms;
    {
      std::stringstream in(bench::arg_value(argc, argv, "--micro-batches", "4,8,16"));
      for (std::string x; std::getline(in, x, ',');) ms.push_back(std::stoll(x));
    }
    const nn::GptConfig cfg{.n_layer = layers, .d_model = d, .n_head = 4, .seq_len = T, .vocab_size = vocab};
    bench::Report report;
    report.benchmark = "pp_bubble_bench";
    report.config = {{"pp", p},     {"d_model", d}, {"n_layer", layers}, {"seq", T}, {"batch", B},
                     {"reps", reps}, {"compute_threads_per_rank", threads}, {"vocab", vocab},
                     {"partition", pp::partition_method_name(partition.method)}};
    boost::json::object ratios;
    // --schedules: those to run (1F1B always: every ratio's baseline); all four by default.
    std::vector<pp::Schedule> wanted{pp::Schedule::kOneFOneB};
    {
      std::stringstream in(bench::arg_value(argc, argv, "--schedules", "afab,1f1b,interleaved,zb-h1"));
      for (std::string x; std::getline(in, x, ',');) wanted.push_back(pp::parse_schedule(x));
    }
    std::vector<Sched> scheds;
    std::string run_names;
    for (Sched sc : {Sched{pp::Schedule::kAllForwardAllBackward, 1}, Sched{pp::Schedule::kOneFOneB, 1},
                     Sched{pp::Schedule::kInterleaved, 2}, Sched{pp::Schedule::kZeroBubbleH1, 1}}) {
      if (sc.chunks * p <= layers && std::find(wanted.begin(), wanted.end(), sc.s) != wanted.end()) {
        scheds.push_back(sc);
        run_names += (run_names.empty() ? "" : ",") + pp::schedule_name(sc.s);
      }
    }
    report.config["schedules"] = run_names;
    std::vector<std::unique_ptr<pp::GptPipeline>> gpts;
    for (const Sched& sc : scheds) {
      gpts.push_back(std::make_unique<pp::GptPipeline>(
          cfg, group,
          pp::GptPipelineConfig{.virtual_pipeline_size = sc.chunks, .pipeline = {.schedule = sc.s}, .partition = partition}));
      gpts.back()->materialize(1);
    }
    if (me == 0) {
      std::printf("pp %d, %d compute thread(s) per rank%s\n", p, threads,
                  threads > 1 ? " (replayed CPU seconds then miss the other threads' work: use 1)" : "");
      boost::json::object bounds;
      for (size_t i = 0; i < scheds.size(); ++i) {
        std::string b;
        for (int64_t x : gpts[i]->boundaries()) b += fmt::format("{}{}", b.empty() ? "" : ",", x);
        std::printf("%s: block boundaries of the %s partition %s\n", pp::schedule_name(scheds[i].s).c_str(),
                    pp::partition_method_name(partition.method).c_str(), b.c_str());
        bounds[pp::schedule_name(scheds[i].s)] = b;
      }
      report.config["block_boundaries"] = bounds;
      std::printf("%-12s %3s %9s %9s %9s %9s %9s %8s %8s %9s %9s %8s %14s %s\n", "schedule", "m", "measured", "replayed",
                  "repl_med", "ideal",
                  "formula", "meas/f", "repl/f", "repl/1f1b", "step_ms", "imbal", "F/B/W cpu ms", "per stage: peak act MiB (in flight)");
      std::printf("%-12s %3s %9s %9s %9s %9s\n", "", "", "f_stages", "repl/f_st", "f_zb", "f_zb/f");
    }
    for (int64_t m : ms) {
      const std::vector<nn::Batch> mbs = micro_batches(m, B, T);
      std::vector<std::unique_ptr<nn::HostContext>> ctx;  // per schedule: its peaks are this m's
      std::vector<std::vector<StepFigures>> figs(scheds.size());
      std::vector<int> in_flight(scheds.size(), 0);
      for (size_t i = 0; i < scheds.size(); ++i) ctx.push_back(std::make_unique<nn::HostContext>());
      auto runnable = [&](size_t i) { return scheds[i].s != pp::Schedule::kInterleaved || m % p == 0; };
      for (int r = -1; r < reps; ++r) {
        for (size_t i = 0; i < scheds.size(); ++i) {
          if (!runnable(i)) continue;
          for (nn::Parameter* q : gpts[i]->params()) q->grad().zero();
          MPI_Barrier(MPI_COMM_WORLD);
          const pp::StepStats st = gpts[i]->step(*ctx[i], mbs, 1.0f / static_cast<float>(m));
          in_flight[i] = st.max_in_flight;
          const StepFigures f =
              step_figures(st, scheds[i].s, {.stages = p, .chunks = scheds[i].chunks, .micro_batches = m}, me);
          if (r >= 0) figs[i].push_back(f);  // r = -1: warm-up
        }
      }
      size_t k1 = 0;  // 1F1B, every ratio's baseline
      while (scheds[k1].s != pp::Schedule::kOneFOneB) ++k1;
      for (size_t i = 0; i < scheds.size(); ++i) {
        if (!runnable(i)) continue;
        // Per stage: peak activation bytes and micro-batches in flight, gathered to rank 0.
        const double mine[2] = {static_cast<double>(ctx[i]->peak_bytes(nn::MemoryUse::kActivation)),
                                static_cast<double>(in_flight[i])};
        std::vector<double> stages(2 * static_cast<size_t>(p));
        MPI_Gather(mine, 2, MPI_DOUBLE, stages.data(), 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        if (me != 0) continue;
        auto med = [&](double StepFigures::*field) {
          std::vector<double> v;
          for (const StepFigures& f : figs[i]) v.push_back(f.*field);
          return bench::median(v);
        };
        const double meas = med(&StepFigures::measured), repl = med(&StepFigures::replayed);
        const double typical = med(&StepFigures::typical);
        const double secs = med(&StepFigures::seconds), imbal = med(&StepFigures::imbalance);
        const double f_stages = med(&StepFigures::stage_formula);
        double pass_ms[3];
        for (int k = 0; k < 3; ++k) {
          std::vector<double> v;
          for (const StepFigures& f : figs[i]) v.push_back(f.pass_ms[k]);
          pass_ms[k] = bench::median(v);
        }
        const pp::Schedule s = scheds[i].s;
        const double ideal = [&] {
          const pp::Plan pl = pp::plan(s, {.stages = p, .chunks = scheds[i].chunks, .micro_batches = m});
          return std::accumulate(pl.bubble.begin(), pl.bubble.end(), 0.0) / p;
        }();
        const double formula = static_cast<double>(p - 1) / static_cast<double>(m + p - 1);
        // f_zb (above), from the mean F, B, W CPU seconds of this schedule's passes (ZB-H1 only).
        const double f_zb = s != pp::Schedule::kZeroBubbleH1 ? 0.0 : [&] {
          const double idle = (p - 1) * (pass_ms[0] + pass_ms[1] - pass_ms[2]);
          return idle / (static_cast<double>(m) * (pass_ms[0] + pass_ms[1] + pass_ms[2]) + idle);
        }();
        // x of the note above (ZB-H1 only), and the largest x with f_zb at most half of the formula.
        const double sum_fbw = pass_ms[0] + pass_ms[1] + pass_ms[2];
        const double zb_x = s == pp::Schedule::kZeroBubbleH1 && sum_fbw > 0 ? (pass_ms[0] + pass_ms[1] - pass_ms[2]) / sum_fbw : 0.0;
        const double zb_x_half = s == pp::Schedule::kZeroBubbleH1 ? static_cast<double>(m) / static_cast<double>(2 * m + p - 1) : 0.0;
        // Each round's replayed bubble over the same round's 1F1B (schedules run in turn within a round).
        std::vector<double> v;
        for (size_t r = 0; r < figs[i].size(); ++r) v.push_back(figs[i][r].replayed / figs[k1][r].replayed);
        const double over_1f1b = bench::median(v);
        const std::string name = pp::schedule_name(s), key = name + "/m" + std::to_string(m);
        std::string per_stage, stage_passes;
        boost::json::array stage_json;
        for (int q = 0; q < p; ++q) {
          const double peak = stages[2 * static_cast<size_t>(q)], held = stages[2 * static_cast<size_t>(q) + 1];
          per_stage += fmt::format(" {:.2f} ({:.0f})", peak / (1 << 20), held);
          double ms[3];  // this stage's mean F, B, W CPU ms, median over rounds
          for (int k = 0; k < 3; ++k) {
            std::vector<double> v;
            for (const StepFigures& f : figs[i]) v.push_back(f.stage_ms[3 * static_cast<size_t>(q) + k]);
            ms[k] = bench::median(v);
          }
          stage_passes += fmt::format(" {:.1f}/{:.1f}/{:.1f}", ms[0], ms[1], ms[2]);
          stage_json.push_back(boost::json::object{
              {"stage", q}, {"peak_activation_bytes", peak}, {"micro_batches_in_flight", held},
              {"pass_cpu_ms", boost::json::object{{"forward", ms[0]}, {"backward", ms[1]}, {"weight", ms[2]}}}});
        }
        std::printf("%-12s %3lld %9.3f %9.3f %9.3f %9.3f %9.3f %8.2f %8.2f %9.2f %9.2f %8.2f %5.1f/%.1f/%.1f %s\n",
                    name.c_str(), static_cast<long long>(m), meas, repl, typical, ideal, formula, meas / formula, repl / formula,
                    over_1f1b, secs * 1e3, imbal, pass_ms[0], pass_ms[1], pass_ms[2], per_stage.c_str());
        std::printf("%-12s %3s %9.3f %9.2f %9.3f %9.2f   per stage F/B/W cpu ms:%s%s\n", "", "", f_stages, repl / f_stages,
                    f_zb, f_zb / formula, stage_passes.c_str(),
                    zb_x > 0 ? fmt::format("; x {:.3f} (0.5x of 1F1B needs <= {:.3f})", zb_x, zb_x_half).c_str() : "");
        std::fflush(stdout);
        report.results.push_back(boost::json::object{
            {"schedule", name}, {"chunks", scheds[i].chunks}, {"pp", p}, {"m", m}, {"measured_bubble", meas},
            {"replayed_bubble", repl}, {"replayed_median_pass_bubble", typical}, {"ideal_bubble", ideal}, {"step_s", secs}, {"pass_imbalance", imbal},
            {"formula_1f1b_measured_stages", f_stages}, {"formula_zb_h1_measured_passes", f_zb},
            {"zb_h1_x", zb_x}, {"zb_h1_x_for_half", zb_x_half},
            {"pass_cpu_ms", boost::json::object{{"forward", pass_ms[0]}, {"backward", pass_ms[1]}, {"weight", pass_ms[2]}}},
            {"stages", std::move(stage_json)}});
        report.baseline[key] = boost::json::object{{"formula_1f1b", formula}};
        ratios[key] = boost::json::object{{"measured_over_formula", meas / formula},
                                          {"replayed_over_formula", repl / formula},
                                          {"replayed_median_pass_over_formula", typical / formula},
                                          {"replayed_over_1f1b", over_1f1b},
                                          {"replayed_over_formula_measured_stages", repl / f_stages},
                                          {"formula_zb_h1_measured_over_formula", f_zb / formula}};
      }
    }
    report.ratio = ratios;
    const std::string path = bench::json_path_arg(argc, argv);
    if (!path.empty() && me == 0) report.write(path);
    return 0;
  } catch (const std::exception& e) {
    comm::World::abort(std::string("pp_bubble_bench: ") + e.what(), 1);
  }
}
