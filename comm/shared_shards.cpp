// One-sided gathers out of the peers' shards (Note [One-sided gathers] in comm/shared_shards.h).
#include "comm/shared_shards.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "comm/detail/runtime.h"
#include "comm/detail/shm.h"
#include "comm/detail/shm_direct.h"
#include "comm/detail/shm_reduce.h"  // copy_streaming
#include "comm/detail/small.h"       // small_path: which collective a gather replaces, for the counters
#include "core/errors.h"

namespace zs::comm {

namespace {

using detail::Clock;
using detail::GroupState;
using detail::SpinProbe;

constexpr int kWritten = 0;  // words of a rank's line: its shard's version
constexpr int kDone = 1;     // and the last version whose peers' shards it has finished reading

// The Group's state is the Group's own (shared, not const); group_state() hands out a const view for
// reading. The waits mark it broken on a timeout, as every comm wait does.
GroupState& state_of(const Group& group) { return const_cast<GroupState&>(detail::group_state(group)); }

uint64_t u32(int32_t v) { return static_cast<uint64_t>(static_cast<uint32_t>(v)); }

}  // namespace

SharedShards::SharedShards(const Group& group, const void* shard, size_t bytes) : group_(&group) {
  // What each rank tells the others, as int32 (one allgather).
  enum Field { kNodeId, kNodeRank, kLine, kArenaLo, kArenaHi, kOffsetLo, kOffsetHi, kBytesLo, kBytesHi, kFields };
  const GroupState& g = detail::group_state(group);
  detail::ShmNode* node = g.runtime->shm_node();
  // Every condition before the allgather is the same on every rank of the group.
  if (g.local() || g.simulated || g.size < 2) {
    reason_ = "the group has one rank, or is simulated";
    return;
  }
  if (g.config.shared_memory == SharedMemory::kOff) {
    reason_ = "comm.shared_memory is false for this group (MPI's collectives)";
    return;
  }
  if (node == nullptr || g.shm == nullptr || !g.shm->enabled) {
    reason_ = "the World has no shared-memory window for this group";
    return;
  }
  uint64_t offset = 0;
  const int64_t arena = bytes == 0 ? 0 : node->arenas().find(node->node_rank(), shard, bytes, &offset);  // 0: not in one
  std::vector<int32_t> out(kFields), all(static_cast<size_t>(g.size) * kFields);
  out[kNodeId] = node->node_id();
  out[kNodeRank] = node->node_rank();
  out[kLine] = node->next_group_index;
  out[kArenaLo] = static_cast<int32_t>(static_cast<uint64_t>(arena) & 0xffffffffu);
  out[kArenaHi] = static_cast<int32_t>(static_cast<uint64_t>(arena) >> 32);
  out[kOffsetLo] = static_cast<int32_t>(offset & 0xffffffffu);
  out[kOffsetHi] = static_cast<int32_t>(offset >> 32);
  out[kBytesLo] = static_cast<int32_t>(bytes & 0xffffffffu);
  out[kBytesHi] = static_cast<int32_t>(static_cast<uint64_t>(bytes) >> 32);
  group.allgather(memory::Tensor(out.data(), memory::DType::kI32, {kFields}),
                  memory::Tensor(all.data(), memory::DType::kI32, {static_cast<int64_t>(all.size())}));
  auto at = [&](int rank, Field f) { return all[static_cast<size_t>(rank) * kFields + f]; };
  // From here every rank decides on the same gathered values. The line: as a group's flag line
  // (init_shm_group), the largest next index of the members, which every member then moves past.
  // A rank with an empty shard (the tail of a small layout) is never read from: it needs no arena.
  auto bytes_of = [&](int p) { return static_cast<size_t>(u32(at(p, kBytesLo)) | (u32(at(p, kBytesHi)) << 32)); };
  auto id_of = [&](int p) { return static_cast<int64_t>(u32(at(p, kArenaLo)) | (u32(at(p, kArenaHi)) << 32)); };
  int line = 0;
  bool one_node = true, one_arena = true;
  int64_t id = 0;
  bool seen = false;  // a non-empty shard: `id` is its arena (0: none)
  for (int p = 0; p < g.size; ++p) {
    line = std::max(line, at(p, kLine));
    one_node = one_node && at(p, kNodeId) == at(0, kNodeId);
    if (bytes_of(p) == 0) continue;
    if (!seen) id = id_of(p);
    seen = true;
    one_arena = one_arena && id_of(p) == id;
  }
  node->next_group_index = std::max(node->next_group_index, line + 1);
  if (!one_node) {
    reason_ = "the group spans more than one node's shared memory";
    return;
  }
  if (!one_arena || id == 0) {
    reason_ = "a rank's shard is not in the shared arena registered over the group (comm.shared_arena off, or host "
              "memory), or every shard is empty";
    return;
  }
  if (line >= detail::ShmNode::kMaxGroups) {
    reason_ = fmt::format("more than {} groups and shared buffers were made in this World", detail::ShmNode::kMaxGroups);
    return;
  }
  // Every rank registered arena `id` in one collective over its group and maps the others' regions.
  std::shared_ptr<const detail::ArenaView> view = node->arenas().get(id);
  ZS_ASSERT(view != nullptr, "shared arena {} holds this rank's shard but is not in the table", id);
  shard_.resize(static_cast<size_t>(g.size));
  bytes_.resize(static_cast<size_t>(g.size));
  node_rank_.resize(static_cast<size_t>(g.size));
  for (int p = 0; p < g.size; ++p) {
    const size_t r = static_cast<size_t>(at(p, kNodeRank));
    const size_t off = u32(at(p, kOffsetLo)) | (u32(at(p, kOffsetHi)) << 32);
    const size_t n = bytes_of(p);
    ZS_ASSERT(n == 0 || (view->base[r] != nullptr && off + n <= view->bytes[r]), "rank {}'s shard lies outside its arena region", p);
    shard_[static_cast<size_t>(p)] = n == 0 ? nullptr : p == g.rank ? static_cast<const unsigned char*>(shard) : view->base[r] + off;
    bytes_[static_cast<size_t>(p)] = n;
    node_rank_[static_cast<size_t>(p)] = static_cast<int>(r);
  }
  line_ = line;
  view_ = std::move(view);
  reason_.clear();
  version_ = 1;  // the shard as it is now: written before this call
  node->word(node->node_rank(), line_, kWritten).store(version_, std::memory_order_release);
}

SharedShards::~SharedShards() = default;

void SharedShards::wait_for(int p, int w, uint64_t v, const char* what) const {
  GroupState& g = state_of(*group_);
  const detail::ShmNode& node = *g.runtime->shm_node();
  const std::atomic<uint64_t>& word = node.word(node_rank_[static_cast<size_t>(p)], line_, w);
  if (word.load(std::memory_order_acquire) >= v) [[likely]] return;
  SpinProbe probe(Clock::now());
  const auto deadline = probe.start() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(g.config.timeout_s));
  for (uint64_t polls = 0; word.load(std::memory_order_acquire) < v; ++polls) {
    g.runtime->pause(false, probe);
    if (polls % 64 != 63) continue;
    if (Clock::now() >= deadline) [[unlikely]] {
      g.mark_broken(fmt::format("a one-sided gather timed out waiting for rank {}", p));
      const uint64_t seen = word.load(std::memory_order_acquire);
      throw CommError(fmt::format(
          "one-sided {} on {} timed out after {} s waiting for rank {} (world rank {}) to {} version {} of {} (it is "
          "at {}; comm.timeout_s = {}): that rank is stuck or has failed; check its errors, or raise comm.timeout_s if "
          "it legitimately takes longer",
          what, g.where(), g.config.timeout_s, p, g.world_ranks.empty() ? p : g.world_ranks[static_cast<size_t>(p)],
          w == kWritten ? "publish" : "finish reading", v, w == kWritten ? "its shard" : "the shards", seen,
          g.config.timeout_s));
    }
  }
}

