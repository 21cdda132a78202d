// Command-line parsing shared by the `zeroshard` subcommands (Note [no option abbreviations]).
#pragma once

#include <boost/program_options.hpp>

#include <string>
#include <vector>

namespace zs::tools {

// Parses `args` into `vm` with every option spelled in full. On a bad command line prints
// "zeroshard COMMAND: <what is wrong>[; did you mean '--x'?]" and `usage` to stderr and returns false
// (the caller exits 2).
bool parse_command_line(const std::string& command, const std::vector<std::string>& args,
                        const boost::program_options::options_description& opts, const char* usage,
                        boost::program_options::variables_map& vm);

// The closest of `options` (long names, without "--") to the misspelt `given` ("--step"), as
// "; did you mean '--steps'?", or "" when none is close.
std::string did_you_mean_option(const std::string& given, const std::vector<std::string>& options);

}  // namespace zs::tools
