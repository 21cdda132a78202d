// Question: what does MoE's token exchange cost over the raw MPI_Alltoallv of the same bytes?
//
//   mpirun -np 4 --oversubscribe build/release/benchmarks/moe_alltoall_bench [--json out.json]
//          [--min-kib 64] [--max-mib 64] [--reps 15] [--warmup 3] [--d 512] [--experts-per-rank 1]
//
// Per size (bytes this rank sends, powers of 4), rows of --d fp32 features are routed unevenly: rank i
// sends rank j a share proportional to 1 + (i + j) % 3 (every rank also keeps a share), split evenly
// over rank j's --experts-per-rank experts. The calls:
//   raw               MPI_Alltoallv on MPI_COMM_WORLD with precomputed counts (the baseline)
//   alltoallv         zeroshard's Group::alltoallv (handshake, the count-matrix check, counters)
//   alltoallv_agreed  the same with CountCheck::kSkip (counts known to agree): what the MoE layer calls
//   counts            moe::plan_exchange alone: the per-expert row counts, carried by the handshake
//                     (Group::exchange_counts)
//   dispatch          the MoE layer's forward exchange: plan_exchange, then moe::to_experts (the
//                     alltoallv into the arena, without a handshake of its own after the counts; with
//                     several experts per rank, straight into each expert's tensor: Group::alltoallv
//                     with pieces, no regrouping copy on one node's shared-memory path)
// Method as comm_bench: warm-up, then timed repetitions, each call after a barrier, in a rotating
// order that alternates direction; a call's time is the slowest rank's; ratio = median over
// repetitions of raw time / our time (> 1: ours faster). The target (docs/moe.md) is alltoallv and
// dispatch >= 0.95 from 1 MiB.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "benchmarks/support/bench_json.h"
#include "benchmarks/support/bench_mpi.h"
#include "comm/comm.h"
#include "memory/tensor.h"
#include "moe/moe.h"

using namespace zs;

namespace {

using bench::timed_in_world;

// Serves tensors from one preallocated buffer, reset before each call: the engine's arena, not a fresh
// heap block (and its page faults) per call, which the raw baseline does not pay either.
class ArenaContext : public nn::Context {
 public:
  explicit ArenaContext(size_t bytes) : buffer_(memory::Tensor::empty({static_cast<int64_t>(bytes / 4 + 16)}, memory::DType::kF32)) {}
  memory::Tensor allocate(memory::Shape shape, memory::DType dtype, nn::MemoryUse) override {
    const size_t n = static_cast<size_t>(memory::shape_numel(shape));
    if ((used_ + n) * 4 > buffer_.nbytes()) throw std::runtime_error("ArenaContext: out of space");
    memory::Tensor t(buffer_.data<float>() + used_, dtype, std::move(shape));
    used_ += (n + 15) / 16 * 16;
    return t;
  }
  bool training() const override { return true; }
  void reset() { used_ = 0; }

