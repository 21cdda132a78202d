#include "checkpoint/format.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>
#include <set>

#include "core/errors.h"

namespace zs::checkpoint {

uint64_t TensorInfo::numel() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

uint64_t BufferLayout::rank_elements(int rank) const {
  uint64_t n = 0;
  for (const Segment& s : ranks.at(static_cast<size_t>(rank))) n += s.count;
  return n;
}

namespace {
bool valid_name_char(char c, bool buffer) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  if (c == '_' || c == '.' || c == '-') return true;
  return !buffer && (c == '/' || c == ':');
}
}  // namespace

void Layout::validate() const {
  if (world_size < 1) throw UsageError(fmt::format("checkpoint layout: world_size {} < 1", world_size));
  std::set<std::string_view> names;
  for (const TensorInfo& t : tensors) {
    if (t.name.empty() || !std::all_of(t.name.begin(), t.name.end(), [](char c) { return valid_name_char(c, false); })) {
      throw UsageError(fmt::format("checkpoint layout: tensor name '{}' must be non-empty [A-Za-z0-9_.:/-]", printable(t.name)));
    }
    if (!names.insert(t.name).second) throw UsageError(fmt::format("checkpoint layout: tensor '{}' twice", t.name));
  }
  std::set<std::string_view> buffer_names;
  for (const BufferLayout& b : buffers) {
    if (b.name.empty() || !std::all_of(b.name.begin(), b.name.end(), [](char c) { return valid_name_char(c, true); })) {
      throw UsageError(fmt::format("checkpoint layout: buffer name '{}' must be non-empty [A-Za-z0-9_.-]", printable(b.name)));
    }
    if (!buffer_names.insert(b.name).second) throw UsageError(fmt::format("checkpoint layout: buffer '{}' twice", b.name));
    if (b.ranks.size() != static_cast<size_t>(world_size)) {
      throw UsageError(fmt::format("checkpoint layout: buffer '{}' has segments for {} ranks, world_size is {}", b.name,
                                   b.ranks.size(), world_size));
    }
    // No element of a tensor stored twice in one buffer: sort each tensor's ranges and check gaps.
    std::vector<std::vector<std::pair<uint64_t, uint64_t>>> ranges(tensors.size());
    for (const auto& rank_segments : b.ranks) {
      for (const Segment& s : rank_segments) {
        if (s.tensor >= tensors.size()) {
          throw UsageError(fmt::format("checkpoint layout: buffer '{}' names tensor #{} of {}", b.name, s.tensor,
                                       tensors.size()));
        }
        const TensorInfo& t = tensors[s.tensor];
        if (s.count == 0 || s.begin + s.count > t.numel()) {
          throw UsageError(fmt::format("checkpoint layout: buffer '{}' segment [{}, {}) of '{}' ({} elements)", b.name,
                                       s.begin, s.begin + s.count, t.name, t.numel()));
        }
        ranges[s.tensor].emplace_back(s.begin, s.begin + s.count);
      }
    }
    for (size_t i = 0; i < ranges.size(); ++i) {
      std::sort(ranges[i].begin(), ranges[i].end());
      for (size_t j = 1; j < ranges[i].size(); ++j) {
        if (ranges[i][j].first < ranges[i][j - 1].second) {
          throw UsageError(fmt::format("checkpoint layout: buffer '{}' holds elements {}.. of '{}' twice", b.name,
                                       ranges[i][j].first, tensors[i].name));
        }
      }
    }
  }
}

const BufferLayout* Layout::find_buffer(std::string_view name) const {
  for (const BufferLayout& b : buffers) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

int Layout::find_tensor(std::string_view name) const {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::string rank_file_name(int rank) { return fmt::format("zs_rank_{:05d}.h5", rank); }

std::string new_run_id() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}{:08x}{:08x}", rd(), rd(), rd(), rd());
}

}  // namespace zs::checkpoint
