#include "comm/agree.h"

#include <algorithm>
#include <filesystem>
#include <vector>

namespace zs::comm {

ErrorKind error_kind(const std::exception_ptr& error) {
  if (!error) return ErrorKind::kNone;
  try {
    std::rethrow_exception(error);
  } catch (const CheckpointError&) {
    return ErrorKind::kCheckpoint;
  } catch (const IoError&) {
    return ErrorKind::kIo;
  } catch (const UsageError&) {
    return ErrorKind::kUsage;
  } catch (const ConfigError&) {
    return ErrorKind::kConfig;
  } catch (const std::filesystem::filesystem_error&) {
    return ErrorKind::kIo;
  } catch (...) {
    return ErrorKind::kOther;
  }
}

namespace {

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace

std::optional<RankFailure> agree_outcome(const Group& group, const std::exception_ptr& local) {
  auto kind = static_cast<int32_t>(error_kind(local));
  std::vector<int32_t> kinds(static_cast<size_t>(group.size()), kind);
  if (group.size() > 1) {
    group.allgather(memory::Tensor(&kind, memory::DType::kI32, {1}),
                    memory::Tensor(kinds.data(), memory::DType::kI32, {group.size()}));
  }
  auto first = std::find_if(kinds.begin(), kinds.end(), [](int32_t k) { return k != 0; });
  if (first == kinds.end()) return std::nullopt;
  RankFailure f{.rank = static_cast<int>(first - kinds.begin()), .kind = static_cast<ErrorKind>(*first), .message = {}};
  if (f.rank == group.rank()) f.message = message_of(local);
  if (group.size() > 1) {
    // Only the failing rank's message travels: its length, then its bytes (in 4-byte words).
    auto length = static_cast<int32_t>(f.message.size());
    group.broadcast(memory::Tensor(&length, memory::DType::kI32, {1}), f.rank);
    std::vector<int32_t> words(static_cast<size_t>(length) / 4 + 1, 0);
    if (f.rank == group.rank()) std::copy(f.message.begin(), f.message.end(), reinterpret_cast<char*>(words.data()));
    group.broadcast(memory::Tensor(words.data(), memory::DType::kI32, {static_cast<int64_t>(words.size())}), f.rank);
    f.message.assign(reinterpret_cast<const char*>(words.data()), static_cast<size_t>(length));
  }
  return f;
}

namespace detail {

void throw_failure(const RankFailure& f, std::string text) {
  switch (f.kind) {
    case ErrorKind::kCheckpoint: throw CheckpointError(text);
    case ErrorKind::kIo: throw IoError(text);
    case ErrorKind::kUsage: throw UsageError(text);
    case ErrorKind::kConfig: throw ConfigError(text);
    case ErrorKind::kNone:
    case ErrorKind::kOther: break;
  }
  throw Error(text);
}

}  // namespace detail

}  // namespace zs::comm
