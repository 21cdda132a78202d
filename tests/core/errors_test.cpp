#include "core/errors.h"

#include <gtest/gtest.h>

#include <fcntl.h>

#include <cerrno>

namespace zs {
namespace {

TEST(Errors, AssertThrowsInternalErrorWithLocationAndMessage) {
  try {
    ZS_ASSERT(1 + 1 == 3, "arithmetic is {}", "broken");
    FAIL() << "ZS_ASSERT did not throw";
  } catch (const InternalError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("1 + 1 == 3"), std::string::npos) << what;
    EXPECT_NE(what.find("errors_test.cpp"), std::string::npos) << what;
    EXPECT_NE(what.find("arithmetic is broken"), std::string::npos) << what;
  }
}

// A holding assertion costs its test only: the message and its arguments are never evaluated (they
// may be expensive to format, and ZS_ASSERT is always on, also on hot paths).
TEST(Errors, AHoldingAssertEvaluatesNeitherMessageNorArguments) {
  int formatted = 0;
  auto expensive = [&] { return ++formatted; };
  int checked = 0;
  for (int i = 0; i < 3; ++i) ZS_ASSERT(++checked > 0, "never {}", expensive());
  EXPECT_EQ(checked, 3) << "the condition is evaluated once per assertion";
  EXPECT_EQ(formatted, 0) << "the message arguments of a holding assertion were evaluated";
}

TEST(Errors, SysCheckKeepsErrnoText) {
  try {
    ZS_SYS_CHECK(::open("/nonexistent/zeroshard/file", O_RDONLY), "open of '{}'", "/nonexistent/zeroshard/file");
    FAIL() << "ZS_SYS_CHECK did not throw";
  } catch (const IoError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("open of '/nonexistent/zeroshard/file'"), std::string::npos) << what;
    EXPECT_NE(what.find("No such file or directory"), std::string::npos) << what;
  }
}

TEST(Errors, TypedErrorsAreZeroshardErrors) {
  EXPECT_THROW(throw ConfigError("x"), Error);
  EXPECT_THROW(throw OutOfMemoryError("x"), Error);
  EXPECT_THROW(throw CommError("x"), Error);
  EXPECT_THROW(throw IoError("x"), Error);
  EXPECT_THROW(throw CheckpointError("x"), Error);
}

// File contents quoted in a message: a corrupt `latest` tag's byte shows as \xe5, UTF-8 text stays.
TEST(Errors, PrintableEscapesWhatIsNotPrintable) {
  EXPECT_EQ(printable("global_st\xe5p4"), "global_st\\xe5p4");
  EXPECT_EQ(printable("a\nb\tc\x1b[31m\x7f"), "a\\x0ab\\x09c\\x1b[31m\\x7f");
  EXPECT_EQ(printable("\xce\xa8 = 1.3B, \xe2\x86\x92 ok"), "\xce\xa8 = 1.3B, \xe2\x86\x92 ok");  // well-formed UTF-8 is kept
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");          // an overlong '/' is not UTF-8
  EXPECT_EQ(printable("\xe2\x86"), "\\xe2\\x86");          // a sequence cut short
  EXPECT_EQ(printable(std::string_view("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(printable("plain tag_1.2-x"), "plain tag_1.2-x");
}

}  // namespace
}  // namespace zs
