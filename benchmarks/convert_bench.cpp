// Question: how fast are the fp32 <-> bf16 / fp16 conversions, per instruction set, compared with
// memcpy on this machine?
//
// For each source size, each direction and each ISA the CPU supports, one thread converts a source
// buffer into a destination buffer; GB/s counts bytes read + written (src + dst). The baseline is
// memcpy of the source buffer into a buffer of the same size (2 x src bytes moved), timed in the same
// run at the same size. Each point is the median of several repetitions after a warm-up pass (which
// also faults the pages in).
//
//   convert_bench [--sizes 64K,1M,16M,256M] [--isa scalar|avx2|avx512] [--json FILE]
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "benchmarks/support/bench_json.h"
#include "core/errors.h"
#include "memory/cpu_features.h"
#include "memory/dtype.h"

namespace {

using zs::bench::now_seconds;
using namespace zs::memory;

size_t parse_size(const std::string& s) {
  size_t pos = 0;
  unsigned long long v = std::stoull(s, &pos);
  std::string unit = s.substr(pos);
  if (unit == "K" || unit == "KiB") return v << 10;
  if (unit == "M" || unit == "MiB") return v << 20;
  if (unit == "G" || unit == "GiB") return v << 30;
  if (unit.empty()) return v;
  throw zs::ConfigError("--sizes: unknown unit in '" + s + "'; use e.g. 64K, 16M, 1G");
}

std::vector<size_t> parse_sizes(const std::string& list) {
  std::vector<size_t> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    std::string item = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) out.push_back(parse_size(item));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (out.empty()) throw zs::ConfigError("--sizes: expected a comma-separated list such as 64K,1M,16M,256M");
  return out;
}

std::string human(size_t bytes) {
  if (bytes >= (1u << 30)) return std::to_string(bytes >> 30) + " GiB";
  if (bytes >= (1u << 20)) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}

// Repetitions so that one point takes roughly 0.2 s of traffic at ~10 GB/s, within [3, 2000].
int reps_for(size_t traffic_bytes) {
  double r = 2e9 / static_cast<double>(traffic_bytes);
  return static_cast<int>(std::min(2000.0, std::max(3.0, r)));
}

template <typename F>
double median_seconds(int reps, F&& f) {
  f();  // warm-up: page faults, caches, frequency
  std::vector<double> t;
  t.reserve(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    double t0 = now_seconds();
    f();
    t.push_back(now_seconds() - t0);
  }
  return zs::bench::median(std::move(t));
}

struct Op {
  const char* name;
  bool narrowing;  // fp32 -> 16 bit
  void (*narrow)(std::span<const float>, std::span<uint16_t>, IsaLevel);
  void (*widen)(std::span<const uint16_t>, std::span<float>, IsaLevel);
};

}  // namespace

