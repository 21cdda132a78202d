// Command-line parsing shared by the `zeroshard` subcommands (Note [no option abbreviations]).
#pragma once

#include <boost/program_options.hpp>

#include <optional>
#include <string>
#include <vector>

namespace zs::tools {

// Parses `args` into `vm` with every option spelled in full. On a bad command line prints
// "zeroshard COMMAND: <what is wrong>[; did you mean '--x'?]" and `usage` to stderr and returns false
// (the caller exits 2).
bool parse_command_line(const std::string& command, const std::vector<std::string>& args,
                        const boost::program_options::options_description& opts, const char* usage,
                        boost::program_options::variables_map& vm);

// parse_command_line, then --help: returns the exit code when the command ends here (2 after a bad
// command line, 0 after printing `usage` and the options for --help), nullopt when it goes on.
std::optional<int> parse_or_help(const std::string& command, const std::vector<std::string>& args,
                                 const boost::program_options::options_description& opts, const char* usage,
                                 boost::program_options::variables_map& vm);

// Runs a command's body: a zeroshard error (zs::Error) prints as "zeroshard: error: <what>" and
// ends the command with 1.
int run_reporting_errors(int (*body)(const boost::program_options::variables_map&),
                         const boost::program_options::variables_map& vm);

// The closest of `options` (long names, without "--") to the misspelt `given` ("--step"), as
// "; did you mean '--steps'?", or "" when none is close.
std::string did_you_mean_option(const std::string& given, const std::vector<std::string>& options);

}  // namespace zs::tools
