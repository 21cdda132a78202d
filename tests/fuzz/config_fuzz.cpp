// Fuzz target: a config document through everything `zeroshard train` does with it before building the
// model (core/json.h parse_json_text, engine::parse_config, estimate/config_fit.h check_config_fits).
// The contract checked on every input:
//   - the only exception is ConfigError (anything else escapes and is reported as a crash);
//   - its message starts with where the problem is: `fuzz.json:line:column` for a syntax error, else a
//     JSON path (`zero_optimization.stage`, `optimizer.params.betas[1]`, `model["a.b"]`, `(top level)`);
//   - libFuzzer's -timeout bounds each input, so an endless parse or check is a reported hang.
// Built with libFuzzer where clang is available, else with replay_main.cpp (tests/fuzz/CMakeLists.txt).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/errors.h"
#include "core/json.h"
#include "engine/config.h"
#include "estimate/config_fit.h"
#include "run/run_config.h"

namespace {

// A character json_path_join writes unquoted (core/json.cpp is_plain_key).
bool is_plain_char(char c) {
  return c != '.' && c != '[' && c != ']' && c != '"' && c != ' ' && c != ':' && static_cast<unsigned char>(c) >= 0x20;
}

// Whether `msg` starts with a JSON path followed by ": " (json_path_join's grammar: plain keys joined by
// '.', indices `[3]`, quoted keys `["a.b"]`), or with the syntax error's `fuzz.json:`.
bool names_a_json_path(std::string_view msg) {
  if (msg.starts_with("fuzz.json:") || msg.starts_with("(top level): ")) return true;
  size_t i = 0;
  bool any = false;
  while (i < msg.size()) {
    if (is_plain_char(msg[i]) && (!any || msg[i - 1] == '.')) {
      while (i < msg.size() && is_plain_char(msg[i])) ++i;
      any = true;
    } else if (msg[i] == '[') {
      ++i;
      if (i < msg.size() && msg[i] == '"') {  // a quoted key: up to the closing quote (escapes included)
        ++i;
        while (i < msg.size() && msg[i] != '"') i += msg[i] == '\\' ? 2 : 1;
        ++i;
      } else {
        const size_t digits = i;
        while (i < msg.size() && msg[i] >= '0' && msg[i] <= '9') ++i;
        if (i == digits || !any) return false;
      }
      if (i >= msg.size() || msg[i] != ']') return false;
      ++i;
      any = true;
    } else if (msg[i] == '.' && any && i + 1 < msg.size() && is_plain_char(msg[i + 1])) {
      ++i;
    } else {
      break;
    }
  }
  return any && msg.substr(i).starts_with(": ");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  // The same document at 1 and at 3 ranks: batch arithmetic and ep_size divide by the world size.
  for (int ranks : {1, 3}) {
    try {
      const boost::json::value doc = zs::parse_json_text(text, "fuzz.json");
      const zs::run::RunConfig cfg = zs::run::parse_run_config(doc, ranks);
      zs::engine::check_config_fits(cfg, ranks, zs::engine::FitCapacity{.host_bytes = uint64_t{64} << 30});
    } catch (const zs::ConfigError& e) {
      if (!names_a_json_path(e.what())) {
        std::fprintf(stderr, "config_fuzz: a ConfigError that names no JSON path: %s\n", e.what());
        std::abort();
      }
    }
  }
  return 0;
}
