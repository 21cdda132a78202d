#include "core/json.h"

#include <boost/json/basic_parser_impl.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value_stack.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <fstream>
#include <sstream>
#include <unordered_set>

namespace zs {
namespace json = boost::json;

// ---- Paths -------------------------------------------------------------------------------------

namespace {

bool is_plain_key(std::string_view key) {
  if (key.empty()) return false;
  return std::none_of(key.begin(), key.end(), [](char c) {
    // ':' too, so a message "path: what is wrong" always splits at the path's end.
    return c == '.' || c == '[' || c == ']' || c == '"' || c == ' ' || c == ':' || static_cast<unsigned char>(c) < 0x20;
  });
}

}  // namespace

std::string json_path_join(std::string_view parent, std::string_view key) {
  if (!is_plain_key(key)) return fmt::format("{}[{}]", parent, json::serialize(json::string_view(key.data(), key.size())));
  if (parent.empty()) return std::string(key);
  return fmt::format("{}.{}", parent, key);
}

std::string json_path_index(std::string_view parent, std::size_t index) {
  return fmt::format("{}[{}]", parent, index);
}

std::string json_path_display(std::string_view path) { return path.empty() ? "(top level)" : std::string(path); }

namespace {

// Doubles as people write them (2.5, 3000000000), not Boost's 2.5E0.
std::string render(const json::value& v) {
  if (v.is_double()) return fmt::format("{}", v.get_double());
  return json::serialize(v);
}

}  // namespace

std::string json_describe(const json::value& v) {
  auto shown = [&](const char* what) {
    std::string text = render(v);
    if (text.size() > 40) text = text.substr(0, 37) + "...";
    return fmt::format("{} ({})", what, text);
  };
  switch (v.kind()) {
    case json::kind::null: return "null";
    case json::kind::bool_: return shown("a boolean");
    case json::kind::int64:
    case json::kind::uint64: return shown("an integer");
    case json::kind::double_: return shown("a number");
    case json::kind::string: return shown("a string");
    case json::kind::array: return "an array";
    case json::kind::object: return "an object";
  }
  return "an unknown JSON value";
}

// ---- Parsing -----------------------------------------------------------------------------------

namespace {

// Note [duplicate keys]: Boost.JSON 1.81 builds objects from the parsed key/value pairs and keeps one
// of two equal keys without telling anyone. A config with "stage": 1 ... "stage": 3 is almost always
// an editing mistake, so we parse with basic_parser and a handler that builds the same value (through
// value_stack, as boost::json::parser does), tracks the JSON path, and stops at the first repeated
// key. Stopping makes write_some return the offset of the key's closing quote, which gives the line.
class StrictHandler {
 public:
  static constexpr std::size_t max_object_size = json::object::max_size();
  static constexpr std::size_t max_array_size = json::array::max_size();
  static constexpr std::size_t max_key_size = json::string::max_size();
  static constexpr std::size_t max_string_size = json::string::max_size();

