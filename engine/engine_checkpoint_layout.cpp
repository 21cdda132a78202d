// The checkpoint code's agreement across ranks and the storage layout built from every rank's items
// (engine/detail/engine_checkpoint.h).
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <sstream>

#include "comm/agree.h"
#include "core/errors.h"
#include "engine/detail/engine_checkpoint.h"

namespace zs::engine {

namespace fs = std::filesystem;
using memory::DType;

std::vector<std::string> allgather_strings(const comm::Group& g, const std::string& mine) {
  if (g.size() == 1) return {mine};
  int32_t len = static_cast<int32_t>(mine.size());
  std::vector<int32_t> lens(static_cast<size_t>(g.size()));
  g.allgather(memory::Tensor(&len, DType::kI32, {1}), memory::Tensor(lens.data(), DType::kI32, {g.size()}));
  std::vector<size_t> counts;
  size_t total = 0;
  for (int32_t l : lens) {
    counts.push_back(static_cast<size_t>(l) / 4 + 1);
    total += counts.back();
  }
  std::vector<int32_t> words(static_cast<size_t>(len) / 4 + 1, 0);
  std::memcpy(words.data(), mine.data(), mine.size());
  std::vector<int32_t> all(total);
  g.allgatherv(memory::Tensor(words.data(), DType::kI32, {static_cast<int64_t>(words.size())}),
               memory::Tensor(all.data(), DType::kI32, {static_cast<int64_t>(total)}), counts);
  std::vector<std::string> out;
  size_t at = 0;
  for (size_t r = 0; r < lens.size(); ++r) {
    out.emplace_back(reinterpret_cast<const char*>(all.data() + at), static_cast<size_t>(lens[r]));
    at += counts[r];
  }
  return out;
}

// comm/agree.h: when any rank threw, every rank throws the lowest failing rank's error, its message
// prefixed with that rank; an error of no checkpoint-related kind becomes a CheckpointError.
void agreed(const comm::Group& g, const std::function<void()>& fn) { comm::run_agreed<CheckpointError>(g, fn); }

std::vector<std::string> CheckpointRanks::allgather(const std::string& mine) const {
  const std::vector<std::string> stage = allgather_stage(mine);
  if (!pp_) return stage;
  // The stages' results in turn: stage s's block of dp x tp ranks follows stage s - 1's.
  std::string packed;
  for (const std::string& x : stage) packed += fmt::format("{}\n{}", x.size(), x);
  std::vector<std::string> out;
  for (const std::string& p : allgather_strings(*pp_, packed)) {
    size_t at = 0;
    for (size_t i = 0; i < stage.size(); ++i) {
      const size_t nl = p.find('\n', at);
      const size_t len = std::stoull(p.substr(at, nl - at));
      out.push_back(p.substr(nl + 1, len));
      at = nl + 1 + len;
    }
  }
  return out;
}

std::vector<std::string> CheckpointRanks::allgather_stage(const std::string& mine) const {
  if (!tp_) return allgather_strings(dp_, mine);
  // Over the data-parallel group, then the tensor-parallel group's packed results: [t][d] is rank t + tp * d.
  std::string packed;
  for (const std::string& s : allgather_strings(dp_, mine)) packed += fmt::format("{}\n{}", s.size(), s);
  const std::vector<std::string> by_tp = allgather_strings(*tp_, packed);
  const int tp = tp_size();
  std::vector<std::string> out(static_cast<size_t>(tp * dp_.size()));
  for (int t = 0; t < tp; ++t) {
    const std::string& p = by_tp[static_cast<size_t>(t)];
    size_t at = 0;
    for (int d = 0; d < dp_.size(); ++d) {
      const size_t nl = p.find('\n', at);
      const size_t len = std::stoull(p.substr(at, nl - at));
      out[static_cast<size_t>(t + tp * d)] = p.substr(nl + 1, len);
      at = nl + 1 + len;
    }
  }
  return out;
}

void CheckpointRanks::agreed(const std::function<void()>& fn) const {
  if (!pp_) {
    agreed_stage(fn);
    return;
  }
  // The stage agrees first (its failure named by checkpoint rank), then the stages.
  std::exception_ptr mine;
  try {
    agreed_stage(fn);
  } catch (...) {
    mine = std::current_exception();
  }
  if (std::optional<comm::RankFailure> f = comm::agree_outcome(*pp_, mine)) {
    const std::string message = fmt::format("pipeline stage {}: {}", f->rank, f->message);
    if (f->kind == comm::ErrorKind::kOther) throw CheckpointError(message);
    comm::detail::throw_failure(*f, message);
  }
}

void CheckpointRanks::agreed_stage(const std::function<void()>& fn) const {
  if (!tp_) {
    engine::agreed(dp_, fn);
    return;
  }
  // The data-parallel group agrees first; its failure, named by checkpoint rank, is then agreed over
  // the tensor-parallel group, so every rank throws the same error.
  std::exception_ptr local;
  try {
    fn();
  } catch (...) {
    local = std::current_exception();
  }
  std::exception_ptr mine;
  if (std::optional<comm::RankFailure> f = comm::agree_outcome(dp_, local)) {
    try {
      comm::detail::throw_failure(*f, fmt::format("rank {}: {}", tp_rank() + tp_size() * f->rank, f->message));
    } catch (...) {
      mine = std::current_exception();
    }
  }
  if (std::optional<comm::RankFailure> f = comm::agree_outcome(*tp_, mine)) {
    if (f->kind == comm::ErrorKind::kOther) throw CheckpointError(f->message);
    comm::detail::throw_failure(*f, f->message);
  }
}

std::string shape_text(const std::vector<uint64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// The description of this rank's items, for the layout every rank builds from all of them:
//   T <name> <dtype> <d0,d1,...>    a tensor (once)
//   S <buffer> <dtype> <tensor> <begin> <count> [<pitch> <repeats>]
// segments [begin + i * pitch, + count) for i < repeats (1 without them): consecutive items of one
// buffer and tensor with one count and pitch, as a tensor-parallel slice's runs are (a row-parallel
// weight is one per row), are one line.
std::string describe(const std::vector<Item>& items) {
  std::string out;
  std::set<std::string_view> described;
  auto same_kind = [](const Item& a, const Item& b) {
    return a.buffer == b.buffer && a.buffer_dtype == b.buffer_dtype && a.tensor == b.tensor && a.count == b.count;
  };
  for (size_t i = 0; i < items.size();) {
    const Item& it = items[i];
    if (described.insert(it.tensor).second) {
      out += fmt::format("T {} {} {}\n", it.tensor, memory::dtype_name(it.tensor_dtype), fmt::join(it.shape, ","));
    }
    size_t j = i + 1;
    uint64_t pitch = 0;
    if (j < items.size() && same_kind(it, items[j]) && items[j].begin > it.begin) {
      pitch = items[j].begin - it.begin;
      while (j < items.size() && same_kind(it, items[j]) && items[j].begin == items[j - 1].begin + pitch) ++j;
    }
    out += fmt::format("S {} {} {} {} {}", it.buffer, memory::dtype_name(it.buffer_dtype), it.tensor, it.begin, it.count);
    out += j - i > 1 ? fmt::format(" {} {}\n", pitch, j - i) : std::string("\n");
    i = j;
  }
  return out;
}

DType dtype_named(const std::string& name) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
    if (memory::dtype_name(t) == name) return t;
  }
  ZS_ASSERT(false, "unknown dtype '{}' in a checkpoint description", name);
  return DType::kF32;
}

