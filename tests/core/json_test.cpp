#include "core/json.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/json/parse.hpp>

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace zs {
namespace {

namespace json = boost::json;

// Runs `fn`, expects a ConfigError, and returns its message (empty if none was thrown).
std::string config_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError";
  return "";
}

// Each argument is evaluated once (the message may come from a call with side effects).
#define EXPECT_HAS(text, part) EXPECT_PRED2(contains, text, part)
#define EXPECT_LACKS(text, part) EXPECT_FALSE(contains(text, part)) << "message: " << (text)

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

class TempFile {
 public:
  TempFile(const std::string& name, const std::string& content)
      : path_(std::filesystem::temp_directory_path() / ("zs_json_test_" + std::to_string(::getpid()) + "_" + name)) {
    std::ofstream(path_, std::ios::binary) << content;
  }
  ~TempFile() { std::filesystem::remove(path_); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// ---- Paths ---------------------------------------------------------------------------------------

TEST(JsonPath, JoinsKeysAndIndices) {
  EXPECT_EQ(json_path_join("", "stage"), "stage");
  EXPECT_EQ(json_path_join("zero_optimization", "stage"), "zero_optimization.stage");
  EXPECT_EQ(json_path_index("optimizer.params.betas", 1), "optimizer.params.betas[1]");
  EXPECT_EQ(json_path_join(json_path_index("layers", 2), "size"), "layers[2].size");
  EXPECT_EQ(json_path_join("model", "a.b"), "model[\"a.b\"]");
  EXPECT_EQ(json_path_join("model", ""), "model[\"\"]");
  EXPECT_EQ(json_path_display(""), "(top level)");
  EXPECT_EQ(json_path_display("a.b"), "a.b");
}

// ---- Parsing -------------------------------------------------------------------------------------

TEST(JsonParse, MatchesBoostOnValidDocuments) {
  const char* text = R"({"a": 1, "b": [1.5, -2, 18446744073709551615, "x\"y", true, null],
                         "c": {"d": {"e": "\u00e9"}}, "k\"q": 5e8, "empty": {}, "list": []})";
  EXPECT_EQ(parse_json_text(text), json::parse(text));
  EXPECT_EQ(parse_json_text("[]"), json::parse("[]"));
  EXPECT_EQ(parse_json_text(" 42 \n"), json::parse("42"));
}

TEST(JsonParse, SyntaxErrorNamesSourceLineColumnAndParserMessage) {
  std::string msg = config_error([] { parse_json_text("{\n  \"a\": 1,\n}", "cfg.json"); });
  EXPECT_HAS(msg, "cfg.json:3:1:");
  EXPECT_HAS(msg, "syntax error");
  EXPECT_HAS(msg, "near '}'");
  EXPECT_HAS(msg, "no trailing commas");

  msg = config_error([] { parse_json_text("{\"a\": tru}", "x.json"); });
  EXPECT_HAS(msg, "x.json:1:7:");
  EXPECT_HAS(msg, "syntax error");
}

TEST(JsonParse, RejectsIncompleteEmptyExtraAndComments) {
  std::string msg = config_error([] { parse_json_text("{\"a\": 1", "c.json"); });
  EXPECT_HAS(msg, "c.json:1:8:");
  EXPECT_HAS(msg, "incomplete JSON");
  msg = config_error([] { parse_json_text("  \n", "c.json"); });
  EXPECT_HAS(msg, "c.json");
  EXPECT_HAS(msg, "empty");
  msg = config_error([] { parse_json_text("{\"a\":1}\n{}", "c.json"); });
  EXPECT_HAS(msg, "c.json:2:1:");
  EXPECT_HAS(msg, "extra data");
  msg = config_error([] { parse_json_text("// note\n{}", "c.json"); });
  EXPECT_HAS(msg, "c.json:1:1:");
  msg = config_error([] { parse_json_text("\xEF\xBB\xBF{}", "c.json"); });
  EXPECT_HAS(msg, "byte order mark");
  msg = config_error([] { parse_json_text("{\"a\": \"\xFF\"}", "c.json"); });
  EXPECT_HAS(msg, "c.json:1:");
}

