// Shared by the optimizer tests: an `optimizer` section parsed through the registry the way
// parse_config reads it, and the ConfigError message a bad one gives. Header-only.
#pragma once

#include <boost/json.hpp>

#include <string>

#include "core/errors.h"
#include "core/json.h"
#include "optim/registry.h"

namespace zs::optim::test {

inline OptimizerChoice parse(const std::string& text) {
  const boost::json::value doc = parse_json_text(text);
  ObjectReader r(doc, "optimizer");
  OptimizerChoice c = read_optimizer(r);
  r.finish();
  return c;
}

// The message of the ConfigError parsing `text` throws, or "(no error)".
inline std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace zs::optim::test
