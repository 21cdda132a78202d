// Question: on the allocation sequences of real runs, how much memory does each placement policy
// reserve beyond what is live, and how small an arena can each run in?
//
// Every `*.trace` under --trace-dir (memory/alloc_trace.h; `device.alloc_trace` records them,
// benchmarks/alloc_frag.sh records a set) is replayed into four policies:
//   lifetime_pools      ours: TwoEndedBestFit, the device arena's policy (memory/alloc_policy.h)
//   caching             a model of PyTorch's CUDA caching allocator (memory/caching_policy.h), the baseline
//   caching_expandable  the same with expandable_segments:True
//   best_fit            one best-fit pool, lifetimes mixed (SinglePoolBestFit)
// Per (trace, policy): peak_allocated_bytes - the peak of live requested bytes, the same for every
// policy, so rounding and unsplit remainders count against the policy that makes them;
// peak_reserved_bytes with an unlimited arena; fragmentation = 1 - peak allocated / peak reserved; and
// min_capacity_bytes, the smallest arena capacity (bisected to 64 bytes) in which the whole trace
// replays without a failed allocation - for the caching models with PyTorch's free-and-retry on a
// failed segment allocation.
//
//   alloc_frag_bench --trace-dir DIR [--max-split-mb N (>= 20; PyTorch's max_split_size_mb)] [--json FILE]
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/support/bench_args.h"
#include "benchmarks/support/bench_json.h"
#include "core/errors.h"
#include "memory/alloc_policy.h"
#include "memory/alloc_trace.h"
#include "memory/caching_policy.h"

namespace {

using namespace zs::memory;

constexpr size_t kUnlimited = size_t{1} << 46;  // an arena no trace reaches (64 TiB)

struct Policy {
  std::string name;
  std::function<std::unique_ptr<AllocatorPolicy>(size_t capacity)> make;
};

bool fits(const AllocTrace& trace, const Policy& p, size_t capacity) {
  auto policy = p.make(capacity);
  return replay(trace, *policy).failed_allocs == 0;
}

// The smallest capacity that replays `trace` without failure, between the peak of requested bytes
// (nothing fits below it) and `upper`, a capacity known to fit.
size_t min_capacity(const AllocTrace& trace, const Policy& p, size_t requested_peak, size_t upper) {
  while (!fits(trace, p, upper)) upper *= 2;  // not expected: the unlimited peak fits by construction
  size_t lo = requested_peak > 0 ? requested_peak - 1 : 0;  // fails (or is the trivial 0)
  size_t hi = upper;
  while (hi - lo > kAllocAlignment) {
    size_t mid = lo + (hi - lo) / 2;
    (fits(trace, p, mid) ? hi : lo) = mid;
  }
  return hi;
}

double mib(size_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace

int main(int argc, char** argv) try {
  const std::string dir = zs::bench::arg_value(argc, argv, "--trace-dir", "");
  if (dir.empty()) throw zs::ConfigError("--trace-dir DIR is required: a directory of *.trace files (device.alloc_trace)");
  const int64_t max_split_mb = zs::bench::int_arg(argc, argv, "--max-split-mb", 0, 0);  // 0: unlimited
  std::vector<std::filesystem::path> paths;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".trace") paths.push_back(entry.path());
  }
  std::sort(paths.begin(), paths.end());
  if (paths.empty()) throw zs::ConfigError("--trace-dir '" + dir + "' holds no *.trace file");

  CachingOptions plain;
  if (max_split_mb > 0) plain.max_split_size = static_cast<size_t>(max_split_mb) << 20;
  CachingOptions expandable = plain;
  expandable.expandable_segments = true;
  const std::vector<Policy> policies = {
      {"lifetime_pools", [](size_t c) { return std::make_unique<TwoEndedBestFit>(c); }},
      {"caching", [plain](size_t c) { return std::make_unique<CachingAllocatorModel>(c, plain); }},
      {"caching_expandable", [expandable](size_t c) { return std::make_unique<CachingAllocatorModel>(c, expandable); }},
      {"best_fit", [](size_t c) { return std::make_unique<SinglePoolBestFit>(c); }},
  };

  zs::bench::Report report;
  report.benchmark = "alloc_frag_bench";
  boost::json::array trace_names;
  double worst_ours_ratio = 0.0, worst_capacity_vs_caching = 0.0;
  std::printf("%-24s %-19s %8s %12s %12s %8s %13s\n", "trace", "policy", "events", "alloc MiB", "reserved MiB", "frag",
              "min cap MiB");
  for (const auto& path : paths) {
    const std::string name = path.stem().string();
    trace_names.push_back(boost::json::value(name));
    const AllocTrace trace = load_trace(path.string());
    size_t ours_capacity = 0, caching_capacity = 0;
    for (const Policy& p : policies) {
      auto unlimited = p.make(kUnlimited);
      ReplayResult r = replay(trace, *unlimited);
      if (r.failed_allocs != 0) throw zs::InternalError(name + ": " + p.name + " failed with an unlimited arena");
      const size_t allocated = r.peak_requested_bytes;
      const size_t reserved = r.peak_reserved_bytes;
      const size_t capacity = min_capacity(trace, p, allocated, reserved);
      const double frag = reserved ? 1.0 - static_cast<double>(allocated) / static_cast<double>(reserved) : 0.0;
      std::printf("%-24s %-19s %8zu %12.1f %12.1f %8.4f %13.1f\n", name.c_str(), p.name.c_str(), trace.events.size(),
                  mib(allocated), mib(reserved), frag, mib(capacity));
      std::fflush(stdout);
      boost::json::object row;
      row["trace"] = name;
      row["policy"] = p.name;
      row["events"] = trace.events.size();
      row["peak_allocated_bytes"] = allocated;
      row["peak_reserved_bytes"] = reserved;
      row["fragmentation"] = frag;
      row["reserved_over_allocated"] = allocated ? static_cast<double>(reserved) / static_cast<double>(allocated) : 0.0;
      row["min_capacity_bytes"] = capacity;
      report.results.push_back(std::move(row));
      if (p.name == "lifetime_pools") {
        ours_capacity = capacity;
        worst_ours_ratio = std::max(worst_ours_ratio, allocated ? static_cast<double>(reserved) / allocated : 0.0);
      }
      if (p.name == "caching") caching_capacity = capacity;
    }
    worst_capacity_vs_caching =
        std::max(worst_capacity_vs_caching, static_cast<double>(ours_capacity) / static_cast<double>(caching_capacity));
  }
  report.config["traces"] = trace_names;
  report.config["max_split_size_mb"] = max_split_mb > 0 ? boost::json::value(max_split_mb) : boost::json::value(nullptr);
  report.baseline["policy"] = "caching";
  report.baseline["what"] = "a model of PyTorch's CUDA caching allocator replaying the same traces";
  boost::json::object ratio;
  ratio["max_lifetime_pools_reserved_over_allocated"] = worst_ours_ratio;
  ratio["max_lifetime_pools_min_capacity_over_caching"] = worst_capacity_vs_caching;
  report.ratio = ratio;
  std::printf("lifetime_pools: worst reserved/allocated %.4f (target <= 1.05); worst min capacity / caching's %.4f "
              "(target < 1)\n", worst_ours_ratio, worst_capacity_vs_caching);
  const std::string json = zs::bench::json_path_arg(argc, argv);
  if (!json.empty()) report.write(json);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "alloc_frag_bench: %s\n", e.what());
  return 1;
}
