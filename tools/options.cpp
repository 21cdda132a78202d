#include "tools/options.h"

#include <cstdio>
#include <sstream>

#include "core/errors.h"
#include "core/json.h"

namespace zs::tools {

namespace po = boost::program_options;

// Note [no option abbreviations]. Boost's default style lets any unambiguous prefix stand for an
// option, so `zeroshard train --step 3` ran as `--steps 3` without a word: a typo that happened to be
// a prefix was taken silently, and one that was not (`--stesp`) was refused. Options are now taken
// only in full, as config keys are, and a misspelt one gets the same kind of did-you-mean
// (core/json.h's closest_match, the config keys' suggestion).
bool parse_command_line(const std::string& command, const std::vector<std::string>& args,
                        const po::options_description& opts, const char* usage, po::variables_map& vm) {
  const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
  try {
    po::store(po::command_line_parser(args).options(opts).style(style).run(), vm);
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    std::vector<std::string> names;
    for (const auto& o : opts.options()) names.push_back(o->long_name());
    std::fprintf(stderr, "zeroshard %s: %s%s\n%s", command.c_str(), e.what(),
                 did_you_mean_option(e.get_option_name(), names).c_str(), usage);
    return false;
  } catch (const po::error& e) {
    std::fprintf(stderr, "zeroshard %s: %s\n%s", command.c_str(), e.what(), usage);
    return false;
  }
  return true;
}

std::optional<int> parse_or_help(const std::string& command, const std::vector<std::string>& args,
                                 const po::options_description& opts, const char* usage, po::variables_map& vm) {
  if (!parse_command_line(command, args, opts, usage, vm)) return 2;
  if (vm.count("help") == 0) return std::nullopt;
  std::ostringstream o;
  o << opts;
  std::printf("%s\n%s", usage, o.str().c_str());
  return 0;
}

int run_reporting_errors(int (*body)(const po::variables_map&), const po::variables_map& vm) {
  try {
    return body(vm);
  } catch (const Error& e) {
    std::fprintf(stderr, "zeroshard: error: %s\n", e.what());
    return 1;
  }
}

std::string did_you_mean_option(const std::string& given, const std::vector<std::string>& options) {
  std::string word = given;
  while (!word.empty() && word.front() == '-') word.erase(word.begin());
  const std::string near = closest_match(word, options);
  return near.empty() ? std::string() : "; did you mean '--" + near + "'?";
}

}  // namespace zs::tools
