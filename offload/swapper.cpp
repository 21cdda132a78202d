#include "offload/swapper.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "core/errors.h"

namespace zs::offload {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

PipelinedSwapper::PipelinedSwapper(std::vector<std::vector<SwapItem>> sub_groups, const SwapperOptions& options)
    : groups_(std::move(sub_groups)) {
  if (options.buffer_count == 0) {
    throw ConfigError("offload buffer_count: expected >= 1 sub-group buffers (3 overlaps read-ahead, compute and "
                      "write-back), got 0");
  }
  // Every item's file range [start, end) (rounded up: that is what is transferred), to find overlaps.
  std::vector<std::tuple<const SwapSpace*, uint64_t, uint64_t, size_t>> ranges;
  size_t largest = 0;
  item_offsets_.resize(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    size_t pos = 0;
    for (const SwapItem& it : groups_[g]) {
      ZS_ASSERT(it.region.space != nullptr, "sub-group {}: an item's region belongs to no swap space", g);
      ZS_ASSERT(io_aligned(it.offset), "sub-group {}: item offset {} in its region is not a multiple of {}", g,
                it.offset, kIoAlignment);
      ZS_ASSERT(it.offset <= it.region.bytes && it.bytes <= it.region.bytes - it.offset,
                "sub-group {}: item [{}, {}) past its {}-byte region of '{}'", g, it.offset, it.offset + it.bytes,
                it.region.bytes, it.region.space->path());
      item_offsets_[g].push_back(pos);
      pos += io_align_up(it.bytes);
      const uint64_t start = it.region.offset + it.offset;
      if (it.bytes > 0) ranges.emplace_back(it.region.space, start, start + io_align_up(it.bytes), g);
    }
    largest = std::max(largest, pos);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    const auto& [sa, a0, a1, ga] = ranges[i - 1];
    const auto& [sb, b0, b1, gb] = ranges[i];
    ZS_ASSERT(sa != sb || a1 <= b0, "items of sub-groups {} and {} overlap in '{}' (bytes [{}, {}) and [{}, {}))", ga,
              gb, sa->path(), a0, a1, b0, b1);
  }
  const size_t count = std::min(options.buffer_count, groups_.size());
  for (size_t b = 0; b < count; ++b) {
    buffers_.emplace_back(largest, options.tracker, memory::Category::kOffloadBuffers, options.pin_memory);
  }
  lookahead_ = count >= 3 ? count - 2 : count - (count > 0 ? 1 : 0);
}

size_t PipelinedSwapper::sub_group_buffer_bytes(std::span<const SwapItem> items) {
  size_t total = 0;
  for (const SwapItem& it : items) total += io_align_up(it.bytes);
  return total;
}

size_t PipelinedSwapper::sub_group_buffer_bytes(std::span<const size_t> item_bytes) {
  size_t total = 0;
  for (size_t b : item_bytes) total += io_align_up(b);
  return total;
}

size_t PipelinedSwapper::host_budget_bytes(size_t sub_group_bytes, size_t buffer_count) {
  return buffer_count * io_align_up(sub_group_bytes);
}

size_t PipelinedSwapper::host_buffer_bytes() const {
  size_t total = 0;
  for (const AlignedBuffer& b : buffers_) total += b.capacity();
  return total;
}

void PipelinedSwapper::issue(size_t group, size_t buffer, bool reads, std::vector<Pending>& out) {
  const std::vector<SwapItem>& items = groups_[group];
  std::byte* base = buffers_[buffer].data();
  for (size_t k = 0; k < items.size(); ++k) {
    const SwapItem& it = items[k];
    const bool wanted = reads ? it.mode != SwapMode::kWriteOnly : it.mode != SwapMode::kReadOnly;
    if (!wanted || it.bytes == 0) continue;
    const size_t len = io_align_up(it.bytes);
    std::byte* p = base + item_offsets_[group][k];
    SwapSpace& space = *it.region.space;
    // Record the ticket at once, so that a throw from the next issue still waits for this one.
    out.push_back(Pending{&space.file(), Ticket{}, len});
    out.back().ticket = reads ? space.read_async(it.region, it.offset, std::span<std::byte>(p, len))
                              : space.write_async(it.region, it.offset, std::span<const std::byte>(p, len));
  }
}

void PipelinedSwapper::wait_for(std::vector<Pending>& pending, uint64_t& counter) {
  std::exception_ptr first;
  for (Pending& p : pending) {
    try {
      p.file->wait(p.ticket);
      counter += p.bytes;
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  pending.clear();
  if (first) std::rethrow_exception(first);
}

void PipelinedSwapper::prefetch() {
  if (prefetched_ > 0) return;
  const size_t n = groups_.size(), nb = buffers_.size();
  prefetched_reads_.assign(nb, {});
  try {
    for (size_t g = 0; g < n && g <= lookahead_; ++g) {
      issue(g, g % nb, /*reads=*/true, prefetched_reads_[g % nb]);
      ++prefetched_;
    }
  } catch (...) {
    // An issue failure: drain what was issued, then report.
    uint64_t ignored = 0;
    for (auto& pending : prefetched_reads_) {
      try {
        wait_for(pending, ignored);
      } catch (...) {
      }
    }
    prefetched_ = 0;
    throw;
  }
}

PipelinedSwapper::~PipelinedSwapper() {
  // Prefetched reads never consumed must land before the buffers go.
  uint64_t ignored = 0;
  for (auto& pending : prefetched_reads_) {
    try {
      wait_for(pending, ignored);
    } catch (...) {
    }
  }
}

void PipelinedSwapper::run(const ComputeFn& compute) {
  const double t_run = now_s();
  const size_t n = groups_.size(), nb = buffers_.size();
  std::vector<std::vector<Pending>> reads(nb), writes(nb);
  std::vector<std::span<std::byte>> spans;
  std::exception_ptr error;
  size_t already_read = 0;
  if (prefetched_ > 0) {
    for (size_t b = 0; b < nb && b < prefetched_reads_.size(); ++b) reads[b] = std::move(prefetched_reads_[b]);
    prefetched_reads_.clear();
    already_read = prefetched_;
    prefetched_ = 0;
  }
  try {
    size_t next_read = already_read;
    for (size_t g = 0; g < n; ++g) {
      for (; next_read < n && next_read <= g + lookahead_; ++next_read) {
        const size_t b = next_read % nb;
        const double t0 = now_s();
        wait_for(writes[b], stats_.bytes_written);  // the buffer's previous sub-group is on disk
        stats_.io_wait_seconds += now_s() - t0;
        issue(next_read, b, /*reads=*/true, reads[b]);
      }
      const size_t b = g % nb;
      const double t0 = now_s();
      wait_for(reads[b], stats_.bytes_read);
      const double t1 = now_s();
      stats_.io_wait_seconds += t1 - t0;
      spans.clear();
      for (size_t k = 0; k < groups_[g].size(); ++k) {
        spans.emplace_back(buffers_[b].data() + item_offsets_[g][k], groups_[g][k].bytes);
      }
      compute(g, std::span<std::span<std::byte>>(spans));
      stats_.compute_seconds += now_s() - t1;
      ++stats_.sub_groups;
      issue(g, b, /*reads=*/false, writes[b]);
    }
    const double t0 = now_s();
    for (auto& w : writes) wait_for(w, stats_.bytes_written);
    stats_.io_wait_seconds += now_s() - t0;
  } catch (...) {
    error = std::current_exception();
  }
  if (error) {
    // Drain: nothing may stay in flight pointing into our buffers. Later failures are dropped; the
    // first one is what the caller sees.
    uint64_t ignored = 0;
    for (auto* list : {&reads, &writes}) {
      for (auto& pending : *list) {
        try {
          wait_for(pending, ignored);
        } catch (...) {
        }
      }
    }
  }
  ++stats_.runs;
  stats_.run_seconds += now_s() - t_run;
  if (error) std::rethrow_exception(error);
}

}  // namespace zs::offload
