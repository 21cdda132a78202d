// Strict JSON reading for config files, on Boost.JSON.
//
//   boost::json::value doc = zs::parse_json_file("ds_config.json");
//   zs::ObjectReader root(doc, "");
//   root.read("train_batch_size", cfg.train_batch_size, zs::IntRange::positive());
//   root.read_object("zero_optimization", [&](zs::ObjectReader& z) {
//     z.read("stage", cfg.stage, zs::IntRange{0, 3});
//     z.read("reduce_bucket_size", cfg.reduce_bucket_size);          // 5e8 is accepted as an integer
//     z.read_object("offload_optimizer", [&](zs::ObjectReader& o) {
//       o.read_choice("device", cfg.device, {"none", "cpu", "nvme"});
//     });
//   });
//   root.unsupported("sparse_attention", "zeroshard does not implement sparse attention yet");
//   root.finish();   // an unknown key is a ConfigError with a did-you-mean
//
// Parsing is strict: no comments, no trailing commas, valid UTF-8, and a duplicate key anywhere is an
// error (Boost.JSON's own parse keeps one silently). Every error is a ConfigError whose message starts
// with the full JSON path (`zero_optimization.offload_optimizer.device`, arrays `betas[1]`) or, for
// syntax errors, with `file:line:column`.
//
// Thread-safety: free functions are reentrant; an ObjectReader is used by one thread at a time and
// refers to (does not copy) the value it reads, which must outlive it.
#pragma once

#include <boost/json/value.hpp>

#include <array>
#include <concepts>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/errors.h"

namespace zs {

// ---- JSON paths --------------------------------------------------------------------------------
// json_path_join("zero_optimization", "stage") == "zero_optimization.stage"; join("", "stage") ==
// "stage". A key that is not a plain word (empty, or holding '.', '[', ']', '"', ':', a space or a
// control character) is
// written quoted: `model["a.b"]`.
std::string json_path_join(std::string_view parent, std::string_view key);
// json_path_index("optimizer.params.betas", 1) == "optimizer.params.betas[1]".
std::string json_path_index(std::string_view parent, std::size_t index);
// The path as shown in messages: "(top level)" for the root's empty path.
std::string json_path_display(std::string_view path);
// "an integer", "a string", "an object", ... with a short rendering of scalars: `a number (2.5)`.
std::string json_describe(const boost::json::value& v);

// ---- Parsing -----------------------------------------------------------------------------------
// Parses one JSON document. `source_name` (a file name, or "<inline>") starts syntax-error messages:
// "cfg.json:3:17: invalid JSON: syntax error near '}'". Throws ConfigError.
boost::json::value parse_json_text(std::string_view text, std::string_view source_name = "<inline>");
// Reads and parses a file; a missing or unreadable file is a ConfigError naming the path.
boost::json::value parse_json_file(const std::filesystem::path& path);

// ---- Ranges ------------------------------------------------------------------------------------
// Inclusive integer range; max == INT64_MAX means "no upper bound" (so size_t values above INT64_MAX
// pass an unbounded range).
struct IntRange {
  std::int64_t min = std::numeric_limits<std::int64_t>::min();
  std::int64_t max = std::numeric_limits<std::int64_t>::max();

  static constexpr IntRange at_least(std::int64_t lo) { return {lo, std::numeric_limits<std::int64_t>::max()}; }
  static constexpr IntRange positive() { return at_least(1); }
  static constexpr IntRange non_negative() { return at_least(0); }
  bool contains(std::int64_t v) const { return v >= min && v <= max; }
  bool contains(std::uint64_t v) const;
  std::string describe() const;  // "0..3", ">= 1", "<= 7", "any integer"
};

// Real interval; each end may be open (excluded) and either may be infinite.
struct RealRange {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_open = false;
  bool max_open = false;

