// Subcommands of the `zeroshard` tool. Each takes the arguments after its name and returns the
// process exit code; errors are thrown as zs::Error and reported by main.
#pragma once

#include <string>
#include <vector>

namespace zs::tools {

int train_command(const std::vector<std::string>& args);
int estimate_command(const std::vector<std::string>& args);
int project_command(const std::vector<std::string>& args);
int checkpoint_command(const std::vector<std::string>& args);
int tokenize_command(const std::vector<std::string>& args);

}  // namespace zs::tools
