// README.md's code blocks that quote a source file stay true to it: a block preceded by the line
// `<!-- quoted from PATH -->` must consist of lines of PATH, in PATH's order (lines may be left out
// between them, none changed or added). PATH compiles and runs in its own tests (for
// examples/recommender_model.h: tests/docs/recommender_test.cpp), so the README shows code that works.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string trimmed(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

struct Quote {
  std::string path;
  std::vector<std::string> lines;
  size_t readme_line;
};

std::vector<Quote> quotes_in(const std::vector<std::string>& readme) {
  const std::string marker = "<!-- quoted from ";
  std::vector<Quote> out;
  for (size_t i = 0; i < readme.size(); ++i) {
    if (readme[i].rfind(marker, 0) != 0) continue;
    Quote q{readme[i].substr(marker.size(), readme[i].find(" -->") - marker.size()), {}, i + 1};
    size_t j = i + 1;
    EXPECT_TRUE(j < readme.size() && readme[j].rfind("```", 0) == 0) << "README line " << i + 1 << ": no code block after the marker";
    for (++j; j < readme.size() && readme[j].rfind("```", 0) != 0; ++j) q.lines.push_back(readme[j]);
    out.push_back(q);
  }
  return out;
}

TEST(ReadmeSnippets, QuotedBlocksAreLinesOfTheirSource) {
  const std::string root = ZS_SOURCE_DIR;
  const std::vector<Quote> quotes = quotes_in(read_lines(root + "/README.md"));
  ASSERT_FALSE(quotes.empty()) << "README.md quotes no source file";
  for (const Quote& q : quotes) {
    const std::vector<std::string> source = read_lines(root + "/" + q.path);
    size_t at = 0;  // the next source line a quoted line may match
    for (const std::string& line : q.lines) {
      if (trimmed(line).empty()) continue;
      size_t k = at;
      while (k < source.size() && trimmed(source[k]) != trimmed(line)) ++k;
      EXPECT_LT(k, source.size()) << "README line " << q.readme_line << " quotes " << q.path
                                  << " but this line is not in it (after the previous quoted line):\n  " << line;
      if (k < source.size()) at = k + 1;
    }
  }
}

// The check itself: a changed line is caught.
TEST(ReadmeSnippets, AChangedLineIsCaught) {
  const std::vector<std::string> readme = {"<!-- quoted from x -->", "```cpp", "int a = 1;", "```"};
  const std::vector<Quote> q = quotes_in(readme);
  ASSERT_EQ(q.size(), 1u);
  EXPECT_EQ(q[0].path, "x");
  EXPECT_EQ(q[0].lines, std::vector<std::string>{"int a = 1;"});
}

}  // namespace
