#include "pp/partition.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/errors.h"

namespace zs::pp {

std::string partition_method_name(PartitionMethod m) {
  switch (m) {
    case PartitionMethod::kParameters: return "parameters";
    case PartitionMethod::kCompute: return "compute";
    case PartitionMethod::kUniform: return "uniform";
    case PartitionMethod::kExplicit: return "explicit";
  }
  return "?";
}

PartitionMethod parse_partition_method(const std::string& name) {
  for (auto m : {PartitionMethod::kParameters, PartitionMethod::kCompute, PartitionMethod::kUniform,
                 PartitionMethod::kExplicit}) {
    if (partition_method_name(m) == name) return m;
  }
  throw ConfigError(fmt::format("pipeline.partition_method: \"{}\" is not a method; use \"parameters\", \"compute\", "
                                "\"uniform\" or \"explicit\" (with pipeline.partition_boundaries)",
                                name));
}

namespace {

// Greedy: the fewest stages whose every stage costs at most `cap` (a layer above cap: too many).
int64_t stages_needed(std::span<const int64_t> cost, int64_t cap) {
  int64_t stages = 1, load = 0;
  for (int64_t c : cost) {
    if (c > cap) return INT64_MAX;
    if (load + c > cap) {
      ++stages;
      load = 0;
    }
    load += c;
  }
  return stages;
}

// Note [balanced partition]
// The smallest cap with a greedy fill in at most `stages` stages (binary search: stages_needed is
// monotone in cap), then boundaries from a greedy fill at that cap that also leaves at least one layer
// for every later stage, so no stage is empty; a stage then never exceeds the cap.
std::vector<int64_t> balanced(std::span<const int64_t> cost, int stages) {
  const int64_t n = static_cast<int64_t>(cost.size());
  int64_t lo = *std::max_element(cost.begin(), cost.end()), hi = std::accumulate(cost.begin(), cost.end(), int64_t{0});
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (stages_needed(cost, mid) <= stages) hi = mid; else lo = mid + 1;
  }
  std::vector<int64_t> b{0};
  int64_t load = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t left_stages = stages - static_cast<int64_t>(b.size());  // stages after the current one
    const bool must_cut = n - i == left_stages;                           // one layer per remaining stage
    if (i > b.back() && (must_cut || load + cost[static_cast<size_t>(i)] > lo) && left_stages > 0) {
      b.push_back(i);
      load = 0;
    }
    load += cost[static_cast<size_t>(i)];
  }
  b.push_back(n);
  return b;
}

}  // namespace

std::vector<int64_t> partition(const PartitionConfig& cfg, std::span<const int64_t> layer_cost, int stages) {
  const int64_t n = static_cast<int64_t>(layer_cost.size());
  if (stages < 1) {
    throw ConfigError(fmt::format("model.pipeline_parallel_size: must be a positive integer, got {}", stages));
  }
  if (stages > n) {
    throw ConfigError(fmt::format("model.pipeline_parallel_size: {} stages (times model.virtual_pipeline_size chunks) "
                                  "for a model of {} layers; every stage needs at least one layer: use at most {} "
                                  "stages or more layers",
                                  stages, n, n));
  }
  std::vector<int64_t> b;
  switch (cfg.method) {
    case PartitionMethod::kUniform:
      b.push_back(0);
      for (int s = 0; s < stages; ++s) b.push_back(b.back() + n / stages + (s < n % stages ? 1 : 0));
      return b;
    case PartitionMethod::kParameters:
    case PartitionMethod::kCompute:
      for (int64_t c : layer_cost) {
        if (c < 0) throw UsageError(fmt::format("pp::partition: negative layer cost {}", c));
      }
      return balanced(layer_cost, stages);
    case PartitionMethod::kExplicit: {
      const auto& e = cfg.boundaries;
      bool ok = static_cast<int>(e.size()) == stages + 1 && e.front() == 0 && e.back() == n;
      for (size_t i = 1; ok && i < e.size(); ++i) ok = e[i] > e[i - 1];
      if (!ok) {
        throw ConfigError(fmt::format("pipeline.partition_boundaries: [{}] must be {} increasing layer indices from 0 "
                                      "to {} (model.pipeline_parallel_size = {} stages, each at least one layer)",
                                      fmt::join(e, ", "), stages + 1, n, stages));
      }
      return e;
    }
  }
  return b;
}

}  // namespace zs::pp