  bool on_document_begin(json::error_code&) { return true; }
  bool on_document_end(json::error_code&) { return true; }
  bool on_object_begin(json::error_code&) {
    frames_.push_back(Frame{true, child_path(), {}, 0, {}});
    return true;
  }
  bool on_object_end(std::size_t n, json::error_code&) {
    frames_.pop_back();
    stack_.push_object(n);
    return value_done();
  }
  bool on_array_begin(json::error_code&) {
    frames_.push_back(Frame{false, child_path(), {}, 0, {}});
    return true;
  }
  bool on_array_end(std::size_t n, json::error_code&) {
    frames_.pop_back();
    stack_.push_array(n);
    return value_done();
  }
  bool on_key_part(json::string_view s, std::size_t, json::error_code&) {
    key_.append(s.data(), s.size());
    stack_.push_chars(s);
    return true;
  }
  bool on_key(json::string_view s, std::size_t, json::error_code& ec) {
    key_.append(s.data(), s.size());
    Frame& top = frames_.back();
    if (!top.keys.insert(key_).second) {
      duplicate_path_ = json_path_join(top.path, key_);
      ec = json::error::exception;  // any error: we report duplicate_path_ ourselves
      return false;
    }
    top.key = std::move(key_);
    key_.clear();
    stack_.push_key(s);
    return true;
  }
  bool on_string_part(json::string_view s, std::size_t, json::error_code&) {
    stack_.push_chars(s);
    return true;
  }
  bool on_string(json::string_view s, std::size_t, json::error_code&) {
    stack_.push_string(s);
    return value_done();
  }
  bool on_number_part(json::string_view, json::error_code&) { return true; }
  bool on_int64(std::int64_t i, json::string_view, json::error_code&) {
    stack_.push_int64(i);
    return value_done();
  }
  bool on_uint64(std::uint64_t u, json::string_view, json::error_code&) {
    stack_.push_uint64(u);
    return value_done();
  }
  bool on_double(double d, json::string_view, json::error_code&) {
    stack_.push_double(d);
    return value_done();
  }
  bool on_bool(bool b, json::error_code&) {
    stack_.push_bool(b);
    return value_done();
  }
  bool on_null(json::error_code&) {
    stack_.push_null();
    return value_done();
  }
  bool on_comment_part(json::string_view, json::error_code&) { return true; }
  bool on_comment(json::string_view, json::error_code&) { return true; }

  void reset() { stack_.reset(); }
  json::value release() { return stack_.release(); }
  const std::string& duplicate_path() const { return duplicate_path_; }

 private:
  struct Frame {
    bool is_object;
    std::string path;
    std::unordered_set<std::string> keys;  // objects: keys seen so far
    std::size_t index;                     // arrays: index of the next element
    std::string key;                       // objects: the key whose value comes next
  };

  std::string child_path() const {
    if (frames_.empty()) return "";
    const Frame& top = frames_.back();
    return top.is_object ? json_path_join(top.path, top.key) : json_path_index(top.path, top.index);
  }
  bool value_done() {
    if (!frames_.empty() && !frames_.back().is_object) ++frames_.back().index;
    return true;
  }