int main(int argc, char** argv) try {
  std::vector<size_t> sizes = parse_sizes(zs::bench::arg_value(argc, argv, "--sizes", "64K,1M,16M,256M"));
  std::string isa_arg = zs::bench::arg_value(argc, argv, "--isa", "");
  std::vector<IsaLevel> isas = isa_arg.empty() ? supported_isas() : std::vector{parse_isa(isa_arg, "--isa")};

  const Op ops[] = {
      {"f32_to_bf16", true, convert_f32_to_bf16, nullptr},
      {"bf16_to_f32", false, nullptr, convert_bf16_to_f32},
      {"f32_to_f16", true, convert_f32_to_f16, nullptr},
      {"f16_to_f32", false, nullptr, convert_f16_to_f32},
  };

  zs::bench::Report report;
  report.benchmark = "convert_bench";
  boost::json::array size_list, isa_list;
  for (size_t s : sizes) size_list.push_back(s);
  for (IsaLevel i : isas) isa_list.push_back(boost::json::string(isa_name(i)));
  report.config["source_bytes"] = size_list;
  report.config["isas"] = isa_list;
  report.config["threads"] = 1;
  report.config["best_isa"] = std::string(isa_name(best_isa()));
  report.config["gbps_counts"] = "bytes read + bytes written per second, 1e9";

  boost::json::object baseline_by_size;
  boost::json::object ratio_at_largest;
  std::printf("%-12s %-7s %10s %10s %12s %8s\n", "op", "isa", "source", "GB/s", "memcpy GB/s", "ratio");

  for (size_t src_bytes : sizes) {
    size_t n32 = src_bytes / 4;  // elements when the source is fp32
    size_t n16 = src_bytes / 2;  // elements when the source is 16-bit
    // One buffer set big enough for both directions at this source size.
    std::vector<float> f32(n16);
    std::vector<uint16_t> u16(n16);
    for (size_t i = 0; i < n16; ++i) f32[i] = static_cast<float>(i % 1000) * 0.001f - 0.5f;
    convert_f32_to_bf16(f32, u16);  // realistic 16-bit inputs (finite values)

    std::vector<char> msrc(src_bytes, 1), mdst(src_bytes, 0);
    int mreps = reps_for(2 * src_bytes);
    double mt = median_seconds(mreps, [&] { std::memcpy(mdst.data(), msrc.data(), src_bytes); });
    double memcpy_gbps = 2.0 * static_cast<double>(src_bytes) / mt / 1e9;
    baseline_by_size[std::to_string(src_bytes)] = memcpy_gbps;
    std::printf("%-12s %-7s %10s %10.2f %12.2f %8.2f\n", "memcpy", "-", human(src_bytes).c_str(), memcpy_gbps,
                memcpy_gbps, 1.0);

    for (const Op& op : ops) {
      for (IsaLevel isa : isas) {
        size_t n = op.narrowing ? n32 : n16;
        size_t traffic = n * (4 + 2);  // bytes read + written per element, either direction
        int reps = reps_for(traffic);
        double t;
        if (op.narrowing) {
          std::span<const float> src(f32.data(), n);
          std::span<uint16_t> dst(u16.data(), n);
          t = median_seconds(reps, [&] { op.narrow(src, dst, isa); });
        } else {
          std::span<const uint16_t> src(u16.data(), n);
          std::span<float> dst(f32.data(), n);
          t = median_seconds(reps, [&] { op.widen(src, dst, isa); });
        }
        double gbps = static_cast<double>(traffic) / t / 1e9;
        double ratio = gbps / memcpy_gbps;
        std::printf("%-12s %-7s %10s %10.2f %12.2f %8.2f\n", op.name, std::string(isa_name(isa)).c_str(),
                    human(src_bytes).c_str(), gbps, memcpy_gbps, ratio);
        boost::json::object r;
        r["op"] = op.name;
        r["isa"] = std::string(isa_name(isa));
        r["source_bytes"] = src_bytes;
        r["elements"] = n;
        r["bytes_moved"] = traffic;
        r["repetitions"] = reps;
        r["median_s"] = t;
        r["gbps"] = gbps;
        r["memcpy_gbps"] = memcpy_gbps;
        r["ratio_to_memcpy"] = ratio;
        report.results.push_back(std::move(r));
        if (src_bytes == sizes.back()) ratio_at_largest[std::string(op.name) + "/" + std::string(isa_name(isa))] = ratio;
      }
    }
  }
  report.baseline["name"] = "memcpy of the source buffer (GB/s = 2 x source bytes / time), by source bytes";
  report.baseline["gbps_by_source_bytes"] = baseline_by_size;
  report.ratio = ratio_at_largest;
  std::printf("ratio = conversion GB/s / memcpy GB/s at the same source size (largest size in the JSON 'ratio')\n");
  std::string json = zs::bench::json_path_arg(argc, argv);
  if (!json.empty()) report.write(json);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "convert_bench: %s\n", e.what());
  return 1;
}
