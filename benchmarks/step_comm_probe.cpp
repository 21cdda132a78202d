// Question: what does one collective cost inside a training step on these hosts, by collective and size?
// The cost `zeroshard project --link-costs FILE` charges a collective whose group crosses hosts
// (docs/scaling.md, "Validation"; Note [in-step link costs] in project/project_compute.cpp).
//
//   hosts.sh --hosts 2 --slots 2 --rate 1gbit -- -np 4 build/release/benchmarks/step_comm_probe --json costs.json
//          [--work-us 1000] [--rounds 5] [--min-bytes 64] [--max-mib 1 | --max-bytes N] [--dtype fp32|bf16|fp16]
//          [--beside-compute]
//
// A collective alone (comm_bench) and the same collective inside a step differ: in the step every rank
// computes between collectives, so a peer whose core the scheduler gave to another rank arrives late,
// ranks that share a core take turns, and a rank spinning in a collective takes CPU from one that
// computes. So each round here runs, for every collective (allgather, reduce-scatter, allreduce,
// all-to-all over the world; a point-to-point exchange with the rank on the other half of the world) and every size
// (powers of 4, the full buffer as comm_bench counts it), `--work-us` of CPU time on the calling thread
// (the step's compute between two collectives that wait on its compute thread: benchmarks/
// project_validate.py derives it per layout; its length decides how often the scheduler preempts it)
// and then the collective, timed on each rank from its call to its return. Per collective
// and size the cost is the mean over ranks of each rank's median over `--rounds` rounds (after one
// untimed round): what a rank's step pays per call, the wait for late peers included. The key is the
// bytes the call sends across hosts per rank (the comm counters' rule, Note [Bytes across hosts]), so
// the projection can look a collective up by the bytes it counts for it. The work's wall seconds over
// its CPU seconds (mean over ranks) is the compute's stretch in such a job: the CPU share a rank's
// compute really gets when ranks outnumber the cores and others spin in collectives.
// A call can return while its bytes are still queued in the sender's socket and the link's shaper (the
// receiver has its part, the sender's last bytes are buffered): the next collective then waits for
// them. Each call is therefore followed by a 4-byte all-reduce, timed apart, and the call is charged
// its own time plus that drain's time beyond the drain after the collective's smallest size (where
// nothing is left in flight); the next round's work starts after the drain, as a step's compute starts
// after its collective. (Without it the smallest size, timed right after the previous collective's
// largest, measured 18-87 ms at 100 Mbit/s: the tail of 1 MiB, not its own cost.)
// Where a host's ranks share cores, a rank that reaches a call first waits in it for its host-mates'
// work, which runs on its core meanwhile: time the projection's compute already counts (ranks / cores,
// Note [in-step link costs]). So each call's arrival is exchanged afterwards (outside the timing; ranks
// of one host read one clock) and the wait for the latest host-mate, at most the call's own time, goes to
// "host_wait_seconds" beside "seconds" (the mean over ranks of their medians, as the seconds).
// --dtype: the elements' type, the step's communication dtype (the gradients' and parameters' on the
// wire: `communication_data_type`, by default the compute dtype). It decides the path, not only the
// bytes: an fp32 reduce-scatter or all-reduce is MPI's own (OpenMPI's reduce-scatter over two ranks sent
// the full buffer to one rank and scattered it back: 114 ms for 512 KB across at 100 Mbit/s, where an
// allgather of the same bytes took 34 ms), a bf16 one comm's direct path (an all-to-all of the blocks and
// a local sum, Note [16-bit reductions] in comm/detail/transport_mpi.cpp), whose bytes a step's
// bf16 gradients move. `bytes` stays the buffer's size in bytes (so at bf16 twice the elements).
// --beside-compute: each call is also made the way the engine makes a gradient bucket's reduction with
// overlap_comm (GradReducer): async, run by the World's comm worker thread, while the calling thread
// keeps computing until it completes (backward beside its buckets), timed from the call to its end. On a
// host with fewer cores than a rank's threads the worker's MPI progress and the compute then share a core,
// so the TCP sockets are refilled only when the scheduler runs the worker. Measured at 100 Mbit/s, two
// hosts of one rank with a core each (2026-11-29 18:16-18:19, load 2.4-3.4): a 1 MiB bf16 reduce-scatter
// 48 ms alone, 78 ms beside compute; four 834 KB ones queued back to back 35-40 ms per call with the
// calling thread asleep, 49-55 ms computing (the link's rate: 33 ms). These go to
// "collectives_beside_compute" (the same shape as "collectives", which `--link-costs` reads).
// The JSON: {"probe": "step_comm_probe", "ranks", "hosts", "ranks_per_host", "work_us", "rounds", "dtype",
// "compute_stretch", "collectives": {"allgather": [{"bytes", "inter_host_bytes", "seconds", "drain_seconds",
// "host_wait_seconds"}...], ...} (drain_seconds: of the seconds, the drain's part)
// [, "collectives_beside_compute": {...}]}.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "benchmarks/support/bench_json.h"
#include "comm/comm.h"
#include "memory/dtype.h"
#include "memory/tensor.h"

