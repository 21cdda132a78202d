// DeepSpeed's own config keys, section by section, as DeepSpeed's Python sources spell them
// (deepspeed/runtime/constants.py, runtime/config.py, runtime/zero/config.py, runtime/zero/offload_config.py,
// runtime/precision_config.py, monitor/config.py; both spellings where a key was renamed).
//
// The strict reader consults these tables (ObjectReader::known_keys) before it calls a key unknown: a
// real DeepSpeed key that zeroshard does not read is "not supported by zeroshard yet", and only a key
// in no table gets "unknown key; did you mean ...". The tables list keys, not verdicts: what zeroshard
// accepts, refuses or accepts as a hint is decided where the section is read (engine/config.cpp).
#pragma once

#include <string_view>
#include <vector>

namespace zs::engine::detail {

// The keys of one DeepSpeed section: "" (the top level), "zero_optimization", "offload_optimizer",
// "offload_param", "fp16", "bf16", "optimizer", "scheduler", "aio". Empty for any other name.
const std::vector<std::string_view>& deepspeed_keys(std::string_view section);

}  // namespace zs::engine::detail
