#include "memory/alloc_trace.h"

#include <algorithm>
#include <fstream>
#include <istream>
#include <ostream>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>

#include "core/errors.h"

namespace zs::memory {
namespace {

constexpr std::string_view kMagic = "zeroshard-alloc-trace";
constexpr int kVersion = 1;

}  // namespace

void write_trace(const AllocTrace& trace, std::ostream& out) {
  out << kMagic << ' ' << kVersion << ' ' << trace.capacity_bytes << '\n';
  for (const TraceEvent& e : trace.events) {
    if (e.op == TraceEvent::Op::kAlloc) {
      out << "a " << e.id << ' ' << e.bytes << ' ' << lifetime_name(e.lifetime) << ' ' << category_name(e.category)
          << '\n';
    } else {
      out << "f " << e.id << '\n';
    }
  }
}

AllocTrace read_trace(std::istream& in, const std::string& source) {
  AllocTrace trace;
  std::string line;
  size_t line_no = 0;
  bool header = false;
  auto fail = [&](std::string_view what) {
    throw IoError(fmt::format("allocation trace '{}' line {}: {} (got '{}'); expected the format documented in "
                              "memory/alloc_trace.h",
                              source, line_no, what, line));
  };
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string tag;
    fields >> tag;
    if (!header) {
      int version = 0;
      if (tag != kMagic || !(fields >> version >> trace.capacity_bytes)) fail("bad header");
      if (version != kVersion) fail(fmt::format("unsupported version {}", version));
      header = true;
      continue;
    }
    TraceEvent e;
    if (tag == "a") {
      std::string lifetime, category;
      if (!(fields >> e.id >> e.bytes >> lifetime >> category)) fail("bad allocation event");
      if (lifetime == "persistent") {
        e.lifetime = Lifetime::kPersistent;
      } else if (lifetime == "transient") {
        e.lifetime = Lifetime::kTransient;
      } else if (lifetime == "saved") {
        e.lifetime = Lifetime::kSaved;
      } else if (lifetime == "spanning") {
        e.lifetime = Lifetime::kSpanning;
      } else {
        fail("unknown lifetime");
      }
      auto c = category_from_name(category);
      if (!c) fail("unknown category");
      e.category = *c;
      e.op = TraceEvent::Op::kAlloc;
    } else if (tag == "f") {
      if (!(fields >> e.id)) fail("bad free event");
      e.op = TraceEvent::Op::kFree;
    } else {
      fail("unknown event tag");
    }
    std::string extra;
    if (fields >> extra) fail("trailing fields");
    trace.events.push_back(e);
  }
  if (!header) {
    throw IoError(fmt::format("allocation trace '{}' is empty: expected a '{} {} <capacity>' header", source, kMagic,
                              kVersion));
  }
  return trace;
}

void save_trace(const AllocTrace& trace, const std::string& path) {
  std::ofstream out(path);
  if (!out) throw IoError(fmt::format("cannot open '{}' to write an allocation trace; check the directory exists", path));
  write_trace(trace, out);
  out.flush();
  if (!out) throw IoError(fmt::format("writing the allocation trace '{}' failed (disk full?)", path));
}

AllocTrace load_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IoError(fmt::format("cannot open the allocation trace '{}'; check the path", path));
  return read_trace(in, path);
}

void AllocTraceRecorder::record_alloc(uint64_t id, size_t bytes, Lifetime lifetime, Category category) {
  std::lock_guard lock(mu_);
  trace_.events.push_back({TraceEvent::Op::kAlloc, id, bytes, lifetime, category});
}

void AllocTraceRecorder::record_free(uint64_t id) {
  std::lock_guard lock(mu_);
  trace_.events.push_back({TraceEvent::Op::kFree, id, 0, Lifetime::kPersistent, Category::kParams});
}

AllocTrace AllocTraceRecorder::trace() const {
  std::lock_guard lock(mu_);
  return trace_;
}

size_t AllocTraceRecorder::size() const {
  std::lock_guard lock(mu_);
  return trace_.events.size();
}

ReplayResult replay(const AllocTrace& trace, AllocatorPolicy& policy, bool check_each_step) {
  ReplayResult r;
  // id -> offset in the policy; nullopt marks an allocation the policy could not place.
  std::unordered_map<uint64_t, std::optional<size_t>> live;
  std::unordered_map<uint64_t, size_t> requested;  // id -> bytes of every placed allocation
  size_t requested_now = 0;
  double frag_sum = 0.0;
  for (const TraceEvent& e : trace.events) {
    if (e.op == TraceEvent::Op::kAlloc) {
      if (live.contains(e.id)) throw IoError(fmt::format("allocation trace: id {} allocated twice", e.id));
      std::optional<size_t> offset = e.bytes == 0 ? std::nullopt : policy.allocate(e.bytes, e.lifetime);
      if (!offset && e.bytes != 0) ++r.failed_allocs;
      if (offset) {
        requested.emplace(e.id, e.bytes);
        requested_now += e.bytes;
        r.peak_requested_bytes = std::max(r.peak_requested_bytes, requested_now);
      }
      live.emplace(e.id, offset);
    } else {
      auto it = live.find(e.id);
      if (it == live.end()) throw IoError(fmt::format("allocation trace: free of id {} that is not live", e.id));
      if (it->second) {
        policy.free(*it->second);
        requested_now -= requested.at(e.id);
        requested.erase(e.id);
      }
      live.erase(it);
    }
    ++r.events;
    ArenaStats s = policy.stats();
    r.max_fragmentation = std::max(r.max_fragmentation, s.fragmentation);
    frag_sum += s.fragmentation;
    if (check_each_step) {
      std::string err = policy.check_invariants();
      ZS_ASSERT(err.empty(), "replay event {} into {}: {}", r.events, policy.name(), err);
    }
  }
  r.final_stats = policy.stats();
  r.peak_allocated_bytes = r.final_stats.peak_allocated_bytes;
  r.peak_reserved_bytes = r.final_stats.peak_reserved_bytes;
  r.mean_fragmentation = r.events ? frag_sum / static_cast<double>(r.events) : 0.0;
  return r;
}

}  // namespace zs::memory