  static constexpr RealRange positive() { return {0.0, std::numeric_limits<double>::infinity(), true, false}; }
  static constexpr RealRange non_negative() { return {0.0, std::numeric_limits<double>::infinity(), false, false}; }
  static constexpr RealRange closed(double lo, double hi) { return {lo, hi, false, false}; }
  // [lo, hi): e.g. Adam betas are RealRange::half_open(0, 1).
  static constexpr RealRange half_open(double lo, double hi) { return {lo, hi, false, true}; }
  bool contains(double v) const;
  std::string describe() const;  // "> 0", ">= 0 and < 1", "any number"
};

enum class MatchCase { kExact, kIgnore };

// ---- Conversions -------------------------------------------------------------------------------
// from_json(v, path, out): converts one value or throws ConfigError naming `path` and saying what was
// expected and what was found. Integers accept a double with an integral value (`5e8`) but reject
// `2.5` and values outside the target type. Floating targets accept any finite number.
void from_json(const boost::json::value& v, std::string_view path, bool& out);
void from_json(const boost::json::value& v, std::string_view path, std::string& out);
void from_json(const boost::json::value& v, std::string_view path, double& out);
void from_json(const boost::json::value& v, std::string_view path, float& out);

namespace detail {
// Integer conversion, checked against [lo, hi] of the target type; `type` names it in messages.
std::int64_t json_to_signed(const boost::json::value& v, std::string_view path, std::int64_t lo, std::int64_t hi,
                            std::string_view type);
std::uint64_t json_to_unsigned(const boost::json::value& v, std::string_view path, std::uint64_t hi,
                               std::string_view type);
[[noreturn]] void throw_out_of_range(std::string_view path, std::string_view value_text, std::string_view allowed);
[[noreturn]] void throw_wrong_type(std::string_view path, std::string_view expected, const boost::json::value& got);
void check_array_size(const boost::json::value& v, std::string_view path, std::size_t n);

template <typename T>
constexpr std::string_view integer_type_name() {
  if constexpr (std::is_signed_v<T>) return sizeof(T) == 8 ? "a 64-bit integer" : sizeof(T) == 4 ? "a 32-bit integer" : "a small integer";
  else return sizeof(T) == 8 ? "a non-negative 64-bit integer" : sizeof(T) == 4 ? "a non-negative 32-bit integer" : "a small non-negative integer";
}
}  // namespace detail

template <std::integral T>
  requires(!std::same_as<T, bool> && !std::same_as<T, char>)
void from_json(const boost::json::value& v, std::string_view path, T& out) {
  if constexpr (std::is_signed_v<T>) {
    out = static_cast<T>(detail::json_to_signed(v, path, std::numeric_limits<T>::min(), std::numeric_limits<T>::max(),
                                                detail::integer_type_name<T>()));
  } else {
    out = static_cast<T>(detail::json_to_unsigned(v, path, std::numeric_limits<T>::max(), detail::integer_type_name<T>()));
  }
}

template <typename T>
void from_json(const boost::json::value& v, std::string_view path, std::vector<T>& out) {
  const boost::json::array* a = v.if_array();
  if (a == nullptr) detail::throw_wrong_type(path, "an array", v);
  std::vector<T> result(a->size());
  for (std::size_t i = 0; i < a->size(); ++i) from_json((*a)[i], json_path_index(path, i), result[i]);
  out = std::move(result);
}

template <typename T, std::size_t N>
void from_json(const boost::json::value& v, std::string_view path, std::array<T, N>& out) {
  detail::check_array_size(v, path, N);
  const boost::json::array& a = v.get_array();
  std::array<T, N> result{};
  for (std::size_t i = 0; i < N; ++i) from_json(a[i], json_path_index(path, i), result[i]);
  out = result;
}

// check_range(path, value, range): throws ConfigError "path: 4 is out of range (allowed: 0..3)".
// Arrays are checked element by element, naming `path[i]`.
void check_range(std::string_view path, std::int64_t v, const IntRange& range);
void check_range(std::string_view path, std::uint64_t v, const IntRange& range);
void check_range(std::string_view path, double v, const RealRange& range);
template <std::integral T>
void check_range(std::string_view path, T v, const IntRange& range) {
  if constexpr (std::is_signed_v<T>) check_range(path, static_cast<std::int64_t>(v), range);
  else check_range(path, static_cast<std::uint64_t>(v), range);
}
inline void check_range(std::string_view path, float v, const RealRange& range) {
  check_range(path, static_cast<double>(v), range);
}
template <typename T, typename R>
void check_range(std::string_view path, const std::vector<T>& v, const R& range) {
  for (std::size_t i = 0; i < v.size(); ++i) check_range(json_path_index(path, i), v[i], range);
}
template <typename T, std::size_t N, typename R>
void check_range(std::string_view path, const std::array<T, N>& v, const R& range) {
  for (std::size_t i = 0; i < N; ++i) check_range(json_path_index(path, i), v[i], range);
}

// The closest candidate to `word` by edit distance (with transpositions, ignoring case), or "" when
// none is close enough to be a plausible typo.
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

// ---- ObjectReader ------------------------------------------------------------------------------
// Reads one JSON object into a struct, key by key. Every read/require/unsupported/ignore/find call
// declares its key as known; finish() then rejects any other key in the object. A reader that is not
// finished accepts unknown keys silently, so always call finish() (read_object does it for you).
class ObjectReader {
 public:
  // `path` is the object's own JSON path ("" for the root). Throws ConfigError if `value` is not an
  // object.
  ObjectReader(const boost::json::value& value, std::string path);

  const std::string& path() const { return path_; }
  const boost::json::object& object() const { return *object_; }
  // The full path of `key` in this object.
  std::string path_of(std::string_view key) const { return json_path_join(path_, key); }

  // Accepts `old_name` as another name for `key` (a renamed DeepSpeed key). Call before reading
  // `key`. Both names present is a ConfigError.
  void alias(std::string_view key, std::string_view old_name);