  json::value_stack stack_;
  std::vector<Frame> frames_;
  std::string key_;
  std::string duplicate_path_;
};

struct LineColumn {
  std::size_t line;
  std::size_t column;
};

LineColumn line_column(std::string_view text, std::size_t offset) {
  offset = std::min(offset, text.size());
  std::string_view before = text.substr(0, offset);
  std::size_t line = 1 + static_cast<std::size_t>(std::count(before.begin(), before.end(), '\n'));
  std::size_t last_nl = before.rfind('\n');
  std::size_t column = last_nl == std::string_view::npos ? offset + 1 : offset - last_nl;
  return {line, column};
}

// The opening quote of the key whose closing quote is at `close` (keys never span lines).
std::size_t key_start(std::string_view text, std::size_t close) {
  for (std::size_t i = close; i-- > 0;) {
    if (text[i] == '\n') break;
    if (text[i] != '"') continue;
    std::size_t slashes = 0;
    while (slashes < i && text[i - 1 - slashes] == '\\') ++slashes;
    if (slashes % 2 == 0) return i;
  }
  return close;
}

std::string near_text(std::string_view text, std::size_t offset) {
  if (offset >= text.size()) return "at the end of the input";
  std::string snippet;
  for (std::size_t i = offset; i < text.size() && snippet.size() < 12 && text[i] != '\n' && text[i] != '\r'; ++i) {
    snippet.push_back(text[i]);
  }
  return snippet.empty() ? "at the end of the line" : fmt::format("near '{}'", printable(snippet));
}

}  // namespace

json::value parse_json_text(std::string_view text, std::string_view source_name) {
  if (text.substr(0, 3) == "\xEF\xBB\xBF") {
    throw ConfigError(fmt::format("{}:1:1: invalid JSON: the text starts with a UTF-8 byte order mark; save the "
                                  "file as UTF-8 without BOM",
                                  source_name));
  }
  json::parse_options options;  // strict: no comments, no trailing commas, valid UTF-8 only
  options.max_depth = 64;
  json::basic_parser<StrictHandler> parser(options);
  parser.handler().reset();
  json::error_code ec;
  std::size_t consumed = parser.write_some(false, text.data(), text.size(), ec);
  if (!parser.handler().duplicate_path().empty()) {
    LineColumn at = line_column(text, key_start(text, consumed));
    throw ConfigError(fmt::format("{}:{}:{}: duplicate key '{}' (the same key appears earlier in this object; keep "
                                  "only one)",
                                  source_name, at.line, at.column, parser.handler().duplicate_path()));
  }
  if (!ec && consumed < text.size()) ec = json::error::extra_data;  // "{} {}": one document per text
  if (ec && text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    throw ConfigError(fmt::format("{}: invalid JSON: the text is empty (a config file holds one JSON object)",
                                  source_name));
  }
  if (ec) {
    LineColumn at = line_column(text, consumed);
    throw ConfigError(fmt::format("{}:{}:{}: invalid JSON: {} {} (strict JSON: no comments, no trailing commas, "
                                  "strings in double quotes)",
                                  source_name, at.line, at.column, ec.message(), near_text(text, consumed)));
  }
  return parser.handler().release();
}

json::value parse_json_file(const std::filesystem::path& path) {
  std::error_code fs_ec;
  if (std::filesystem::is_directory(path, fs_ec)) {
    throw ConfigError(fmt::format("cannot read JSON file '{}': it is a directory (pass the path of a .json file)",
                                  path.string()));
  }
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    int err = errno;
    throw ConfigError(fmt::format("cannot open JSON file '{}': {} (check the path and its permissions)", path.string(),
                                  err != 0 ? detail::errno_text(err) : std::string("open failed")));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) {
    throw ConfigError(fmt::format("cannot read JSON file '{}': {}", path.string(), detail::errno_text(errno)));
  }
  return parse_json_text(buffer.str(), path.string());
}

// ---- Ranges ------------------------------------------------------------------------------------

bool IntRange::contains(std::uint64_t v) const {
  if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return max == std::numeric_limits<std::int64_t>::max();
  }
  return contains(static_cast<std::int64_t>(v));
}

std::string IntRange::describe() const {
  bool has_min = min != std::numeric_limits<std::int64_t>::min();
  bool has_max = max != std::numeric_limits<std::int64_t>::max();
  if (has_min && has_max) return fmt::format("{}..{}", min, max);
  if (has_min) return fmt::format(">= {}", min);
  if (has_max) return fmt::format("<= {}", max);
  return "any integer";
}

bool RealRange::contains(double v) const {
  if (min_open ? !(v > min) : !(v >= min)) return false;
  if (max_open ? !(v < max) : !(v <= max)) return false;
  return true;
}

std::string RealRange::describe() const {
  std::string lo = std::isinf(min) ? "" : fmt::format("{} {}", min_open ? ">" : ">=", min);
  std::string hi = std::isinf(max) ? "" : fmt::format("{} {}", max_open ? "<" : "<=", max);
  if (lo.empty() && hi.empty()) return "any number";
  if (lo.empty()) return hi;
  if (hi.empty()) return lo;
  return lo + " and " + hi;
}

void check_range(std::string_view path, std::int64_t v, const IntRange& range) {
  if (!range.contains(v)) detail::throw_out_of_range(path, fmt::format("{}", v), range.describe());
}
void check_range(std::string_view path, std::uint64_t v, const IntRange& range) {
  if (!range.contains(v)) detail::throw_out_of_range(path, fmt::format("{}", v), range.describe());
}
void check_range(std::string_view path, double v, const RealRange& range) {
  if (!range.contains(v)) detail::throw_out_of_range(path, fmt::format("{}", v), range.describe());
}

// ---- Conversions -------------------------------------------------------------------------------

