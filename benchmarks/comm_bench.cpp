// Question: how fast are zeroshard's collectives against the raw MPI calls on the same buffers? fp32
// allreduce, reduce-scatter, allgather and allgather in place (each rank's block already in the output,
// as ZeRO's bucket gathers call it: raw OpenMPI with MPI_IN_PLACE) and broadcast from rank 0, 1 KiB .. 64 MiB
// (--min-bytes: from fewer bytes, e.g. 16, for the small collectives; comm/detail/small.h). Three paths per size: raw OpenMPI
// (MPI_Allreduce / MPI_Reduce_scatter_block / MPI_Allgather / MPI_Bcast), zeroshard as configured (comm.shared_memory
// "auto": on one node, the shared-memory collectives of comm/detail/shm.h) and zeroshard with
// comm.shared_memory = false (OpenMPI's collectives behind the layer: what the layer itself costs).
//
//   mpirun -np 4 --oversubscribe build/release/benchmarks/comm_bench [--json out.json]
//          [--min-kib 1 | --min-bytes 16] [--max-mib 64 | --max-bytes 4096] [--reps 15] [--warmup 3] [--arena 1]
//          [--burst 1] [--collective allreduce] [--fresh 1]
//   mpirun -np 1 valgrind --tool=callgrind build/release/benchmarks/comm_bench --calls 20000 --collective allreduce
//          --min-bytes 16 : -np 1 build/release/benchmarks/comm_bench --calls 20000 --collective allreduce --min-bytes 16
//
// --burst N: each timed path makes N back-to-back calls per round, its time divided by N (a step's
// run of small collectives rather than one call after a barrier). The header line gives the round
// trip of one cache line between ranks 0 and 1 (line_round_trip_ns): the small sizes' unit of cost.
// --fresh 1: before each timed call (untimed) every rank rewrites the buffers that path reads, as a
// backward pass writes the gradients it then reduces; without it a path finds its buffers as its
// previous call left them (for the direct allreduce, each rank's sub-slice in its own cache).
// --calls N: no timing; N back-to-back sync calls of zeroshard's --collective at --min-bytes (the
// per-call cost under callgrind: Group::<collective> inclusive / N; Note [Small collectives]).
//
// Sizes are the full buffer (allreduce data, reduce-scatter input, allgather output), powers of 4.
// Method (fair on a shared, noisy machine): per size `--warmup` untimed rounds, then `--reps` timed
// rounds; each runs the three paths and the copy bound back to back, each after a barrier, in rotating
// order so none always inherits another's cache or scheduling state. A call's time is the slowest rank's. The
// table shows the medians, the paired ratios (median over reps of raw time / zeroshard time, so drift
// between reps cancels; `ratio` for the configured path, `mpi_ratio` for the layer over OpenMPI) and
// the noise (the largest interquartile range of the three paths, relative to its median).
// Bandwidths follow NCCL-tests: algbw = bytes / time; busbw = algbw * 2(n-1)/n (allreduce) or
// algbw * (n-1)/n (reduce-scatter, allgather) or algbw (broadcast). ratio > 1: zeroshard faster.
// Copy bound (`copy_us`, timed in the same rotation): every rank at once memcpy's the bytes it must
// receive (busbw's bytes: B(n-1)/n, or 2B(n-1)/n for allreduce) between two private buffers of its
// own; copy_us is the fastest of the reps (a bound, not a typical time). A collective on one node cannot
// move its data faster than that (a reduction also reads its own part); `raw/copy` and `zs/copy` say
// how many copy times each path's median takes.
// Placement (`--arena 1`, the default): zeroshard's buffers lie in a registered shared arena
// (comm/shared_arena.h), as the engine places them with comm.shared_arena, so on one node its
// collectives read the peers' buffers directly (Note [Direct collectives] in comm/detail/shm_direct.h);
// `--arena 0` puts them in ordinary memory (the staged shared-memory path). Raw OpenMPI and zs_mpi
// always use ordinary memory.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "benchmarks/support/bench_json.h"
#include "benchmarks/support/bench_mpi.h"
#include "comm/comm.h"
#include "core/spin.h"
#include "memory/tensor.h"

using namespace zs;