TEST(JsonParse, DuplicateKeyAtTopLevelNamesKeyAndLine) {
  std::string msg = config_error([] { parse_json_text("{\n  \"stage\": 1,\n  \"stage\": 3\n}", "ds.json"); });
  EXPECT_HAS(msg, "ds.json:3:3:");
  EXPECT_HAS(msg, "duplicate key 'stage'");
  EXPECT_HAS(msg, "keep only one");
}

TEST(JsonParse, DuplicateKeyNestedNamesFullPath) {
  const char* text =
      "{\"zero_optimization\": {\n"
      "  \"offload_optimizer\": {\"device\": \"cpu\",\n"
      "                        \"pin_memory\": true,\n"
      "                        \"device\": \"nvme\"}}}";
  std::string msg = config_error([&] { parse_json_text(text, "ds.json"); });
  EXPECT_HAS(msg, "ds.json:4:25:");
  EXPECT_HAS(msg, "duplicate key 'zero_optimization.offload_optimizer.device'");
}

TEST(JsonParse, DuplicateKeyInsideArrayNamesIndex) {
  std::string msg = config_error([] { parse_json_text("{\"layers\": [{\"a\": 1}, [0], {\"a\": 1,\n \"a\": 2}]}"); });
  EXPECT_HAS(msg, "<inline>:2:2:");
  EXPECT_HAS(msg, "'layers[2].a'");
}

TEST(JsonParse, DuplicateKeysCompareDecodedText) {
  std::string msg = config_error([] { parse_json_text(R"({"a": 1, "\u0061": 2})"); });
  EXPECT_HAS(msg, "duplicate key 'a'");
  EXPECT_HAS(msg, ":1:10:");
  msg = config_error([] { parse_json_text(R"({"x": {"a\"b": 1, "a\"b": 2}})"); });
  EXPECT_HAS(msg, "duplicate key 'x[\"a\\\"b\"]'");
  EXPECT_HAS(msg, ":1:19:");
}

TEST(JsonParse, SameKeyInDifferentObjectsIsFine) {
  EXPECT_NO_THROW(parse_json_text(R"({"x": {"a": 1}, "y": {"a": 1}, "z": [{"a": 1}, {"a": 2}]})"));
}

TEST(JsonParse, FileErrorsNameThePath) {
  std::string msg = config_error([] { parse_json_file("/nonexistent/zeroshard/ds.json"); });
  EXPECT_HAS(msg, "/nonexistent/zeroshard/ds.json");
  EXPECT_HAS(msg, "No such file or directory");
  msg = config_error([] { parse_json_file(std::filesystem::temp_directory_path()); });
  EXPECT_HAS(msg, std::filesystem::temp_directory_path().string());
  EXPECT_HAS(msg, "directory");

  TempFile bad("bad.json", "{\n  \"train_batch_size\": 8\n  \"steps\": 2\n}\n");
  msg = config_error([&] { parse_json_file(bad.path()); });
  EXPECT_HAS(msg, bad.path().string() + ":3:3:");

  TempFile dup("dup.json", "{\"a\": {\"b\": 1,\n\"b\": 2}}");
  msg = config_error([&] { parse_json_file(dup.path()); });
  EXPECT_HAS(msg, dup.path().string() + ":2:1:");
  EXPECT_HAS(msg, "'a.b'");

  TempFile good("good.json", "{\"a\": [1, 2]}");
  EXPECT_EQ(parse_json_file(good.path()), json::parse("{\"a\": [1, 2]}"));
}

// ---- Conversions and ranges ----------------------------------------------------------------------

