// `zeroshard checkpoint`: the storage-level tools (checkpoint/tools.h, docs/checkpoints.md).
// Runs in one process, no MPI.
//
//   zeroshard checkpoint inspect DIR [--config FILE]
//   zeroshard checkpoint consolidate DIR OUT.h5
//   zeroshard checkpoint compare A B [--rtol X] [--atol X]
//   zeroshard checkpoint export DIR OUT --format safetensors [--dtype fp32|bf16|fp16] [--max-shard-bytes N]
#include <charconv>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/errors.h"
#include "checkpoint/tools.h"
#include "memory/dtype.h"
#include "run/hf_weights.h"
#include "tools/commands.h"
#include "tools/options.h"

namespace zs::tools {
namespace {

constexpr const char* kCheckpointUsage =
    "usage: zeroshard checkpoint inspect DIR [--config FILE]     tags, steps, shapes, bytes; config diff\n"
    "       zeroshard checkpoint consolidate DIR OUT.h5          full fp32 parameters by name, streamed\n"
    "       zeroshard checkpoint compare A B [--rtol X] [--atol X]  exit 0 equal, 1 different, 2 error\n"
    "       zeroshard checkpoint export DIR OUT --format safetensors [--dtype fp32|bf16|fp16] [--max-shard-bytes N]\n"
    "                                                   whole tensors, Hugging Face's names for gpt2 and llama\n"
    "  DIR: a checkpoint directory (holding `latest`) or one tag's directory\n";

double parse_tolerance(const std::string& flag, const std::string& text) {
  double v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !(v >= 0)) {
    throw ConfigError(fmt::format("{}: '{}' is not a non-negative number", flag, text));
  }
  return v;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IoError(fmt::format("--config: cannot read '{}'", path));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int run_checkpoint(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::fputs(kCheckpointUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  const std::string& sub = args[0];
  // `zeroshard checkpoint compare --help`: the usage, as for `zeroshard train --help` (exit 0).
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::fputs(kCheckpointUsage, stdout);
      return 0;
    }
  }
  std::vector<std::string> pos;
  std::optional<std::string> config;
  double rtol = 0, atol = 0;
  std::string format;
  memory::DType dtype = memory::DType::kF32;
  uint64_t max_shard_bytes = 5'000'000'000;  // transformers' default max_shard_size, "5GB"
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw ConfigError(fmt::format("{} needs a value", a));
      return args[++i];
    };
    if (a == "--config" && sub == "inspect") {
      config = read_text(value());
    } else if (a == "--rtol" && sub == "compare") {
      rtol = parse_tolerance(a, value());
    } else if (a == "--atol" && sub == "compare") {
      atol = parse_tolerance(a, value());
    } else if (a == "--format" && sub == "export") {
      format = value();
      if (format != "safetensors") {
        throw ConfigError(fmt::format("--format: '{}' is not a format export writes (safetensors)", format));
      }
    } else if (a == "--dtype" && sub == "export") {
      dtype = memory::parse_dtype(value(), "--dtype");
    } else if (a == "--max-shard-bytes" && sub == "export") {
      const std::string& v = value();
      auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), max_shard_bytes);
      if (ec != std::errc() || end != v.data() + v.size() || max_shard_bytes == 0) {
        throw ConfigError(fmt::format("--max-shard-bytes: '{}' is not a positive integer", v));
      }
    } else if (a.rfind("--", 0) == 0) {
      // Options are taken only in full (Note [no option abbreviations] in tools/options.cpp).
      const std::vector<std::string> known = sub == "inspect"   ? std::vector<std::string>{"config", "help"}
                                             : sub == "compare" ? std::vector<std::string>{"rtol", "atol", "help"}
                                             : sub == "export"  ? std::vector<std::string>{"format", "dtype", "max-shard-bytes", "help"}
                                                                : std::vector<std::string>{"help"};
      throw ConfigError(fmt::format("zeroshard checkpoint {}: unknown option '{}'{}\n{}", sub, a,
                                    did_you_mean_option(a, known), kCheckpointUsage));
    } else {
      pos.push_back(a);
    }
  }
  auto need = [&](size_t n) {
    if (pos.size() != n) {
      throw ConfigError(fmt::format("zeroshard checkpoint {}: expected {} path(s), got {}\n{}", sub, n, pos.size(),
                                    kCheckpointUsage));
    }
  };
  if (sub == "inspect") {
    need(1);
    std::fputs(checkpoint::inspect(pos[0], config).c_str(), stdout);
    return 0;
  }
  if (sub == "consolidate") {
    need(2);
    size_t n = checkpoint::consolidate(pos[0], pos[1]);
    std::printf("wrote %zu tensors (fp32) to %s\n", n, pos[1].c_str());
    return 0;
  }
  if (sub == "compare") {
    need(2);
    checkpoint::CompareResult r = checkpoint::compare(pos[0], pos[1], rtol, atol);
    std::fputs(r.report.c_str(), stdout);
    return r.equal ? 0 : 1;
  }
  if (sub == "export") {
    need(2);
    if (format.empty()) throw ConfigError("zeroshard checkpoint export: --format safetensors is required");
    std::printf("%s\n", run::export_safetensors(pos[0], pos[1], dtype, max_shard_bytes).c_str());
    return 0;
  }
  throw ConfigError(fmt::format("zeroshard checkpoint: unknown subcommand '{}'\n{}", sub, kCheckpointUsage));
}

}  // namespace

// Exit codes: 0 done (compare: equal), 1 compare found differences, 2 an error (bad arguments, a
// corrupt or missing checkpoint), so scripts tell "different" from "could not compare".
int checkpoint_command(const std::vector<std::string>& args) {
  try {
    return run_checkpoint(args);
  } catch (const Error& e) {
    std::fprintf(stderr, "zeroshard: error: %s\n", e.what());
    return 2;
  }
}

}  // namespace zs::tools
