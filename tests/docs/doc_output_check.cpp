// Run output quoted in README.md and docs/*.md stays true to the program. A code block preceded by the
// line `<!-- output of NAME -->` quotes lines a run prints; tests/docs/CMakeLists.txt names the run
// behind each NAME (the demo, ...), and a test runs it once and calls
//   doc_output_check SOURCE_DIR NAME OUTPUT_FILE [RELATIVE_TOLERANCE]
// which fails unless every quoted line of every NAME block is a line of OUTPUT_FILE, in order
// (lines may be left out between them; the log's timestamp and level prefix may be left out, and so
// may the end of a line, written "..."). Numbers compare as numbers within 0.1% relative (printed
// losses differ in the last digit between CPUs, never by 0.1%), except timings (a number before
// "tok/s", "tokens/s", "s/step" or " s:" / " s)"), which the machine decides and any value matches.
// Without arguments it runs its own tests (a changed figure is caught, a timing is not).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <string>
#include <vector>

namespace {

std::vector<std::string> read_lines(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

struct Block {
  std::string file;
  size_t line = 0;  // of the marker, 1-based
  std::vector<std::string> lines;
};

std::vector<Block> blocks_in(const std::string& file, const std::vector<std::string>& text, const std::string& name) {
  const std::string marker = "<!-- output of " + name + " -->";
  std::vector<Block> out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != marker) continue;
    Block b{file, i + 1, {}};
    size_t j = i + 1;
    if (j >= text.size() || text[j].rfind("```", 0) != 0) {
      b.lines.push_back("(no code block after the marker)");
    } else {
      for (++j; j < text.size() && text[j].rfind("```", 0) != 0; ++j) {
        if (text[j].find_first_not_of(' ') != std::string::npos) b.lines.push_back(text[j]);
      }
    }
    out.push_back(b);
  }
  return out;
}

const char* const kNumber = R"(([-+]?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?))";

bool is_timing(const std::string& after) {
  for (const char* unit : {" tok/s", " tokens/s", " s/step", " s:", " s)"}) {
    if (after.rfind(unit, 0) == 0) return true;
  }
  return false;
}

// The quoted line as a regex (text literal, each number a group, "..." anything) and, per group,
// the quoted number (NaN for a timing).
struct Pattern {
  std::regex re;
  std::vector<double> numbers;
  std::vector<std::string> texts;  // as the docs write them
};

Pattern pattern_of(const std::string& quoted) {
  static const std::regex number(kNumber);
  std::string re;
  std::vector<double> numbers;
  std::vector<std::string> texts;
  auto literal = [&](const std::string& text) {
    for (size_t i = 0; i < text.size(); ++i) {
      if (text.compare(i, 3, "...") == 0) {
        re += ".*";
        i += 2;
      } else if (std::string("\\^$.|?*+()[]{}").find(text[i]) != std::string::npos) {
        re += std::string("\\") + text[i];
      } else {
        re += text[i];
      }
    }
  };
  size_t at = 0;
  for (std::sregex_iterator it(quoted.begin(), quoted.end(), number), end; it != end; ++it) {
    const size_t pos = static_cast<size_t>(it->position());
    // A digit glued to a word ("rank0", "fp32") is text, not a figure.
    if (pos > 0 && (std::isalpha(static_cast<unsigned char>(quoted[pos - 1])) || quoted[pos - 1] == '_')) continue;
    literal(quoted.substr(at, pos - at));
    re += kNumber;
    numbers.push_back(is_timing(quoted.substr(pos + it->str().size())) ? NAN : std::stod(it->str()));
    texts.push_back(it->str());
    at = pos + it->str().size();
  }
  literal(quoted.substr(at));
  return {std::regex(re), numbers, texts};
}

// Relative tolerance of figures: 0.1%, or the run's own (the optional fourth argument; bf16 runs, whose
// products take another kernel on a CPU without AVX512-BF16).
double g_rel_tol = 1e-3;

// Whether `actual` prints `quoted` (see the top). When only figures differ, `agreeing` is the number
// of leading figures that agree and `why` names the first that does not.
bool prints(const std::string& actual, const Pattern& p, size_t* agreeing = nullptr, std::string* why = nullptr) {
  std::smatch m;
  if (!std::regex_search(actual, m, p.re)) return false;
  for (size_t k = 0; k < p.numbers.size(); ++k) {
    const double want = p.numbers[k], got = std::stod(m[k + 1].str());
    if (std::isnan(want)) continue;
    if (std::fabs(got - want) > g_rel_tol * std::max(std::fabs(want), std::fabs(got))) {
      if (agreeing) *agreeing = k;
      if (why) *why = "the docs say " + p.texts[k] + ", the program prints " + m[k + 1].str();
      return false;
    }
  }
  return true;
}