template <typename T>
std::string read_error(const char* text, const std::string& key = "v") {
  json::value doc = parse_json_text(text);
  return config_error([&] {
    ObjectReader r(doc, "sec");
    T out{};
    r.read(key, out);
  });
}

template <typename T>
T read_ok(const char* text) {
  json::value doc = parse_json_text(text);
  ObjectReader r(doc, "sec");
  T out{};
  EXPECT_TRUE(r.read("v", out));
  r.finish();
  return out;
}

TEST(JsonConvert, IntegersAcceptIntegralDoubles) {
  EXPECT_EQ(read_ok<std::int64_t>(R"({"v": 5e8})"), 500000000);
  EXPECT_EQ(read_ok<std::size_t>(R"({"v": 5E8})"), 500000000u);
  EXPECT_EQ(read_ok<int>(R"({"v": -3.0})"), -3);
  EXPECT_EQ(read_ok<std::int64_t>(R"({"v": -9223372036854775808})"), std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(read_ok<std::uint64_t>(R"({"v": 18446744073709551615})"), std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(read_ok<std::uint64_t>(R"({"v": 9.2233720368547758e18})"), 9223372036854775808ull);
  EXPECT_EQ(read_ok<std::int64_t>(R"({"v": -9.2233720368547758e18})"), std::numeric_limits<std::int64_t>::min());
}

TEST(JsonConvert, IntegersRejectFractionsWrongTypesAndOverflow) {
  std::string msg = read_error<int>(R"({"v": 2.5})");
  EXPECT_HAS(msg, "sec.v: expected an integer, got a number (2.5)");
  msg = read_error<int>(R"({"v": "5"})");
  EXPECT_HAS(msg, "sec.v: expected an integer, got a string");
  msg = read_error<std::size_t>(R"({"v": true})");
  EXPECT_HAS(msg, "sec.v: expected an integer, got a boolean");
  msg = read_error<int>(R"({"v": 3e9})");
  EXPECT_HAS(msg, "sec.v: 3000000000 is out of range");
  EXPECT_HAS(msg, "-2147483648..2147483647, the range of a 32-bit integer");
  msg = read_error<std::size_t>(R"({"v": -1})");
  EXPECT_HAS(msg, "sec.v: -1 is out of range");
  EXPECT_HAS(msg, "non-negative");
  msg = read_error<std::int64_t>(R"({"v": 18446744073709551615})");
  EXPECT_HAS(msg, "out of range");
  EXPECT_HAS(msg, "64-bit integer");
  msg = read_error<std::int64_t>(R"({"v": 9.2233720368547758e18})");
  EXPECT_HAS(msg, "sec.v:");
  EXPECT_HAS(msg, "out of range");
  msg = read_error<std::uint64_t>(R"({"v": 1.8446744073709552e19})");
  EXPECT_HAS(msg, "out of range");
  msg = read_error<std::uint32_t>(R"({"v": 4294967296})");
  EXPECT_HAS(msg, "0..4294967295");
  msg = read_error<int>(R"({"v": 1e400})");
  EXPECT_HAS(msg, "expected an integer");
}

TEST(JsonConvert, ScalarsOfOtherTypes) {
  EXPECT_EQ(read_ok<double>(R"({"v": 3})"), 3.0);
  EXPECT_EQ(read_ok<double>(R"({"v": 1e-8})"), 1e-8);
  EXPECT_EQ(read_ok<float>(R"({"v": 0.5})"), 0.5f);
  EXPECT_EQ(read_ok<bool>(R"({"v": false})"), false);
  EXPECT_EQ(read_ok<std::string>(R"({"v": "nvme"})"), "nvme");
  EXPECT_HAS(read_error<double>(R"({"v": "1e-3"})"), "sec.v: expected a number, got a string (\"1e-3\")");
  EXPECT_HAS(read_error<double>(R"({"v": 1e400})"), "sec.v: inf is out of range (allowed: finite numbers)");
  EXPECT_HAS(read_error<float>(R"({"v": 1e39})"), "the range of a 32-bit float");
  EXPECT_HAS(read_error<bool>(R"({"v": 1})"), "sec.v: expected a boolean (true or false), got an integer (1)");
  EXPECT_HAS(read_error<std::string>(R"({"v": null})"), "sec.v: expected a string, got null");
  EXPECT_HAS(read_error<std::string>(R"({"v": {}})"), "sec.v: expected a string, got an object");
}

TEST(JsonConvert, ArraysNameTheBadElement) {
  using Pair = std::array<double, 2>;
  auto betas = read_ok<std::array<double, 2>>(R"({"v": [0.9, 0.999]})");
  EXPECT_EQ(betas[0], 0.9);
  EXPECT_EQ(betas[1], 0.999);
  EXPECT_EQ(read_ok<std::vector<double>>(R"({"v": [1, 2.5, 3]})"), (std::vector<double>{1, 2.5, 3}));
  EXPECT_EQ(read_ok<std::vector<std::int64_t>>(R"({"v": [1, 2e3]})"), (std::vector<std::int64_t>{1, 2000}));
  EXPECT_TRUE(read_ok<std::vector<double>>(R"({"v": []})").empty());
  EXPECT_HAS(read_error<Pair>(R"({"v": [0.9]})"), "sec.v: expected an array of 2 elements, got 1");
  EXPECT_HAS(read_error<Pair>(R"({"v": 0.9})"), "sec.v: expected an array of 2 elements, got a number");
  EXPECT_HAS(read_error<Pair>(R"({"v": [0.9, "x"]})"), "sec.v[1]: expected a number, got a string");
  EXPECT_HAS(read_error<std::vector<int>>(R"({"v": [1, 2.5]})"), "sec.v[1]: expected an integer, got a number (2.5)");
  EXPECT_HAS(read_error<std::vector<double>>(R"({"v": {"a": 1}})"), "sec.v: expected an array, got an object");
}

TEST(JsonRange, IntegerRangesNamePathAndAllowedRange) {
  json::value doc = parse_json_text(R"({"stage": 4, "n": 0, "m": -5, "big": 18446744073709551615})");
  ObjectReader r(doc, "zero_optimization");
  int stage = 1;
  EXPECT_HAS(config_error([&] { r.read("stage", stage, IntRange{0, 3}); }),
             "zero_optimization.stage: 4 is out of range (allowed: 0..3)");
  EXPECT_EQ(stage, 1) << "a rejected value must not be stored";
  std::size_t n = 1;
  EXPECT_HAS(config_error([&] { r.read("n", n, IntRange::positive()); }),
             "zero_optimization.n: 0 is out of range (allowed: >= 1)");
  int m = 0;
  EXPECT_HAS(config_error([&] { r.read("m", m, IntRange{std::numeric_limits<std::int64_t>::min(), -6}); }),
             "zero_optimization.m: -5 is out of range (allowed: <= -6)");
  EXPECT_TRUE(r.read("m", m, IntRange::at_least(-5)));
  EXPECT_EQ(m, -5);
  std::uint64_t big = 0;
  EXPECT_TRUE(r.read("big", big, IntRange::positive()));
  EXPECT_EQ(big, std::numeric_limits<std::uint64_t>::max());
  EXPECT_HAS(config_error([&] { r.read("big", big, IntRange{1, 100}); }), "allowed: 1..100");
  EXPECT_EQ(IntRange{}.describe(), "any integer");
}

TEST(JsonRange, RealRangesNamePathAndAllowedRange) {
  json::value doc = parse_json_text(R"({"lr": 0, "eps": -1e-8, "betas": [0.9, 1.0], "clip": 2})");
  ObjectReader r(doc, "optimizer.params");
  double lr = 1e-3;
  EXPECT_HAS(config_error([&] { r.read("lr", lr, RealRange::positive()); }),
             "optimizer.params.lr: 0 is out of range (allowed: > 0)");
  EXPECT_EQ(lr, 1e-3);
  double eps = 0;
  EXPECT_HAS(config_error([&] { r.read("eps", eps, RealRange::non_negative()); }), "(allowed: >= 0)");
  std::array<double, 2> betas{};
  EXPECT_HAS(config_error([&] { r.read("betas", betas, RealRange::half_open(0, 1)); }),
             "optimizer.params.betas[1]: 1 is out of range (allowed: >= 0 and < 1)");
  float clip = 0;
  EXPECT_HAS(config_error([&] { r.read("clip", clip, RealRange::closed(0, 1)); }), "(allowed: >= 0 and <= 1)");
  EXPECT_TRUE(r.read("clip", clip, RealRange::closed(0, 2)));
  EXPECT_EQ(clip, 2.0f);
  EXPECT_EQ(RealRange{}.describe(), "any number");
  EXPECT_EQ((RealRange{-1, 0, false, true}.describe()), ">= -1 and < 0");
}

// ---- ObjectReader --------------------------------------------------------------------------------

TEST(ObjectReader, OptionalKeysKeepDefaultsAndRequiredKeysMustExist) {
  json::value doc = parse_json_text(R"({"optimizer": {"params": {"lr": 1e-3}}})");
  ObjectReader root(doc, "");
  int absent = 7;
  EXPECT_FALSE(root.read("absent", absent));
  EXPECT_EQ(absent, 7);
  EXPECT_HAS(config_error([&] { root.require("train_batch_size", absent); }),
             "train_batch_size: missing required key; add \"train_batch_size\" to the top-level object");
  std::string type;
  EXPECT_HAS(config_error([&] { root.require_object("optimizer", [&](ObjectReader& o) { o.require("type", type); }); }),
             "optimizer.type: missing required key; add \"type\" to 'optimizer'");
  EXPECT_HAS(config_error([&] { root.require_object("scheduler", [](ObjectReader&) {}); }),
             "scheduler: missing required key");
  double lr = 0;
  EXPECT_HAS(config_error([&] { root.read_object("optimizer", [&](ObjectReader& o) {
                 o.read_object("params", [&](ObjectReader& p) { p.require("lr", lr, RealRange{1, 2, false, false}); });
                 o.ignore("type");
               }); }),
             "optimizer.params.lr: 0.001 is out of range (allowed: >= 1 and <= 2)");
}

TEST(ObjectReader, RejectsNonObjects) {
  json::value doc = parse_json_text(R"({"zero_optimization": {"offload_optimizer": "cpu"}})");
  EXPECT_HAS(config_error([&] { ObjectReader r(json::value(json::array{1, 2}), ""); }),
             "(top level): expected an object, got an array");
  ObjectReader root(doc, "");
  EXPECT_HAS(config_error([&] { root.read_object("zero_optimization", [](ObjectReader& z) {
                 z.read_object("offload_optimizer", [](ObjectReader&) {});
               }); }),
             "zero_optimization.offload_optimizer: expected an object, got a string (\"cpu\")");
}

TEST(ObjectReader, UnknownKeySuggestsNearestAndListsValidKeys) {
  json::value doc = parse_json_text(
      R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"devce": "cpu", "pin_memory": true}}})");
  ObjectReader root(doc, "");
  std::string msg = config_error([&] {
    root.read_object("zero_optimization", [](ObjectReader& z) {
      int stage = 0;
      z.read("stage", stage, IntRange{0, 3});
      z.read_object("offload_optimizer", [](ObjectReader& o) {
        std::string device;
        bool pin = false;
        std::string nvme;
        o.read_choice("device", device, {"none", "cpu", "nvme"});
        o.read("pin_memory", pin);
        o.read("nvme_path", nvme);
      });
    });
  });
  EXPECT_HAS(msg, "zero_optimization.offload_optimizer.devce: unknown key; did you mean 'device'?");
  EXPECT_HAS(msg, "valid keys in zero_optimization.offload_optimizer: device, nvme_path, pin_memory");
}

