// Typed errors, assertions and the check macro pattern for C libraries.
//
// Two kinds of failure (after PyTorch c10):
//   - wrong user input (config, files, arguments, environment, the user's model) throws a typed Error
//     subclass whose message names what is wrong and how to fix it;
//   - a broken internal invariant is a bug: ZS_ASSERT (always on) / ZS_DEBUG_ASSERT (debug builds)
//     throw InternalError with file and line.
// Library code never calls exit() or abort(); the tool at the edge decides how a process ends.
//
//   if (stage > 3) throw ConfigError("zero_optimization.stage: expected 0..3, got 4");
//   ZS_ASSERT(offset + size <= capacity_, "block {} past the arena end", offset);
//   ZS_SYS_CHECK(::fsync(fd), "fsync of '{}'", path);   // keeps errno's text
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace zs {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A config file or value is wrong. The message names the JSON path.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A device or host allocation did not fit. The message names the request, its category and the
// pool statistics.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

// A collective failed, timed out or was mismatched across ranks. The message names the collective,
// the group and the sizes.
class CommError : public Error {
 public:
  using Error::Error;
};

// A file or device I/O operation failed. The message names the file.
class IoError : public Error {
 public:
  using Error::Error;
};

// A checkpoint is missing, corrupt or incompatible. The message names the file and the field.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// The user's model breaks a rule the engine relies on while it runs: modules fetched in a different
// order from one step to the next at ZeRO stage 3, a different set of modules run. Not a config
// mistake (no setting fixes it); the message names the module and what the model must do instead.
class ModelError : public Error {
 public:
  using Error::Error;
};

// A call into the library with an argument that cannot be right whatever the config: a parameter
// name that is not in the model, an index out of range. The message names the argument and what is
// accepted.
class UsageError : public Error {
 public:
  using Error::Error;
};

// A broken internal invariant: a bug in zeroshard, never the user's fault.
class InternalError : public Error {
 public:
  using Error::Error;
};

// Text read from a file (a `latest` tag, a name in a checkpoint's metadata, a config string), made
// safe to quote in a message: printable ASCII and well-formed UTF-8 are kept, every other byte
// (control characters, bytes that are not UTF-8) becomes \xNN, so a corrupt file cannot put raw
// bytes on the terminal or into a log, and the message shows which bytes they were:
// printable("global_st\xe5p4") == "global_st\\xe5p4" (the four characters \ x e 5).
std::string printable(std::string_view text);

namespace detail {

[[noreturn]] void throw_assert_failure(const char* cond, const char* file, int line, std::string_view msg);

template <typename E>
[[noreturn]] void throw_library_error(std::string_view library, std::string_view what, std::string_view library_text,
                                      const char* file, int line) {
  throw E(fmt::format("{}: {} ({} at {}:{})", what, library_text, library, file, line));
}

// strerror_r wrapper: the text for errno value `err`.
std::string errno_text(int err);

}  // namespace detail
}  // namespace zs

#define ZS_ASSERT(cond, ...)                                                                      \
  do {                                                                                            \
    if (!(cond)) [[unlikely]] {                                                                   \
      ::zs::detail::throw_assert_failure(#cond, __FILE__, __LINE__, ::fmt::format("" __VA_ARGS__)); \
    }                                                                                             \
  } while (0)

// ZS_MODEL_CHECK(cond, fmt, args...): a rule the user's model code must follow - the shape or dtype a
// layer is given, a constructor argument. Throws ModelError with the message (what was expected and
// what came): the user's mistake, not a zeroshard bug, so no file and line.
#define ZS_MODEL_CHECK(cond, ...)                                        \
  do {                                                                   \
    if (!(cond)) [[unlikely]] {                                          \
      throw ::zs::ModelError(::fmt::format(__VA_ARGS__));                \
    }                                                                    \
  } while (0)

#ifdef NDEBUG
#define ZS_DEBUG_ASSERT(cond, ...) \
  do {                             \
  } while (0)
#else
#define ZS_DEBUG_ASSERT(cond, ...) ZS_ASSERT(cond, __VA_ARGS__)
#endif

// ZS_SYS_CHECK(expr, fmt, args...): for POSIX calls that return -1 and set errno. Throws IoError with
// the caller's description and errno's text.
#define ZS_SYS_CHECK(expr, ...)                                                                   \
  do {                                                                                            \
    if ((expr) == -1) [[unlikely]] {                                                              \
      int zs_err_ = errno;                                                                        \
      ::zs::detail::throw_library_error<::zs::IoError>("posix", ::fmt::format(__VA_ARGS__),       \
                                                       ::zs::detail::errno_text(zs_err_), __FILE__, \
                                                       __LINE__);                                 \
    }                                                                                             \
  } while (0)
