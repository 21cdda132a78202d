// Agreement on an outcome across the ranks of a group: a step that every rank runs (loading a
// checkpoint, reading a config, building a model) either succeeds on every rank or fails on every
// rank with the same message, that of the lowest failing rank, so no rank is left waiting in a
// collective that a failed rank never enters.
//
//   comm::run_agreed(group, [&] { load(dir); });  // every rank throws "rank 2: <rank 2's error>"
//
//   std::exception_ptr local = ...;             // or with the outcome in hand:
//   if (auto f = comm::agree_outcome(group, local)) report(f->rank, f->message);
//
// Both are collectives: every rank of the group calls them, in the same order as its other
// collectives. An error that happens while other ranks are blocked in a collective cannot be agreed
// on this way (they never arrive here): that is the collective watchdog's case (comm/config.h).
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <string>

#include "comm/group.h"
#include "core/errors.h"

namespace zs::comm {

// The kinds of error an agreement keeps: the lowest failing rank's exception is re-thrown on every
// rank as the same type (std::filesystem errors count as IoError); any other exception is kOther.
enum class ErrorKind : int32_t { kNone = 0, kCheckpoint, kIo, kUsage, kConfig, kOther };

// One rank's failure, as every rank of the group learns it.
struct RankFailure {
  int rank = -1;                      // the lowest failing rank (in the group)
  ErrorKind kind = ErrorKind::kOther;
  std::string message;                // its exception's what(), unchanged
};

// The kind of an exception (nullptr: kNone), for agree_outcome.
ErrorKind error_kind(const std::exception_ptr& error);

// Every rank of `group` calls this with its local outcome (nullptr: it succeeded). Returns, on every
// rank alike, the lowest failing rank's failure, or nullopt when every rank succeeded. Costs one
// allgather of an int, plus a broadcast of the message when some rank failed.
std::optional<RankFailure> agree_outcome(const Group& group, const std::exception_ptr& local);

// Every rank calls this with its local outcome. When some rank failed, every rank throws that rank's
// error, as its kind (kOther as `OtherError`), the message prefixed "rank R: "; a group of one
// rethrows its own exception unchanged.
template <typename OtherError = Error>
void throw_agreed(const Group& group, const std::exception_ptr& local);

// Runs `fn` on every rank and agrees on the outcome (throw_agreed).
template <typename OtherError = Error, typename F>
void run_agreed(const Group& group, F&& fn) {
  std::exception_ptr local;
  try {
    fn();
  } catch (...) {
    local = std::current_exception();
  }
  throw_agreed<OtherError>(group, local);
}

namespace detail {
[[noreturn]] void throw_failure(const RankFailure& f, std::string text);  // f.kind's type, text as message
}  // namespace detail

template <typename OtherError>
void throw_agreed(const Group& group, const std::exception_ptr& local) {
  if (group.size() == 1) {
    if (local) std::rethrow_exception(local);
    return;
  }
  std::optional<RankFailure> f = agree_outcome(group, local);
  if (!f) return;
  std::string text = "rank " + std::to_string(f->rank) + ": " + f->message;
  if (f->kind == ErrorKind::kOther) throw OtherError(text);
  detail::throw_failure(*f, std::move(text));
}

}  // namespace zs::comm