TEST(ObjectReader, UnknownKeyWithoutCloseMatchStillListsKeys) {
  json::value doc = parse_json_text(R"({"stgae": 1, "wall_clock": true, "zzz": 0})");
  ObjectReader r(doc, "");
  int stage = 0;
  r.read("stage", stage);
  r.read("steps_per_print", stage);
  std::string msg = config_error([&] { r.finish(); });
  EXPECT_HAS(msg, "stgae: unknown key; did you mean 'stage'?");  // a transposition is one edit
  EXPECT_HAS(msg, "valid keys in (top level): stage, steps_per_print");
  EXPECT_HAS(msg, "(also unknown: wall_clock, zzz)");

  json::value doc2 = parse_json_text(R"({"xyz": 1})");
  ObjectReader r2(doc2, "aio");
  r2.read("block_size", stage);
  msg = config_error([&] { r2.finish(); });
  EXPECT_HAS(msg, "aio.xyz: unknown key; valid keys in aio: block_size");
  EXPECT_LACKS(msg, "did you mean");
}

TEST(ObjectReader, ClosestMatchNeedsAPlausibleTypo) {
  std::vector<std::string> keys{"device", "nvme_path", "pin_memory", "buffer_count"};
  EXPECT_EQ(closest_match("devce", keys), "device");
  EXPECT_EQ(closest_match("Device", keys), "device");
  EXPECT_EQ(closest_match("pin_memroy", keys), "pin_memory");
  EXPECT_EQ(closest_match("buffer_cnt", keys), "buffer_count");
  EXPECT_EQ(closest_match("dev", keys), "");
  EXPECT_EQ(closest_match("stage", keys), "");
  EXPECT_EQ(closest_match("x", {}), "");
}

