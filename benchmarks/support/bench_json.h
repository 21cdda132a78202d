// Shared output for benchmarks (docs/benchmarks.md): a human table on stdout and, with
// `--json FILE`, one object
//   { "benchmark", "config": {...}, "results": [...], "baseline": {...}, "ratio": ... }.
// A speed claim is always a ratio to a baseline measured in the same run.
#pragma once

#include <boost/json.hpp>

#include <string>
#include <vector>

#include "core/clock.h"

namespace zs::bench {

struct Report {
  std::string benchmark;
  boost::json::object config;
  boost::json::array results;
  boost::json::object baseline;
  boost::json::value ratio;  // a number, or an object of named ratios

  // Writes the JSON object to `path` (throws IoError naming the path).
  void write(const std::string& path) const;
};

// The value after `--json` in argv, or "" when absent.
std::string json_path_arg(int argc, char** argv);
// The value after `name` in argv (e.g. "--sizes"), or `fallback`.
std::string arg_value(int argc, char** argv, const std::string& name, const std::string& fallback);
// Whether the bare flag `name` (e.g. "--no-verify") is in argv.
bool has_flag(int argc, char** argv, const std::string& name);

// Seconds since an arbitrary epoch (steady clock): core's one clock.
using zs::now_seconds;

// CPU seconds this process has run, all its threads (CLOCK_PROCESS_CPUTIME_ID): a step's cost where
// other work shares the cores, and with the wall time how many threads were busy: core's.
using zs::process_cpu_seconds;

// Median of the values (copied; empty -> 0).
double median(std::vector<double> values);

}  // namespace zs::bench