namespace {

using bench::timed_in_world;

// Interquartile range / median (0 for fewer than 4 values).
double rel_iqr(std::vector<double> v) {
  if (v.size() < 4) return 0;
  std::sort(v.begin(), v.end());
  const double q1 = v[v.size() / 4], q3 = v[(3 * v.size()) / 4], m = bench::median(v);
  return m > 0 ? (q3 - q1) / m : 0;
}

// The cross-core round trip of one cache line between world ranks 0 and 1 (median of 2,000
// ping-pongs through an MPI-3 shared window, in ns; 0 unless every rank is on one node): what a small
// collective's exchange pays a few times per call, and what moves with where the host places the
// cores (Note [Small path's waits] in comm/detail/small.h). Collective over the world.
double line_round_trip_ns() {
  int world = 0, size = 0, node_size = 0, node_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world, MPI_INFO_NULL, &node);
  MPI_Comm_size(node, &node_size);
  MPI_Comm_rank(node, &node_rank);
  int one_node = node_size == size ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &one_node, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  double ns = 0;
  if (one_node && size >= 2) {
    std::atomic<uint64_t>* base = nullptr;
    MPI_Win win = MPI_WIN_NULL;
    MPI_Win_allocate_shared(node_rank == 0 ? 128 : 0, 64, MPI_INFO_NULL, node, &base, &win);
    MPI_Aint bytes = 0;
    int unit = 0;
    MPI_Win_shared_query(win, 0, &bytes, &unit, &base);
    std::atomic<uint64_t>& ping = base[0];
    std::atomic<uint64_t>& pong = base[8];  // the next cache line
    ping.store(0);
    pong.store(0);
    MPI_Barrier(node);
    constexpr uint64_t kTrips = 2000;
    std::vector<double> trips;
    for (uint64_t i = 1; i <= kTrips && node_rank < 2; ++i) {
      if (node_rank == 0) {
        const double t0 = bench::now_seconds();
        ping.store(i, std::memory_order_release);
        while (pong.load(std::memory_order_acquire) != i) zs::cpu_relax();
        trips.push_back((bench::now_seconds() - t0) * 1e9);
      } else {
        while (ping.load(std::memory_order_acquire) != i) zs::cpu_relax();
        pong.store(i, std::memory_order_release);
      }
    }
    MPI_Barrier(node);
    MPI_Win_free(&win);
    ns = node_rank == 0 ? bench::median(trips) : 0;
  }
  MPI_Comm_free(&node);
  MPI_Bcast(&ns, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return ns;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto world = comm::World::create();
    const auto& g = world.group();
    comm::CommConfig off = world.config();
    off.shared_memory = comm::SharedMemory::kOff;
    const comm::Group g_mpi = g.dup("world_mpi", off);
    const int n = g.size();
    const size_t max_bytes = bench::arg_value(argc, argv, "--max-bytes", "").empty()
                                 ? std::stoul(bench::arg_value(argc, argv, "--max-mib", "64")) << 20
                                 : std::stoul(bench::arg_value(argc, argv, "--max-bytes", ""));
    const size_t min_bytes = bench::arg_value(argc, argv, "--min-bytes", "").empty()
                                 ? std::stoul(bench::arg_value(argc, argv, "--min-kib", "1")) << 10
                                 : std::stoul(bench::arg_value(argc, argv, "--min-bytes", ""));
    const int reps = std::stoi(bench::arg_value(argc, argv, "--reps", "15"));
    const int warmup = std::stoi(bench::arg_value(argc, argv, "--warmup", "3"));
    const bool use_arena = bench::arg_value(argc, argv, "--arena", "1") != "0";
    // One mapping holds zeroshard's full buffer and its part at the largest size.
    memory::SharedMapping mapping;
    comm::SharedArena arena;
    if (use_arena) {
      mapping = memory::SharedMapping::create(max_bytes + max_bytes / static_cast<size_t>(n) + 4096);
      arena = comm::SharedArena(g, &mapping);
      if (g.rank() == 0 && !arena.active()) std::printf("comm_bench: shared arena inactive: %s\n", arena.inactive_reason().c_str());
    }
    if (!world.is_mpi()) {
      // Without mpirun MPI is never initialised, and the raw baselines call MPI directly.
      std::fprintf(stderr, "comm_bench: run it under mpirun, e.g. mpirun -np 2 %s (a world of one moves no bytes)\n",
                   argv[0]);
      return 2;
    }
    const bool fresh = bench::arg_value(argc, argv, "--fresh", "0") != "0";
    const double round_trip_ns = line_round_trip_ns();
    bench::Report report;
    report.benchmark = "comm_bench";
    report.config = {{"ranks", n}, {"dtype", "fp32"}, {"reps", reps}, {"warmup", warmup},
                     {"max_bytes", max_bytes}, {"shared_memory", "auto"},
                     {"arena", arena.active()}, {"line_round_trip_ns", round_trip_ns},
                     {"fresh", fresh}};
    boost::json::object ratios;
    if (g.rank() == 0) {
      std::printf("comm_bench: %d ranks, fp32, %d warm-up + %d rotating rounds, medians (busbw in GB/s), zeroshard's "
                  "buffers in %s; a cache line's round trip between ranks 0 and 1: %.0f ns\n", n, warmup, reps,
                  arena.active() ? "the shared arena (direct path)" : "ordinary memory", round_trip_ns);
      std::printf("%-15s %10s %10s %10s %10s %10s %10s %10s %8s %9s %8s %8s %7s\n", "collective", "bytes", "raw_us",
                  "zs_us", "zs_mpi_us", "copy_us", "raw_busbw", "zs_busbw", "ratio", "mpi_ratio", "raw/copy", "zs/copy",
                  "noise%");
    }
    const char* names[] = {"allreduce", "reduce_scatter", "allgather", "allgather_inplace", "broadcast"};
    const int calls = std::stoi(bench::arg_value(argc, argv, "--calls", "0"));
    const int burst = std::max(1, std::stoi(bench::arg_value(argc, argv, "--burst", "1")));
    const std::string only = bench::arg_value(argc, argv, "--collective", "");
    for (int c = 0; c < 5; ++c) {
      if (!only.empty() && only != names[c]) continue;
      for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
        const size_t count = bytes / 4 / static_cast<size_t>(n) * static_cast<size_t>(n);  // divisible by n
        const size_t part = count / static_cast<size_t>(n);
        auto full = memory::Tensor::empty({static_cast<int64_t>(count)}, memory::DType::kF32);
        auto mine = memory::Tensor::empty({static_cast<int64_t>(part)}, memory::DType::kF32);
        for (size_t i = 0; i < count; ++i) full.data<float>()[i] = 1.0f;
        std::vector<size_t> counts(static_cast<size_t>(n), part);
        // zeroshard's own buffers: in the shared arena (same values), or the ones raw OpenMPI uses.
        memory::Tensor zfull = full, zmine = mine;
        if (arena.active()) {
          auto* base = static_cast<unsigned char*>(mapping.data());
          zfull = memory::Tensor(base, memory::DType::kF32, {static_cast<int64_t>(count)});
          zmine = memory::Tensor(base + (count * 4 + 4095) / 4096 * 4096, memory::DType::kF32, {static_cast<int64_t>(part)});
          std::memcpy(zfull.raw(), full.raw(), count * 4);
          std::memset(zmine.raw(), 0, part * 4);
        }
        // What each rank must receive (broadcast: a non-root rank, the whole buffer).
        const size_t copy_bytes = c == 4 ? count * 4 : (c == 0 ? 2 : 1) * (count - part) * 4;
        std::vector<unsigned char> copy_src(copy_bytes, 1), copy_dst(copy_bytes, 0);
        auto copy = [&] { std::memcpy(copy_dst.data(), copy_src.data(), copy_bytes); };
        const int icount = static_cast<int>(count), ipart = static_cast<int>(part);
        auto raw = [&] {
          if (c == 0) MPI_Allreduce(MPI_IN_PLACE, full.raw(), icount, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
          if (c == 1) MPI_Reduce_scatter_block(full.raw(), mine.raw(), ipart, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
          if (c == 2) MPI_Allgather(mine.raw(), ipart, MPI_FLOAT, full.raw(), ipart, MPI_FLOAT, MPI_COMM_WORLD);
          if (c == 3) MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, full.raw(), ipart, MPI_FLOAT, MPI_COMM_WORLD);
          if (c == 4) MPI_Bcast(full.raw(), icount, MPI_FLOAT, 0, MPI_COMM_WORLD);
        };
        const memory::ShardRange own{static_cast<size_t>(g.rank()) * part, part};
        auto on = [&](const comm::Group& grp, const memory::Tensor& f, const memory::Tensor& m) {
          return [&grp, &f, &m, &counts, &own, c] {
            if (c == 0) grp.allreduce(f);
            if (c == 1) grp.reduce_scatter(f, m, counts);
            if (c == 2) grp.allgather(m, f);
            if (c == 3) grp.allgather(f.range(own), f);  // in place: the own block is already there
            if (c == 4) grp.broadcast(f, 0);
          };
        };
        // --burst N: each timed path runs N back-to-back calls (a step's run of small collectives), timed per call.
        auto bursts = [burst](auto f) {
          return [f, burst] {
            for (int i = 0; i < burst; ++i) f();
          };
        };
        auto ours = bursts(on(g, zfull, zmine));
        auto ours_mpi = bursts(on(g_mpi, full, mine));
        auto raw_n = bursts(raw);
        // --fresh: the path's buffers rewritten by this rank before its timed call.
        auto rewrite = [fresh](const memory::Tensor& f, const memory::Tensor& m) {
          if (!fresh) return;
          std::fill_n(f.data<float>(), f.numel(), 1.0f);
          std::fill_n(m.data<float>(), m.numel(), 1.0f);
        };
        if (calls > 0) {  // --calls: the profiling loop, one size
          for (int i = 0; i < calls; ++i) ours();
          break;
        }
        for (int r = 0; r < warmup; ++r) {
          timed_in_world(raw_n);
          timed_in_world(ours);
          timed_in_world(ours_mpi);
          timed_in_world(copy);
        }
        std::vector<double> t_raw, t_ours, t_mpi, t_copy, paired, paired_mpi;
        for (int r = 0; r < reps; ++r) {
          double a = 0, z = 0, zm = 0, cp = 0;
          for (int k = 0; k < 4; ++k) {  // rotate the order: raw first, then ours first, then ours_mpi, copy
            switch ((r + k) % 4) {
              case 0: rewrite(full, mine), a = timed_in_world(raw_n) / burst; break;
              case 1: rewrite(zfull, zmine), z = timed_in_world(ours) / burst; break;
              case 2: rewrite(full, mine), zm = timed_in_world(ours_mpi) / burst; break;
              default: cp = timed_in_world(copy); break;
            }
          }
          t_copy.push_back(cp);
          t_raw.push_back(a);
          t_ours.push_back(z);
          t_mpi.push_back(zm);
          paired.push_back(a / z);
          paired_mpi.push_back(a / zm);
        }
        const double tr = bench::median(t_raw), to = bench::median(t_ours), tm = bench::median(t_mpi);
        const double tc = *std::min_element(t_copy.begin(), t_copy.end());  // the bound: the best copy
        const double noise = std::max({rel_iqr(t_raw), rel_iqr(t_ours), rel_iqr(t_mpi)});
        const double b = static_cast<double>(count) * 4;
        const double factor = c == 0 ? 2.0 * (n - 1) / n : c == 4 ? 1.0 : 1.0 * (n - 1) / n;
        const double raw_bus = b / tr * factor / 1e9, ours_bus = b / to * factor / 1e9;
        const double ratio = bench::median(paired), mpi_ratio = bench::median(paired_mpi);
        if (g.rank() == 0) {
          std::printf("%-15s %10zu %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %8.3f %9.3f %8.2f %8.2f %7.0f\n", names[c],
                      count * 4, tr * 1e6, to * 1e6, tm * 1e6, tc * 1e6, raw_bus, ours_bus, ratio, mpi_ratio, tr / tc,
                      to / tc, noise * 100);
          std::fflush(stdout);
        }
        report.results.push_back(boost::json::object{{"collective", names[c]}, {"bytes", count * 4},
                                                      {"time_s", to}, {"algbw_gbps", b / to / 1e9},
                                                      {"busbw_gbps", ours_bus}, {"ratio", ratio},
                                                      {"zs_mpi_time_s", tm}, {"mpi_ratio", mpi_ratio},
                                                      {"copy_time_s", tc}, {"noise", noise}});
        report.baseline[std::string(names[c]) + "/" + std::to_string(count * 4)] =
            boost::json::object{{"time_s", tr}, {"algbw_gbps", b / tr / 1e9}, {"busbw_gbps", raw_bus}};
        ratios[std::string(names[c]) + "/" + std::to_string(count * 4)] = ratio;
      }
    }
    report.ratio = ratios;
    const std::string path = bench::json_path_arg(argc, argv);
    if (!path.empty() && g.rank() == 0) report.write(path);
    return 0;
  } catch (const std::exception& e) {
    comm::World::abort(std::string("comm_bench: ") + e.what(), 1);
  }
}
