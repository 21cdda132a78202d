// Stage partitioning: which contiguous run of a model's layers each pipeline stage holds.
//
//   std::vector<int64_t> cost = {...};               // one entry per layer (parameter elements)
//   auto bounds = pp::partition({.method = pp::PartitionMethod::kParameters}, cost, /*stages=*/4);
//   // stage s holds layers [bounds[s], bounds[s + 1]); bounds.front() == 0, bounds.back() == layers
//
// Methods (DeepSpeed's partition_method names, and one of ours): "parameters" balances the parameter
// count (the largest stage as small as possible, every stage at least one layer), "compute" balances
// the layers' training compute the same way (the caller's cost: pp::gpt_partition gives FLOPs, the
// first stage's embedding and the last stage's head and loss included: Note [compute partition] in
// pp/gpt.cpp), "uniform" gives every stage layers / stages layers (the first layers % stages stages
// one more), "explicit" takes the boundaries as given. Errors (ConfigError) name
// model.pipeline_parallel_size and the pipeline keys.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace zs::pp {

enum class PartitionMethod { kParameters, kCompute, kUniform, kExplicit };

// "parameters", "compute", "uniform", "explicit"; parse throws ConfigError naming pipeline.partition_method.
std::string partition_method_name(PartitionMethod m);
PartitionMethod parse_partition_method(const std::string& name);

struct PartitionConfig {
  PartitionMethod method = PartitionMethod::kParameters;  // pipeline.partition_method
  // kExplicit: stages + 1 increasing layer indices from 0 to the layer count (pipeline.partition_boundaries).
  std::vector<int64_t> boundaries = {};
};

// Stage boundaries (stages + 1 entries) over layers with the given costs (one per layer, >= 0; used by
// kParameters and kCompute, which balance them alike: what the cost measures is the caller's). Throws ConfigError for stages < 1, more stages than layers, or bad explicit boundaries.
std::vector<int64_t> partition(const PartitionConfig& cfg, std::span<const int64_t> layer_cost, int stages);

}  // namespace zs::pp
