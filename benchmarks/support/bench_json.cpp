#include "benchmarks/support/bench_json.h"

#include <algorithm>
#include <fstream>

#include "core/errors.h"

namespace zs::bench {

void Report::write(const std::string& path) const {
  boost::json::object o;
  o["benchmark"] = benchmark;
  o["config"] = config;
  o["results"] = results;
  o["baseline"] = baseline;
  o["ratio"] = ratio;
  std::ofstream out(path);
  if (!out) throw IoError(fmt::format("cannot write the benchmark report '{}': check the directory exists and is writable", path));
  out << boost::json::serialize(o) << "\n";
  if (!out) throw IoError(fmt::format("writing the benchmark report '{}' failed", path));
}

std::string arg_value(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (argv[i] == name) return argv[i + 1];
  }
  return fallback;
}

bool has_flag(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i) {
    if (argv[i] == name) return true;
  }
  return false;
}

std::string json_path_arg(int argc, char** argv) { return arg_value(argc, argv, "--json", ""); }

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace zs::bench