using namespace zs;

namespace {

// `us` microseconds of this thread's CPU time in arithmetic (wall time: as long as the scheduler makes it).
void work(double us) {
  const double until = thread_cpu_seconds() + us * 1e-6;
  volatile double sink = 0;
  double x = 1.0;
  while (thread_cpu_seconds() < until) {
    for (int i = 0; i < 2000; ++i) x = x * 1.0000001 + 1e-9;
  }
  sink = sink + x;
}

// --beside-compute: CPU time computed between two tests of the async call (how late its end is seen).
constexpr double kBesideChunkUs = 50;

// The mean over the group's ranks of `v` (collective).
double mean_over(const comm::Group& g, double v) {
  auto t = memory::Tensor::empty({1}, memory::DType::kF32);
  t.data<float>()[0] = static_cast<float>(v);
  g.allreduce(t);
  return static_cast<double>(t.data<float>()[0]) / g.size();
}

// Seconds this rank waited in a call for the latest of its host-mates to arrive (0 without host-mates),
// from every rank's arrival `at` (collective over g; outside the call's timing). Ranks of one host read
// one monotonic clock; each arrival travels as whole seconds (exact in fp32) and their fraction (to 0.1 us).
double host_wait(const comm::Group& g, double at) {
  const int n = g.size();
  auto mine = memory::Tensor::empty({2}, memory::DType::kF32);
  auto all = memory::Tensor::empty({2 * static_cast<int64_t>(n)}, memory::DType::kF32);
  const double whole = std::floor(at);
  mine.data<float>()[0] = static_cast<float>(std::fmod(whole, 8388608.0));  // 2^23: exact in fp32
  mine.data<float>()[1] = static_cast<float>(at - whole);
  g.allgather(mine, all);
  const std::vector<int>& host = g.member_hosts();
  if (host.empty()) return 0.0;  // one host: the ranks' waits are the collective's, not a shared core's
  const float* a = all.data<float>();
  const size_t me = static_cast<size_t>(g.rank());
  const double my = static_cast<double>(a[2 * me]) + static_cast<double>(a[2 * me + 1]);
  double wait = 0.0;
  for (size_t j = 0; j < static_cast<size_t>(n); ++j) {
    if (j == me || host[j] != host[me]) continue;
    wait = std::max(wait, static_cast<double>(a[2 * j]) + static_cast<double>(a[2 * j + 1]) - my);
  }
  return wait;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto world = comm::World::create();
    const comm::Group& g = world.group();
    const int n = g.size();
    if (!world.is_mpi() || n < 2) {
      std::fprintf(stderr, "step_comm_probe: run it under mpirun over the hosts, e.g. hosts.sh --hosts 2 --slots 2 -- -np 4 %s\n",
                   argv[0]);
      return 2;
    }
    const double work_us = std::stod(bench::arg_value(argc, argv, "--work-us", "1000"));
    const int rounds = std::max(1, std::stoi(bench::arg_value(argc, argv, "--rounds", "5")));
    const size_t min_bytes = std::stoul(bench::arg_value(argc, argv, "--min-bytes", "64"));
    const std::string max_given = bench::arg_value(argc, argv, "--max-bytes", "");
    const size_t max_bytes = max_given.empty() ? std::stoul(bench::arg_value(argc, argv, "--max-mib", "1")) << 20
                                               : std::stoul(max_given);
    const memory::DType dtype = memory::parse_dtype(bench::arg_value(argc, argv, "--dtype", "fp32"), "--dtype");
    const size_t es = memory::dtype_size(dtype);
    // Every element 1.0 in the probe's dtype (the values do not matter; finite ones keep the sums cheap).
    auto ones = [&](const memory::Tensor& t, size_t elements) {
      if (dtype != memory::DType::kF32) {
        const uint16_t one = dtype == memory::DType::kBF16 ? memory::f32_to_bf16(1.0f) : memory::f32_to_f16(1.0f);
        std::fill_n(static_cast<uint16_t*>(t.raw()), elements, one);
      } else {
        std::fill_n(t.data<float>(), elements, 1.0f);
      }
    };
    // alltoall: an MoE layer's token exchange and ZeRO++'s quantised gradient reduction (both alltoallv in
    // the step, charged by this table).
    const char* names[] = {"allgather", "reduce_scatter", "allreduce", "sendrecv", "alltoall"};
    constexpr int kCollectives = 5;
    std::vector<size_t> sizes;
    for (size_t b = min_bytes; b <= max_bytes; b *= 4) sizes.push_back(b);
    // times[c][s]: this rank's seconds per round; inter[c][s]: its bytes across hosts per call.
    std::vector<std::vector<std::vector<double>>> times(kCollectives, std::vector<std::vector<double>>(sizes.size()));
    std::vector<std::vector<double>> inter(kCollectives, std::vector<double>(sizes.size(), 0.0));
    const int partner = (g.rank() + n / 2) % n;  // n even: the other half of the world (the other host)
    std::vector<std::vector<std::vector<double>>> drains = times, waits = times;
    // --beside-compute: every call also made async beside this thread's compute (see the top).
    const bool beside = bench::has_flag(argc, argv, "--beside-compute");
    std::vector<std::vector<std::vector<double>>> beside_times = times, beside_drains = times;
    auto sync = memory::Tensor::empty({1}, memory::DType::kF32);
    sync.data<float>()[0] = 1.0f;
    double work_wall = 0, work_cpu = 0;
    for (int r = 0; r <= rounds; ++r) {
      for (int c = 0; c < kCollectives; ++c) {
        for (size_t s = 0; s < sizes.size(); ++s) {
          const size_t count = std::max<size_t>(1, sizes[s] / es / static_cast<size_t>(n)) * static_cast<size_t>(n);
          const size_t part = count / static_cast<size_t>(n);
          auto full = memory::Tensor::empty({static_cast<int64_t>(count)}, dtype);
          auto mine = memory::Tensor::empty({static_cast<int64_t>(part)}, dtype);
          auto other = memory::Tensor::empty({static_cast<int64_t>(count)}, dtype);
          ones(full, count);
          ones(mine, part);
          const std::vector<size_t> counts(static_cast<size_t>(n), part);
          const double w0 = bench::now_seconds(), c0 = thread_cpu_seconds();
          work(work_us);
          work_wall += bench::now_seconds() - w0;
          work_cpu += thread_cpu_seconds() - c0;
          const uint64_t inter0 = g.bytes_inter_host();
          const double t0 = bench::now_seconds();
          if (c == 0) g.allgather(mine, full);
          if (c == 1) g.reduce_scatter(full, mine, counts);
          if (c == 2) g.allreduce(full);
          if (c == 3) g.sendrecv(full, partner, other, partner);
          if (c == 4) g.alltoall(full, other);
          const double t = bench::now_seconds() - t0;
          // A 4-byte all-reduce right after: it waits for what the call left in flight (Note above).
          const double d0 = bench::now_seconds();
          g.allreduce(sync);
          const double d = bench::now_seconds() - d0;
          const double across_call = static_cast<double>(g.bytes_inter_host() - inter0);
          const double waited = std::min(t, host_wait(g, t0));
          double tb = 0, db = 0;
          if (beside) {
            work(work_us);
            const double b0 = bench::now_seconds();
            comm::Work w = c == 0 ? g.allgather_async(mine, full)
                         : c == 1 ? g.reduce_scatter_async(full, mine, counts)
                         : c == 2 ? g.allreduce_async(full)
                         : c == 3 ? g.sendrecv_async(full, partner, other, partner)
                                  : g.alltoall_async(full, other);
            do work(kBesideChunkUs); while (!w.test());  // compute beside it, as backward does
            w.wait();
            tb = bench::now_seconds() - b0;
            const double e0 = bench::now_seconds();
            g.allreduce(sync);
            db = bench::now_seconds() - e0;
          }
          if (r == 0) continue;  // the untimed round: connections made, buffers touched
          times[static_cast<size_t>(c)][s].push_back(t);
          drains[static_cast<size_t>(c)][s].push_back(d);
          waits[static_cast<size_t>(c)][s].push_back(waited);
          beside_times[static_cast<size_t>(c)][s].push_back(tb);
          beside_drains[static_cast<size_t>(c)][s].push_back(db);
          inter[static_cast<size_t>(c)][s] = across_call;
        }
      }
    }
    // Per collective and size: the call's own time plus what its bytes still took after it returned: the
    // drain after it beyond the drain after the smallest size (one small collective's own cost).
    using Samples = std::vector<std::vector<std::vector<double>>>;  // [collective][size][round]
    auto table = [&](const Samples& tm, const Samples& dn, const Samples* wt, const char* label) {
      boost::json::object collectives;
      for (int c = 0; c < kCollectives; ++c) {
        boost::json::array rows;
        for (size_t s = 0; s < sizes.size(); ++s) {
          const auto& dr = dn[static_cast<size_t>(c)];
          const double drain = std::max(0.0, bench::median(dr[s]) - bench::median(dr.front()));
          const double secs = mean_over(g, bench::median(tm[static_cast<size_t>(c)][s]) + drain);
          const double across = mean_over(g, inter[static_cast<size_t>(c)][s]);
          const size_t count = std::max<size_t>(1, sizes[s] / es / static_cast<size_t>(n)) * static_cast<size_t>(n);
          // Of the seconds, the drain after the call (its bytes still in flight when it returned).
          boost::json::object row{{"bytes", count * es}, {"inter_host_bytes", across}, {"seconds", secs},
                                  {"drain_seconds", mean_over(g, drain)}};
          const double wait = wt != nullptr ? mean_over(g, bench::median((*wt)[static_cast<size_t>(c)][s])) : 0.0;
          if (wt != nullptr) row["host_wait_seconds"] = wait;
          rows.push_back(std::move(row));
          if (g.rank() == 0) {
            std::printf("%-15s %-15s %10zu bytes, %10.0f across per rank: %10.1f us (drain %.1f us, host-mates %.1f us)\n",
                        label, names[c], count * es, across, secs * 1e6, drain * 1e6, wait * 1e6);
          }
        }
        collectives[names[c]] = std::move(rows);
      }
      return collectives;
    };
    boost::json::object collectives = table(times, drains, &waits, "alone");
    boost::json::object beside_collectives;
    if (beside) beside_collectives = table(beside_times, beside_drains, nullptr, "beside-compute");
    const double stretch = mean_over(g, work_cpu > 0 ? work_wall / work_cpu : 1.0);
    if (g.rank() == 0) std::printf("compute stretch (work wall / CPU seconds, mean over ranks): %.2f\n", stretch);
    const std::string path = bench::json_path_arg(argc, argv);
    if (!path.empty() && g.rank() == 0) {
      const boost::json::object out{{"probe", "step_comm_probe"}, {"ranks", n}, {"hosts", g.hosts()},
                                    {"ranks_per_host", g.host_ranks()}, {"work_us", work_us}, {"rounds", rounds},
                                    {"dtype", memory::dtype_name(dtype)},
                                    {"compute_stretch", stretch}, {"collectives", collectives}};
      boost::json::object doc = out;
      if (beside) doc["collectives_beside_compute"] = std::move(beside_collectives);
      std::ofstream f(path);
      f << boost::json::serialize(doc) << "\n";
      if (!f) throw std::runtime_error("--json: cannot write " + path);
    }
    return 0;
  } catch (const std::exception& e) {
    comm::World::abort(std::string("step_comm_probe: ") + e.what(), 1);
  }
}