namespace detail {

void throw_out_of_range(std::string_view path, std::string_view value_text, std::string_view allowed) {
  throw ConfigError(fmt::format("{}: {} is out of range (allowed: {})", json_path_display(path), value_text, allowed));
}

void throw_wrong_type(std::string_view path, std::string_view expected, const json::value& got) {
  throw ConfigError(fmt::format("{}: expected {}, got {}", json_path_display(path), expected, json_describe(got)));
}

void check_array_size(const json::value& v, std::string_view path, std::size_t n) {
  const json::array* a = v.if_array();
  if (a == nullptr) throw_wrong_type(path, fmt::format("an array of {} elements", n), v);
  if (a->size() != n) {
    throw ConfigError(fmt::format("{}: expected an array of {} elements, got {} elements", json_path_display(path), n,
                                  a->size()));
  }
}

namespace {

// Note [integral doubles]: DeepSpeed configs write integers as 5e8, which Boost.JSON parses as a
// double. We accept a double that is finite, whole and inside the target type; 2.5 is an error, never
// rounded. 2^63 and 2^64 are exact doubles, so the bound checks below are exact.
struct WholeNumber {
  bool negative;
  std::uint64_t magnitude;
};

WholeNumber json_whole_number(const json::value& v, std::string_view path, std::string_view type) {
  switch (v.kind()) {
    case json::kind::int64: {
      std::int64_t i = v.get_int64();
      return i < 0 ? WholeNumber{true, 0 - static_cast<std::uint64_t>(i)} : WholeNumber{false, static_cast<std::uint64_t>(i)};
    }
    case json::kind::uint64: return {false, v.get_uint64()};
    case json::kind::double_: {
      double d = v.get_double();
      if (!std::isfinite(d) || d != std::trunc(d)) {
        throw ConfigError(fmt::format("{}: expected an integer, got {} (a whole number is needed here)",
                                      json_path_display(path), json_describe(v)));
      }
      double mag = std::fabs(d);
      if (mag >= 18446744073709551616.0) {
        throw_out_of_range(path, render(v), fmt::format("the range of {}", type));
      }
      return {d < 0, static_cast<std::uint64_t>(mag)};
    }
    default: throw_wrong_type(path, "an integer", v);
  }
}

}  // namespace

std::int64_t json_to_signed(const json::value& v, std::string_view path, std::int64_t lo, std::int64_t hi,
                            std::string_view type) {
  WholeNumber w = json_whole_number(v, path, type);
  auto out_of_type = [&]() {
    throw_out_of_range(path, render(v), fmt::format("{}..{}, the range of {}", lo, hi, type));
  };
  if (w.negative) {
    if (w.magnitude > 0 - static_cast<std::uint64_t>(lo)) out_of_type();
    return static_cast<std::int64_t>(0 - w.magnitude);  // two's complement, exact for INT64_MIN too
  }
  if (w.magnitude > static_cast<std::uint64_t>(hi)) out_of_type();
  return static_cast<std::int64_t>(w.magnitude);
}

std::uint64_t json_to_unsigned(const json::value& v, std::string_view path, std::uint64_t hi, std::string_view type) {
  WholeNumber w = json_whole_number(v, path, type);
  if ((w.negative && w.magnitude != 0) || w.magnitude > hi) {
    throw_out_of_range(path, render(v), fmt::format("0..{}, the range of {}", hi, type));
  }
  return w.magnitude;
}

}  // namespace detail

void from_json(const json::value& v, std::string_view path, bool& out) {
  if (!v.is_bool()) detail::throw_wrong_type(path, "a boolean (true or false)", v);
  out = v.get_bool();
}

void from_json(const json::value& v, std::string_view path, std::string& out) {
  if (!v.is_string()) detail::throw_wrong_type(path, "a string", v);
  out.assign(v.get_string().data(), v.get_string().size());
}