  // Optional key: returns false and leaves `out` (its default) alone when absent.
  template <typename T>
  bool read(std::string_view key, T& out) {
    Found f = take(key);
    if (f.value == nullptr) return false;
    from_json(*f.value, f.path, out);
    return true;
  }
  template <typename T, typename R>
    requires(std::same_as<R, IntRange> || std::same_as<R, RealRange>)
  bool read(std::string_view key, T& out, const R& range) {
    Found f = take(key);
    if (f.value == nullptr) return false;
    T tmp{};
    from_json(*f.value, f.path, tmp);
    check_range(f.path, tmp, range);
    out = std::move(tmp);
    return true;
  }
  // Required key: a ConfigError naming the path when absent.
  template <typename T, typename... Range>
  void require(std::string_view key, T& out, const Range&... range) {
    if (!read(key, out, range...)) throw_missing(key);
  }

  // A string from a fixed set ("path: 'gpu' is not a valid choice; use one of: none, cpu, nvme").
  // With MatchCase::kIgnore, `out` receives the spelling from `choices`.
  bool read_choice(std::string_view key, std::string& out, std::initializer_list<std::string_view> choices,
                   MatchCase match = MatchCase::kExact);
  void require_choice(std::string_view key, std::string& out, std::initializer_list<std::string_view> choices,
                      MatchCase match = MatchCase::kExact);
  // An enum from named choices: read_enum("device", dev, {{"cpu", Device::kCpu}, {"nvme", Device::kNvme}}).
  template <typename E>
  bool read_enum(std::string_view key, E& out, std::initializer_list<std::pair<std::string_view, E>> choices,
                 MatchCase match = MatchCase::kExact) {
    std::vector<std::string_view> names;
    for (const auto& c : choices) names.push_back(c.first);
    Found f = take(key);
    if (f.value == nullptr) return false;
    out = (choices.begin() + match_choice(*f.value, f.path, names, match))->second;
    return true;
  }

  // Nested object: runs fill(sub) with a reader for it, then sub.finish(). Returns false if absent.
  template <typename F>
  bool read_object(std::string_view key, F&& fill) {
    Found f = take(key);
    if (f.value == nullptr) return false;
    ObjectReader sub(*f.value, f.path);
    fill(sub);
    sub.finish();
    return true;
  }
  template <typename F>
  void require_object(std::string_view key, F&& fill) {
    if (!read_object(key, std::forward<F>(fill))) throw_missing(key);
  }
  // Array of objects: runs fill(sub, index) for each element (`path[i]`), finishing each.
  template <typename F>
  bool read_object_array(std::string_view key, F&& fill) {
    Found f = take(key);
    if (f.value == nullptr) return false;
    const boost::json::array* a = f.value->if_array();
    if (a == nullptr) detail::throw_wrong_type(f.path, "an array of objects", *f.value);
    for (std::size_t i = 0; i < a->size(); ++i) {
      ObjectReader sub((*a)[i], json_path_index(f.path, i));
      fill(sub, i);
      sub.finish();
    }
    return true;
  }

  // A DeepSpeed key zeroshard does not implement: present is a ConfigError giving `reason`.
  void unsupported(std::string_view key, std::string_view reason);
  // A DeepSpeed switch whose false (off) is what zeroshard does: false accepted, true a ConfigError
  // ("true enables a DeepSpeed feature that is not supported by zeroshard yet[: reason]").
  void unsupported_if_true(std::string_view key, std::string_view reason = {});
  // A key accepted and deliberately without effect (say why at the call site).
  void ignore(std::string_view key);
  // The keys of the format this object follows (DeepSpeed's tables, engine/detail/deepspeed_keys.h).
  // finish() reports a key from this list that nothing declared as "not supported by zeroshard yet"
  // (`what` names the format: "DeepSpeed"), never as an unknown key with a did-you-mean.
  void known_keys(const std::vector<std::string_view>& keys, std::string_view what);
  // Raw access for values read by hand (declares the key): nullptr when absent.
  const boost::json::value* find(std::string_view key);

  // Rejects every key not declared: "a.b.devce: unknown key; did you mean 'device'? Valid keys in
  // a.b: device, nvme_path, pin_memory". A key of known_keys() that was not declared is reported
  // first: "a.b.zenflow: this DeepSpeed key is not supported by zeroshard yet; remove ...".
  void finish();

 private:
  struct Found {
    const boost::json::value* value = nullptr;
    std::string path;  // the path of the key actually present (the alias's, when that was used)
  };
  Found take(std::string_view key);
  [[noreturn]] void throw_missing(std::string_view key) const;
  std::size_t match_choice(const boost::json::value& v, const std::string& path,
                           const std::vector<std::string_view>& choices, MatchCase match) const;

  const boost::json::object* object_;
  std::string path_;
  std::vector<std::string> known_;                               // declared keys, in order
  std::vector<std::string> refused_;                             // declared through unsupported()
  std::vector<std::pair<std::string, std::string>> aliases_;     // (key, old name)
  std::vector<std::string_view> format_keys_;                    // known_keys(): the format's whole table
  std::string format_name_;
};

}  // namespace zs