TEST(ObjectReader, UnsupportedKeysAreErrorsOnlyWhenPresent) {
  json::value doc = parse_json_text(R"({"sparse_attention": {"mode": "fixed"}, "flops_profiler": {}})");
  ObjectReader r(doc, "");
  std::string msg = config_error([&] { r.unsupported("sparse_attention", "zeroshard does not implement sparse attention yet"); });
  EXPECT_HAS(msg, "sparse_attention: this DeepSpeed key is not supported by zeroshard yet: zeroshard does not implement sparse attention yet");
  EXPECT_HAS(msg, "remove \"sparse_attention\"");

  json::value ok = parse_json_text(R"({"steps_per_print": 10})");
  ObjectReader r2(ok, "");
  EXPECT_NO_THROW(r2.unsupported("sparse_attention", "not implemented"));
  int steps = 0;
  r2.read("steps_per_print", steps);
  EXPECT_NO_THROW(r2.finish());
}

TEST(ObjectReader, RefusedKeysAreNeitherSuggestedNorListed) {
  json::value doc = parse_json_text(R"({"sparse_atention": {}})");
  ObjectReader r(doc, "");
  r.unsupported("sparse_attention", "not implemented");
  int steps = 0;
  r.read("steps_per_print", steps);
  std::string msg = config_error([&] { r.finish(); });
  EXPECT_HAS(msg, "sparse_atention: unknown key");
  EXPECT_HAS(msg, "valid keys in (top level): steps_per_print");
  EXPECT_EQ(msg.find("did you mean 'sparse_attention'"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("steps_per_print, sparse_attention"), std::string::npos) << msg;
}

TEST(ObjectReader, IgnoreAndFindDeclareKeys) {
  json::value doc = parse_json_text(R"({"wall_clock_breakdown": true, "lr": "auto"})");
  ObjectReader r(doc, "");
  r.ignore("wall_clock_breakdown");
  const json::value* lr = r.find("lr");
  ASSERT_NE(lr, nullptr);
  EXPECT_TRUE(lr->is_string());
  EXPECT_EQ(r.find("missing"), nullptr);
  EXPECT_NO_THROW(r.finish());
}

TEST(ObjectReader, AliasAcceptsEitherNameButNotBoth) {
  auto read_aio = [](const char* text) {
    json::value doc = parse_json_text(text);
    ObjectReader r(doc, "aio");
    r.alias("intra_op_parallelism", "thread_count");
    int threads = 1;
    r.read("intra_op_parallelism", threads, IntRange::positive());
    r.finish();
    return threads;
  };
  EXPECT_EQ(read_aio(R"({"intra_op_parallelism": 4})"), 4);
  EXPECT_EQ(read_aio(R"({"thread_count": 2})"), 2);
  EXPECT_EQ(read_aio(R"({})"), 1);
  EXPECT_HAS(config_error([&] { read_aio(R"({"thread_count": 2, "intra_op_parallelism": 4})"); }),
             "aio.intra_op_parallelism: both 'intra_op_parallelism' and its old name 'thread_count' are set; keep only "
             "'intra_op_parallelism'");
  EXPECT_HAS(config_error([&] { read_aio(R"({"thread_count": 0})"); }),
             "aio.thread_count: 0 is out of range (allowed: >= 1)");
  std::string msg = config_error([&] { read_aio(R"({"thread_cout": 2})"); });
  EXPECT_HAS(msg, "aio.thread_cout: unknown key; did you mean 'thread_count'?");
  EXPECT_HAS(msg, "valid keys in aio: intra_op_parallelism");
}

TEST(ObjectReader, ChoicesAndEnums) {
  json::value doc = parse_json_text(R"({"device": "nvm", "type": "AdamW", "bad": "disk", "num": 3})");
  ObjectReader r(doc, "offload");
  std::string device = "none";
  EXPECT_HAS(config_error([&] { r.read_choice("device", device, {"none", "cpu", "nvme"}); }),
             "offload.device: 'nvm' is not a valid choice; did you mean 'nvme'? use one of: none, cpu, nvme");
  EXPECT_HAS(config_error([&] { r.read_choice("bad", device, {"none", "cpu", "nvme"}); }),
             "offload.bad: 'disk' is not a valid choice; use one of: none, cpu, nvme");
  EXPECT_HAS(config_error([&] { r.read_choice("num", device, {"none"}); }), "offload.num: expected a string, got an integer");
  EXPECT_EQ(device, "none");
  std::string type;
  EXPECT_HAS(config_error([&] { r.read_choice("type", type, {"adam", "adamw"}); }), "'AdamW' is not a valid choice");
  EXPECT_TRUE(r.read_choice("type", type, {"adam", "adamw"}, MatchCase::kIgnore));
  EXPECT_EQ(type, "adamw");
  EXPECT_HAS(config_error([&] { r.require_choice("missing", type, {"a"}); }), "offload.missing: missing required key");

  enum class Kind { kAdam, kAdamW, kLion };
  Kind kind = Kind::kAdam;
  EXPECT_TRUE(r.read_enum("type", kind, {{"adam", Kind::kAdam}, {"adamw", Kind::kAdamW}, {"lion", Kind::kLion}},
                          MatchCase::kIgnore));
  EXPECT_EQ(kind, Kind::kAdamW);
  EXPECT_HAS(config_error([&] { r.read_enum("bad", kind, {{"adam", Kind::kAdam}, {"lion", Kind::kLion}}); }),
             "offload.bad: 'disk' is not a valid choice; use one of: adam, lion");
}

TEST(ObjectReader, ObjectArraysNameEachElement) {
  json::value doc = parse_json_text(R"({"layers": [{"size": 4}, {"size": 2.5}], "flat": [1]})");
  ObjectReader r(doc, "model");
  std::vector<int> sizes;
  EXPECT_HAS(config_error([&] { r.read_object_array("layers", [&](ObjectReader& l, std::size_t) {
                 int s = 0;
                 l.require("size", s);
                 sizes.push_back(s);
               }); }),
             "model.layers[1].size: expected an integer, got a number (2.5)");
  EXPECT_EQ(sizes, std::vector<int>{4});
  EXPECT_HAS(config_error([&] { r.read_object_array("flat", [](ObjectReader&, std::size_t) {}); }),
             "model.flat[0]: expected an object, got an integer");
  json::value doc2 = parse_json_text(R"({"layers": [{"size": 1, "sise": 2}]})");
  ObjectReader r2(doc2, "");
  EXPECT_HAS(config_error([&] { r2.read_object_array("layers", [](ObjectReader& l, std::size_t) {
                 int s = 0;
                 l.read("size", s);
               }); }),
             "layers[0].sise: unknown key; did you mean 'size'?");
}

// A DeepSpeed-style config read end to end into plain structs, from a file.
struct OffloadConfig {
  std::string device = "none";
  bool pin_memory = false;
};
struct DemoConfig {
  std::int64_t train_batch_size = 0;
  int stage = 0;
  std::size_t reduce_bucket_size = 500'000'000;
  OffloadConfig offload_optimizer;
  std::string optimizer_type;
  std::array<double, 2> betas{0.9, 0.999};
  double lr = 1e-3;
  int aio_threads = 1;
};

TEST(ObjectReader, ReadsDeepSpeedStyleConfigFile) {
  TempFile file("ds_config.json", R"({
    "train_batch_size": 32,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.8, 0.95]}},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e7,
                          "offload_optimizer": {"device": "cpu", "pin_memory": true}},
    "aio": {"thread_count": 8}
  })");
  json::value doc = parse_json_file(file.path());
  DemoConfig cfg;
  ObjectReader root(doc, "");
  root.require("train_batch_size", cfg.train_batch_size, IntRange::positive());
  root.read_object("optimizer", [&](ObjectReader& o) {
    o.require_choice("type", cfg.optimizer_type, {"adam", "adamw"}, MatchCase::kIgnore);
    o.read_object("params", [&](ObjectReader& p) {
      p.read("lr", cfg.lr, RealRange::positive());
      p.read("betas", cfg.betas, RealRange::half_open(0, 1));
    });
  });
  root.read_object("zero_optimization", [&](ObjectReader& z) {
    z.read("stage", cfg.stage, IntRange{0, 3});
    z.read("reduce_bucket_size", cfg.reduce_bucket_size, IntRange::positive());
    z.read_object("offload_optimizer", [&](ObjectReader& o) {
      o.read_choice("device", cfg.offload_optimizer.device, {"none", "cpu", "nvme"});
      o.read("pin_memory", cfg.offload_optimizer.pin_memory);
    });
  });
  root.read_object("aio", [&](ObjectReader& a) {
    a.alias("intra_op_parallelism", "thread_count");
    a.read("intra_op_parallelism", cfg.aio_threads, IntRange::positive());
  });
  root.unsupported("sparse_attention", "not implemented");
  root.finish();
  EXPECT_EQ(cfg.train_batch_size, 32);
  EXPECT_EQ(cfg.optimizer_type, "adamw");
  EXPECT_EQ(cfg.lr, 3e-4);
  EXPECT_EQ(cfg.betas, (std::array<double, 2>{0.8, 0.95}));
  EXPECT_EQ(cfg.stage, 2);
  EXPECT_EQ(cfg.reduce_bucket_size, 50'000'000u);
  EXPECT_EQ(cfg.offload_optimizer.device, "cpu");
  EXPECT_TRUE(cfg.offload_optimizer.pin_memory);
  EXPECT_EQ(cfg.aio_threads, 8);
}

}  // namespace
}  // namespace zs