void from_json(const json::value& v, std::string_view path, double& out) {
  if (!v.is_number()) detail::throw_wrong_type(path, "a number", v);
  double d = v.to_number<double>();
  if (!std::isfinite(d)) detail::throw_out_of_range(path, render(v), "finite numbers");
  out = d;
}

void from_json(const json::value& v, std::string_view path, float& out) {
  double d = 0;
  from_json(v, path, d);
  if (std::fabs(d) > static_cast<double>(std::numeric_limits<float>::max())) {
    detail::throw_out_of_range(path, render(v), "the range of a 32-bit float");
  }
  out = static_cast<float>(d);
}

// ---- Did-you-mean ------------------------------------------------------------------------------

namespace {

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

// Optimal string alignment distance (Levenshtein plus adjacent transpositions), case-insensitive:
// "devcie" -> "device" is one edit.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t cost = lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) && lower(a[i - 2]) == lower(b[j - 1])) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

std::string join_sorted(std::vector<std::string> names) {
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "(none)" : out;
}

bool equal_ignoring_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return lower(x) == lower(y); });
}

// The '_'-separated words of a key, lower-cased and sorted: "comm_overlap" and "overlap_comm" agree.
std::vector<std::string> sorted_words(std::string_view key) {
  std::vector<std::string> words(1);
  for (char c : key) {
    if (c == '_') words.emplace_back();
    else words.back() += lower(c);
  }
  std::sort(words.begin(), words.end());
  return words;
}

}  // namespace

std::string closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  // The same words in another order is the likeliest slip of all (an old config's "comm_overlap" for
  // "overlap_comm"), however many edits it takes.
  const std::vector<std::string> words = sorted_words(word);
  if (words.size() > 1) {
    for (const auto& c : candidates) {
      if (sorted_words(c) == words) return c;
    }
  }
  // A typo is a few edits: allow one edit per three characters of the longer word, at least one.
  std::string best;
  std::size_t best_distance = std::numeric_limits<std::size_t>::max();
  for (const auto& c : candidates) {
    std::size_t limit = std::max<std::size_t>(1, std::max(word.size(), c.size()) / 3);
    std::size_t d = edit_distance(word, c);
    if (d <= limit && (d < best_distance || (d == best_distance && c < best))) {
      best = c;
      best_distance = d;
    }
  }
  return best;
}

// ---- ObjectReader ------------------------------------------------------------------------------

ObjectReader::ObjectReader(const json::value& value, std::string path) : path_(std::move(path)) {
  object_ = value.if_object();
  if (object_ == nullptr) detail::throw_wrong_type(path_, "an object", value);
}

void ObjectReader::alias(std::string_view key, std::string_view old_name) {
  aliases_.emplace_back(std::string(key), std::string(old_name));
  known_.emplace_back(old_name);
  if (object_->contains(key) && object_->contains(old_name)) {
    throw ConfigError(fmt::format("{}: both '{}' and its old name '{}' are set; keep only '{}'", path_of(key), key,
                                  old_name, key));
  }
}

ObjectReader::Found ObjectReader::take(std::string_view key) {
  known_.emplace_back(key);
  if (const json::value* v = object_->if_contains(key)) return {v, path_of(key)};
  for (const auto& [name, old_name] : aliases_) {
    if (name != key) continue;
    if (const json::value* v = object_->if_contains(old_name)) return {v, path_of(old_name)};
  }
  return {};
}

void ObjectReader::throw_missing(std::string_view key) const {
  throw ConfigError(fmt::format("{}: missing required key; add \"{}\" to {}", path_of(key), key,
                                path_.empty() ? std::string("the top-level object") : fmt::format("'{}'", path_)));
}

std::size_t ObjectReader::match_choice(const json::value& v, const std::string& path,
                                       const std::vector<std::string_view>& choices, MatchCase match) const {
  std::string text;
  from_json(v, path, text);
  for (std::size_t i = 0; i < choices.size(); ++i) {
    if (text == choices[i] || (match == MatchCase::kIgnore && equal_ignoring_case(text, choices[i]))) return i;
  }
  std::vector<std::string> names(choices.begin(), choices.end());
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  std::string hint = closest_match(text, names);
  throw ConfigError(fmt::format("{}: '{}' is not a valid choice; {}use one of: {}", json_path_display(path), printable(text),
                                hint.empty() ? "" : fmt::format("did you mean '{}'? ", hint), list));
}