checkpoint::Layout build_layout(const std::vector<std::string>& descriptions) {
  checkpoint::Layout layout;
  layout.world_size = static_cast<int>(descriptions.size());
  std::map<std::string, uint32_t> tensor_ids;
  std::map<std::string, size_t> buffer_ids;
  for (size_t r = 0; r < descriptions.size(); ++r) {
    std::istringstream in(descriptions[r]);
    std::string kind;
    while (in >> kind) {
      if (kind == "T") {
        std::string name, dtype, dims;
        in >> name >> dtype >> dims;
        std::vector<uint64_t> shape;
        std::istringstream d(dims);
        for (std::string v; std::getline(d, v, ',');) {
          if (!v.empty()) shape.push_back(std::stoull(v));
        }
        if (tensor_ids.emplace(name, static_cast<uint32_t>(layout.tensors.size())).second) {
          layout.tensors.push_back({name, shape, dtype_named(dtype)});
        } else {
          ZS_ASSERT(layout.tensors[tensor_ids[name]].shape == shape, "tensor '{}' has two shapes across ranks", name);
        }
      } else {
        std::string buffer, dtype, tensor, line;
        uint64_t begin = 0, count = 0, pitch = 0, repeats = 1;
        in >> buffer >> dtype >> tensor >> begin >> count;
        std::getline(in, line);  // " <pitch> <repeats>" or nothing
        if (line.find_first_not_of(' ') != std::string::npos) std::istringstream(line) >> pitch >> repeats;
        auto [it, fresh] = buffer_ids.emplace(buffer, layout.buffers.size());
        if (fresh) {
          layout.buffers.push_back(
              {buffer, dtype_named(dtype), std::vector<std::vector<checkpoint::Segment>>(descriptions.size())});
        }
        const uint32_t id = tensor_ids.at(tensor);
        for (uint64_t i = 0; i < repeats; ++i) layout.buffers[it->second].ranks[r].push_back({id, begin + i * pitch, count});
      }
    }
  }
  return layout;
}

checkpoint::Scalar scalar_or(const checkpoint::Metadata& m, const std::string& key, checkpoint::Scalar fallback) {
  auto it = m.scalars.find(key);
  return it == m.scalars.end() ? fallback : it->second;
}

int64_t int_scalar(const checkpoint::Metadata& m, const std::string& key, const fs::path& dir) {
  auto it = m.scalars.find(key);
  if (it == m.scalars.end() || !std::holds_alternative<int64_t>(it->second)) {
    throw CheckpointError(fmt::format("checkpoint '{}': scalar '{}' is missing or not an integer: not a checkpoint "
                                      "zeroshard's engine wrote",
                                      dir.string(), key));
  }
  return std::get<int64_t>(it->second);
}

double real_scalar(const checkpoint::Metadata& m, const std::string& key, const fs::path& dir) {
  auto it = m.scalars.find(key);
  if (it == m.scalars.end() || !std::holds_alternative<double>(it->second)) {
    throw CheckpointError(fmt::format("checkpoint '{}': scalar '{}' is missing or not a number", dir.string(), key));
  }
  return std::get<double>(it->second);
}

// Made printable (core/errors.h): the value is the file's and reaches messages ("saved with optimizer
// '...'"); a well-formed value is unchanged.
std::string string_scalar(const checkpoint::Metadata& m, const std::string& key) {
  auto v = scalar_or(m, key, std::string());
  return std::holds_alternative<std::string>(v) ? printable(std::get<std::string>(v)) : std::string();
}

}  // namespace zs::engine
