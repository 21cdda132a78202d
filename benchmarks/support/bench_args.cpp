#include "benchmarks/support/bench_args.h"

#include "benchmarks/support/bench_json.h"
#include "core/errors.h"

namespace zs::bench {

int64_t int_arg(int argc, char** argv, const std::string& name, int64_t fallback, int64_t min) {
  const std::string v = arg_value(argc, argv, name, "");
  if (v.empty()) return fallback;
  size_t used = 0;
  double d = 0;
  try {
    d = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const auto n = static_cast<int64_t>(d);
  if (used != v.size() || n < min || static_cast<double>(n) != d) {
    throw ConfigError(fmt::format("{} expects an integer >= {}, got '{}'", name, min, v));
  }
  return n;
}

nn::GptConfig gpt_config_arg(int argc, char** argv, const nn::GptConfig& defaults) {
  nn::GptConfig g = defaults;
  g.n_layer = int_arg(argc, argv, "--n-layer", defaults.n_layer);
  g.d_model = int_arg(argc, argv, "--d-model", defaults.d_model);
  g.n_head = int_arg(argc, argv, "--n-head", defaults.n_head);
  g.seq_len = int_arg(argc, argv, "--seq-len", defaults.seq_len);
  g.vocab_size = int_arg(argc, argv, "--vocab", defaults.vocab_size);
  nn::validate(g);
  return g;
}

uint64_t parse_size(const std::string& s) {
  size_t pos = 0;
  unsigned long long v = std::stoull(s, &pos);
  std::string unit = s.substr(pos);
  if (unit == "K") v <<= 10;
  else if (unit == "M") v <<= 20;
  else if (unit == "G") v <<= 30;
  else if (!unit.empty()) throw ConfigError("size '" + s + "': use a suffix K, M or G");
  return v;
}

}  // namespace zs::bench