bool ObjectReader::read_choice(std::string_view key, std::string& out, std::initializer_list<std::string_view> choices,
                               MatchCase match) {
  Found f = take(key);
  if (f.value == nullptr) return false;
  std::vector<std::string_view> names(choices.begin(), choices.end());
  out = std::string(names[match_choice(*f.value, f.path, names, match)]);
  return true;
}

void ObjectReader::require_choice(std::string_view key, std::string& out,
                                  std::initializer_list<std::string_view> choices, MatchCase match) {
  if (!read_choice(key, out, choices, match)) throw_missing(key);
}

void ObjectReader::unsupported(std::string_view key, std::string_view reason) {
  known_.emplace_back(key);
  refused_.emplace_back(key);
  if (object_->contains(key)) {
    throw ConfigError(fmt::format("{}: this DeepSpeed key is not supported by zeroshard yet: {}; remove \"{}\" from the "
                                  "config",
                                  path_of(key), reason, key));
  }
}

void ObjectReader::unsupported_if_true(std::string_view key, std::string_view reason) {
  bool on = false;
  if (read(key, on) && on) {
    throw ConfigError(fmt::format("{}: true enables a DeepSpeed feature that is not supported by zeroshard yet{}{}; set it "
                                  "to false or remove \"{}\"",
                                  path_of(key), reason.empty() ? "" : ": ", reason, key));
  }
}

void ObjectReader::ignore(std::string_view key) { known_.emplace_back(key); }

void ObjectReader::known_keys(const std::vector<std::string_view>& keys, std::string_view what) {
  format_keys_.insert(format_keys_.end(), keys.begin(), keys.end());
  format_name_ = what;
}

const json::value* ObjectReader::find(std::string_view key) { return take(key).value; }

void ObjectReader::finish() {
  std::vector<std::string> unknown;
  for (const auto& kv : *object_) {
    std::string_view k(kv.key().data(), kv.key().size());
    if (std::find(known_.begin(), known_.end(), k) == known_.end()) unknown.emplace_back(k);
  }
  if (unknown.empty()) return;
  // A real key of the format (DeepSpeed's) that zeroshard lacks is a missing feature, not a typo.
  for (const auto& k : unknown) {
    if (std::find(format_keys_.begin(), format_keys_.end(), k) == format_keys_.end()) continue;
    throw ConfigError(fmt::format("{}: this {} key is not supported by zeroshard yet; remove \"{}\" from the config",
                                  path_of(k), format_name_, k));
  }
  // Only keys a user can actually use are suggested, and old names (accepted) are not advertised in
  // the list; refused (unsupported) keys would only lead to the next error.
  std::vector<std::string> usable, listed;
  for (const auto& k : known_) {
    if (std::find(refused_.begin(), refused_.end(), k) != refused_.end()) continue;
    usable.push_back(k);
    bool is_old = std::any_of(aliases_.begin(), aliases_.end(), [&](const auto& a) { return a.second == k; });
    if (!is_old) listed.push_back(k);
  }
  std::string hint = closest_match(unknown.front(), usable);
  std::string others;
  for (std::size_t i = 1; i < unknown.size(); ++i) others += (others.empty() ? "" : ", ") + path_of(unknown[i]);
  throw ConfigError(fmt::format("{}: unknown key; {}valid keys in {}: {}{}", path_of(unknown.front()),
                                hint.empty() ? "" : fmt::format("did you mean '{}'? ", hint),
                                json_path_display(path_), join_sorted(listed),
                                others.empty() ? "" : fmt::format(" (also unknown: {})", others)));
}

}  // namespace zs