// Checks every block of `name` against `output`; returns the failures, one line each.
std::vector<std::string> check(const std::vector<Block>& blocks, const std::vector<std::string>& output) {
  std::vector<std::string> failures;
  for (const Block& b : blocks) {
    size_t at = 0;
    for (const std::string& q : b.lines) {
      const Pattern p = pattern_of(q);
      size_t k = at;
      std::string why;
      while (k < output.size() && !prints(output[k], p)) ++k;
      if (k < output.size()) {
        at = k + 1;
        continue;
      }
      // The nearest line: same text, the most leading figures agreeing (step 50's line, not step 1's).
      size_t best = 0;
      for (size_t j = at; j < output.size(); ++j) {
        size_t agreeing = 0;
        std::string reason;
        if (!prints(output[j], p, &agreeing, &reason) && !reason.empty() && (why.empty() || agreeing > best)) {
          best = agreeing;
          why = reason;
        }
      }
      failures.push_back(b.file + ":" + std::to_string(b.line) + " quotes a line the run does not print" +
                         (why.empty() ? "" : " (" + why + ")") + ":\n  " + q);
    }
  }
  return failures;
}

int check_main(const std::string& root, const std::string& name, const std::string& output_file) {
  std::vector<Block> blocks;
  std::vector<std::filesystem::path> files{std::filesystem::path(root) / "README.md"};
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(root) / "docs")) {
    if (e.path().extension() == ".md") files.push_back(e.path());
  }
  for (const auto& f : files) {
    for (Block& b : blocks_in(std::filesystem::relative(f, root).string(), read_lines(f), name)) blocks.push_back(b);
  }
  const std::vector<std::string> output = read_lines(output_file);
  if (blocks.empty()) {
    std::cerr << "doc_output_check: no block marked '<!-- output of " << name << " -->' in README.md or docs/\n";
    return 1;
  }
  if (output.empty()) {
    std::cerr << "doc_output_check: '" << output_file << "' is empty or unreadable\n";
    return 1;
  }
  const std::vector<std::string> failures = check(blocks, output);
  for (const std::string& f : failures) std::cerr << f << "\n";
  size_t lines = 0;
  for (const Block& b : blocks) lines += b.lines.size();
  if (!failures.empty()) {
    std::cerr << "doc_output_check: " << failures.size() << " quoted line(s) of '" << name
              << "' no longer match the program's output (" << output_file << "): update the docs\n";
    return 1;
  }
  std::cout << "doc outputs ok: " << name << ": " << lines << " quoted line(s) in " << blocks.size() << " block(s)\n";
  return 0;
}

// ---- the checker's own tests -----------------------------------------------------------------------

const std::vector<std::string> kRun = {
    "[02:34:16.882] [info] [rank 0/2] step 1/150 | loss 5.4996 | lr 0.000e+00 | 5343 tok/s | 0.383 s/step | model states 49.7 MiB",
    "[02:34:32.287] [info] [rank 0/2] step 50/150 | loss 2.9962 | lr 8.939e-04 | 7927 tok/s | 0.258 s/step",
    "demo: 150 steps on 2 ranks in 108 s: loss 5.500 -> 2.705 (2863 tokens/s)"};

std::vector<std::string> check_one(const std::vector<std::string>& quoted) {
  return check({Block{"README.md", 1, quoted}}, kRun);
}

TEST(DocOutputCheck, TimingsAndTheLastDigitPassFiguresDoNot) {
  EXPECT_TRUE(check_one({"[rank 0/2] step 1/150 | loss 5.4996 | lr 0.000e+00 | 1787 tok/s | 1.146 s/step | model states 49.7 MiB",
                         "[rank 0/2] step 50/150 | loss 2.9961 | lr 8.939e-04 | ...",
                         "demo: 150 steps on 2 ranks in 164 s: loss 5.500 -> 2.705 (1887 tokens/s)"})
                  .empty());
  // The README's figures before issue 39: the loss, the lr at step 50 and the final loss.
  EXPECT_EQ(check_one({"[rank 0/2] step 1/150 | loss 5.5096 | ..."}).size(), 1u);
  const auto lr = check_one({"[rank 0/2] step 50/150 | loss 2.9962 | lr 8.868e-04 | ..."});
  ASSERT_EQ(lr.size(), 1u);
  EXPECT_NE(lr[0].find("the docs say 8.868e-04, the program prints 8.939e-04"), std::string::npos) << lr[0];
  EXPECT_EQ(check_one({"demo: 150 steps on 2 ranks in 164 s: loss 5.510 -> 2.379 (1887 tokens/s)"}).size(), 1u);
  EXPECT_EQ(check_one({"[rank 0/2] step 1/150 | loss 5.4996 | ... | model states 52.0 MiB"}).size(), 1u);
  EXPECT_EQ(check_one({"demo: 150 steps on 4 ranks in 1 s: ..."}).size(), 1u);  // text differs
  // Out of order.
  EXPECT_EQ(check_one({"demo: 150 steps ...", "[rank 0/2] step 1/150 ..."}).size(), 1u);
}

TEST(DocOutputCheck, FindsMarkedBlocks) {
  const std::vector<std::string> md = {"text", "<!-- output of demo -->", "```", "a 1", "", "b 2", "```",
                                       "<!-- output of other -->", "```", "c", "```"};
  const auto b = blocks_in("x.md", md, "demo");
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].line, 2u);
  EXPECT_EQ(b[0].lines, (std::vector<std::string>{"a 1", "b 2"}));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 || argc == 5) {
    if (argc == 5) g_rel_tol = std::stod(argv[4]);
    return check_main(argv[1], argv[2], argv[3]);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