void SharedShards::allgatherv(std::span<const size_t> offsets, const memory::Tensor& output,
                              std::span<const size_t> counts) const {
  ZS_ASSERT(active(), "SharedShards::allgatherv on an inactive object ({})", reason_);
  ZS_ASSERT(!writing_, "a one-sided gather between begin_write and end_write (it would read a shard being rewritten)");
  GroupState& g = state_of(*group_);
  const size_t n = shard_.size();
  ZS_ASSERT(offsets.size() == n && counts.size() == n, "{} offsets and {} counts for a group of {}", offsets.size(),
            counts.size(), n);
  if (g.is_broken.load(std::memory_order_acquire)) [[unlikely]] {
    std::lock_guard lock(g.mu);
    throw CommError(fmt::format("one-sided allgatherv on {}: not run because the group is unusable after an earlier "
                                "failure ({}); end the job with World::abort from the top-level error handler",
                                g.where(), g.broken));
  }
  const auto start = Clock::now();
  const memory::DType t = output.dtype();
  const size_t es = memory::dtype_size(t);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  ZS_ASSERT(static_cast<size_t>(output.numel()) == total, "output of {} elements for counts summing to {}",
            output.numel(), total);
  auto* out = static_cast<unsigned char*>(output.raw());
  const bool stream = total * es >= detail::kShmStreamMinBytes;
  size_t displ = 0;
  for (size_t p = 0; p < n; ++p) {
    const size_t b = counts[p] * es;
    ZS_ASSERT((offsets[p] + counts[p]) * es <= bytes_[p], "block of rank {} past its shard", p);
    if (b > 0) {
      if (static_cast<int>(p) != g.rank) wait_for(static_cast<int>(p), kWritten, version_, "allgatherv");
      const unsigned char* src = shard_[p] + offsets[p] * es;
      stream ? detail::copy_streaming(out + displ * es, src, b) : static_cast<void>(std::memcpy(out + displ * es, src, b));
    }
    displ += counts[p];
  }
  // Counted as the collective it replaces (Note [One-sided gathers]): group.cpp's byte rule for an
  // allgatherv, and the transport's path for the shared-memory counts.
  detail::Op op;
  op.code = detail::OpCode::kAllgatherv;
  op.group = std::shared_ptr<GroupState>(std::shared_ptr<GroupState>(), &g);
  op.lazy_sizes = true;
  op.dtype = t;
  op.counts = counts;
  const size_t own = counts[static_cast<size_t>(g.rank)];
  op.bytes_sent = op.bytes_received = (total - own) * es;
  for (size_t p = 0; p < n; ++p) {
    if (g.remote(static_cast<int>(p))) op.bytes_inter_host += counts[p] * es;
  }
  const size_t widest = es * *std::max_element(counts.begin(), counts.end());
  if (detail::small_path(g, t, widest, false)) {
    g.runtime->count_shared_memory();
  } else if (detail::ShmGroup* s = detail::usable(g, op, total * es); s != nullptr && s->nodes == 1) {
    g.runtime->count_direct();
    g.runtime->count_shared_memory();
  }
  g.runtime->record(op, Clock::now() - start);
}

void SharedShards::begin_write() {
  ZS_ASSERT(active() && !writing_, "SharedShards::begin_write {}", active() ? "twice" : "on an inactive object");
  const GroupState& g = detail::group_state(*group_);
  const detail::ShmNode& node = *g.runtime->shm_node();
  node.word(node.node_rank(), line_, kDone).store(version_, std::memory_order_release);
  for (int p = 0; p < g.size; ++p) {
    if (p != g.rank) wait_for(p, kDone, version_, "shard write");
  }
  writing_ = true;
}

void SharedShards::end_write() {
  ZS_ASSERT(writing_, "SharedShards::end_write without begin_write");
  writing_ = false;
  const detail::ShmNode& node = *detail::group_state(*group_).runtime->shm_node();
  node.word(node.node_rank(), line_, kWritten).store(++version_, std::memory_order_release);
}

}  // namespace zs::comm
