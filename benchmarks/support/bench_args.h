// Command-line values shared by the benchmarks.
#pragma once

#include <cstdint>
#include <string>

#include "nn/gpt.h"

namespace zs::bench {

// The integer after `name` (e.g. "--steps"), or `fallback`. Accepts 2e6 (as DeepSpeed configs write
// numbers); throws ConfigError naming the flag for anything that is not an integer >= min.
int64_t int_arg(int argc, char** argv, const std::string& name, int64_t fallback, int64_t min = 1);

// A byte count as written on the command line: 4096, 64K, 64M, 1G (ConfigError for another suffix).
uint64_t parse_size(const std::string& s);

// A GPT from --n-layer --d-model --n-head --seq-len --vocab, each defaulting to `defaults`' value;
// validated (ConfigError naming the bad value).
nn::GptConfig gpt_config_arg(int argc, char** argv, const nn::GptConfig& defaults);

}  // namespace zs::bench