 private:
  memory::Tensor buffer_;
  size_t used_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    auto world = comm::World::create();
    const auto& g = world.group();
    const int n = g.size(), me = g.rank();
    const size_t min_bytes = std::stoul(bench::arg_value(argc, argv, "--min-kib", "64")) << 10;
    const size_t max_bytes = std::stoul(bench::arg_value(argc, argv, "--max-mib", "64")) << 20;
    const int reps = std::stoi(bench::arg_value(argc, argv, "--reps", "15"));
    const int warmup = std::stoi(bench::arg_value(argc, argv, "--warmup", "3"));
    const int64_t d = std::stol(bench::arg_value(argc, argv, "--d", "512"));
    const int local = std::stoi(bench::arg_value(argc, argv, "--experts-per-rank", "1"));
    if (!world.is_mpi()) {
      // Without mpirun MPI is never initialised, and the raw baseline calls MPI directly.
      std::fprintf(stderr, "moe_alltoall_bench: run it under mpirun, e.g. mpirun -np 2 %s (a world of one moves no bytes)\n",
                   argv[0]);
      return 2;
    }
    comm::ExpertGroups groups = world.split_groups(n);  // one EP group of every rank: one expert per rank
    bench::Report report;
    report.benchmark = "moe_alltoall_bench";
    report.config = {{"ranks", n},     {"dtype", "fp32"},   {"features", d},
                     {"reps", reps},   {"warmup", warmup},  {"experts_per_rank", local}};
    boost::json::object ratios;
    if (me == 0) {
      std::printf("moe_alltoall_bench: %d ranks, rows of %ld fp32, %d warm-up + %d alternating reps, medians\n", n,
                  static_cast<long>(d), warmup, reps);
      std::printf("ms (raw / ours, median of per-repetition ratios)\n%10s %10s %18s %18s %18s %18s\n", "bytes", "raw",
                  "alltoallv", "alltoallv_agreed", "counts", "dispatch");
    }
    for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
      // Rows this rank sends to each rank (expert), proportional to 1 + (me + j) % 3.
      const int64_t total_rows = std::max<int64_t>(1, static_cast<int64_t>(bytes / 4) / d);
      int weight_sum = 0;
      for (int j = 0; j < n; ++j) weight_sum += 1 + (me + j) % 3;
      std::vector<int64_t> rows(static_cast<size_t>(n));
      int64_t assigned = 0;
      for (int j = 0; j < n; ++j) {
        rows[static_cast<size_t>(j)] = total_rows * (1 + (me + j) % 3) / weight_sum;
        assigned += rows[static_cast<size_t>(j)];
      }
      rows[0] += total_rows - assigned;
      // Each rank holds --experts-per-rank (L) experts: rank j's rows split evenly over its L experts.
      std::vector<int64_t> expert_rows;
      for (int j = 0; j < n; ++j)
        for (int l = 0; l < local; ++l)
          expert_rows.push_back(rows[static_cast<size_t>(j)] / local + (l == 0 ? rows[static_cast<size_t>(j)] % local : 0));
      ArenaContext ctx(4 * bytes + (1 << 20));
      const moe::ExchangePlan plan = moe::plan_exchange(&groups.ep, expert_rows, d);
      std::vector<int> sc(static_cast<size_t>(n)), sd(static_cast<size_t>(n)), rc(static_cast<size_t>(n)),
          rd(static_cast<size_t>(n));
      for (int j = 0, so = 0, ro = 0; j < n; ++j) {
        sc[static_cast<size_t>(j)] = static_cast<int>(plan.send_counts[static_cast<size_t>(j)]);
        rc[static_cast<size_t>(j)] = static_cast<int>(plan.recv_counts[static_cast<size_t>(j)]);
        sd[static_cast<size_t>(j)] = so;
        rd[static_cast<size_t>(j)] = ro;
        so += sc[static_cast<size_t>(j)];
        ro += rc[static_cast<size_t>(j)];
      }
      memory::Tensor in = memory::Tensor::empty({total_rows, d}, memory::DType::kF32);
      memory::Tensor out = memory::Tensor::empty({plan.rows_received(), d}, memory::DType::kF32);
      for (float& v : in.f32()) v = 1.0f;
      auto raw = [&] {
        MPI_Alltoallv(in.raw(), sc.data(), sd.data(), MPI_FLOAT, out.raw(), rc.data(), rd.data(), MPI_FLOAT,
                      MPI_COMM_WORLD);
      };
      // The calls, each timed in every repetition (rotating start, alternating direction: each sees
      // the machine's load drift alike). "counts" and "a2av_agreed" are the dispatch's two parts.
      struct Call {
        const char* name;
        std::function<void()> f;
        std::vector<double> t, ratio;
      };
      std::vector<Call> calls;
      calls.push_back({"raw", raw, {}, {}});
      calls.push_back({"alltoallv", [&] { groups.ep.alltoallv(in.flatten(), plan.send_counts, out.flatten(), plan.recv_counts); }, {}, {}});
      calls.push_back({"alltoallv_agreed", [&] {
                         groups.ep.alltoallv(in.flatten(), plan.send_counts, out.flatten(), plan.recv_counts,
                                             comm::Group::CountCheck::kSkip);
                       }, {}, {}});
      calls.push_back({"counts", [&] { (void)moe::plan_exchange(&groups.ep, expert_rows, d); }, {}, {}});
      calls.push_back({"dispatch", [&] {
                         ctx.reset();
                         const moe::ExchangePlan p = moe::plan_exchange(&groups.ep, expert_rows, d);
                         auto per_expert = moe::to_experts(ctx, &groups.ep, p, in, nn::MemoryUse::kScratch);
                       }, {}, {}});
      const size_t k = calls.size();
      for (int r = 0; r < warmup; ++r)
        for (Call& c : calls) timed_in_world(c.f);
      for (int r = 0; r < reps; ++r) {
        std::vector<double> t(k);
        for (size_t i = 0; i < k; ++i) {
          const size_t at = (static_cast<size_t>(r) + (r % 2 == 0 ? i : k - i)) % k;
          t[at] = timed_in_world(calls[at].f);
        }
        for (size_t i = 0; i < k; ++i) calls[i].t.push_back(t[i]), calls[i].ratio.push_back(t[0] / t[i]);
      }
      const size_t sent = static_cast<size_t>(total_rows * d * 4);
      const std::string key = std::to_string(sent);
      boost::json::object row{{"bytes", sent}};
      if (me == 0) std::printf("%10zu", sent);
      for (size_t i = 0; i < k; ++i) {
        const double tm = bench::median(calls[i].t), rt = bench::median(calls[i].ratio);
        if (me == 0) std::printf(i == 0 ? " %10.3f" : " %10.3f (%5.3f)", tm * 1e3, rt);
        if (i == 0) {
          report.baseline[key] = boost::json::object{{"mpi_alltoallv_s", tm}};
          continue;
        }
        row[std::string(calls[i].name) + "_s"] = tm;
        row[std::string(calls[i].name) + "_ratio"] = rt;
        if (std::string_view(calls[i].name) != "counts") ratios[std::string(calls[i].name) + "/" + key] = rt;
      }
      if (me == 0) {
        std::printf("\n");
        std::fflush(stdout);
      }
      report.results.push_back(row);
    }
    report.ratio = ratios;
    const std::string path = bench::json_path_arg(argc, argv);
    if (!path.empty() && me == 0) report.write(path);
    return 0;
  } catch (const std::exception& e) {
    comm::World::abort(std::string("moe_alltoall_bench: ") + e.what(), 1);
  }
}
