// Small collectives through the node window in one exchange (Note [Small collectives] in
// comm/detail/small.h). No MPI call here except the wait notices' (after WaitNotices::kAnnounceAfter).
#include "comm/detail/small.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <vector>

#include "comm/detail/runtime.h"
#include "comm/detail/shm_reduce.h"
#include "comm/detail/transport.h"
#include "memory/dtype.h"

namespace zs::comm::detail {

using memory::DType;

namespace {

constexpr int kQuickPolls = 128;  // wait_for's first polls, a pause apart
constexpr int kDoneWord = 6;  // the last index whose peers' buffers this rank has finished reading
// A buffer: the tag (word 0, stored last), the signature, then the data, from the same cache line.
constexpr size_t kTagAt = 0, kSignatureAt = 8, kHeader = 40;
static_assert(kHeader <= ShmNode::kSmallSlotBytes - kSmallMaxBytes && kHeader % 8 == 0);

// A post's tag: the group's flag line (never reused by another group) and the op's index among the
// group's small collectives, so unique among one rank's posts. Index 0 is never posted.
uint64_t tag_of(int flag_index, uint64_t e) { return static_cast<uint64_t>(flag_index) << 48 | e; }

std::atomic<uint64_t>& tag_word(unsigned char* buffer) {
  static_assert(std::atomic<uint64_t>::is_always_lock_free, "tags are shared between processes");
  return *reinterpret_cast<std::atomic<uint64_t>*>(buffer + kTagAt);
}

// Polls until ready(); CommError after comm.timeout_s from the probe's start, or when the wait
// notices find a deadlock (Note [Polling], Note [Waits across groups]).
template <typename Ready>
void wait_for(const Op& op, bool on_worker, SpinProbe& probe, Ready&& ready) {
  if (ready()) [[likely]] return;
  Runtime& rt = *op.group->runtime;
  // A peer a few microseconds behind: poll between pauses only, no clock read or deadline check (about
  // 3 us; never where a spin would keep a peer off its core).
  if (!rt.oversubscribed()) {
    for (int i = 0; i < kQuickPolls; ++i) {
      cpu_relax();
      if (ready()) return;
    }
  }
  // The op's first wait that finds a peer missing starts the clock (no clock read when none does).
  if (probe.start() == Clock::time_point{}) probe = SpinProbe(Clock::now());
  const auto start = probe.start();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(op.group->config.timeout_s));
  auto check_at = start + WaitNotices::kAnnounceAfter;
  while (!ready()) {
    const auto now = Clock::now();
    if (now >= deadline) [[unlikely]] rt.fail_wait(op, {});
    if (now >= check_at) [[unlikely]] {
      check_at = now + WaitNotices::kCheckEvery;
      const std::string failure = rt.notices()->find_deadlock(op);
      if (!failure.empty()) rt.fail_wait(op, failure);
    }
    rt.pause(on_worker, probe);
  }
}

// dst = the sum over ranks, in rank order, of each rank's carried bytes from `at` (n elements of t).
void sum_ranks(const Op& op, DType t, size_t at, void* dst, size_t n, ReduceOp r) {
  const size_t size = op.carried.size();
  const float divisor = r == ReduceOp::kAverage ? static_cast<float>(size) : 1.0f;
  if (t == DType::kF32 && n < 16) {  // reduce_sum_scalar's fp32 sums, inlined (Note [Lean small path])
    auto* out = static_cast<float*>(dst);
    for (size_t i = 0; i < n; ++i) {
      float acc;
      std::memcpy(&acc, op.carried[0] + at + i * 4, 4);
      for (size_t q = 1; q < size; ++q) {
        float v;
        std::memcpy(&v, op.carried[q] + at + i * 4, 4);
        acc += v;
      }
      if (divisor != 1.0f) acc /= divisor;
      out[i] = acc;
    }
    return;
  }
  std::array<const void*, 64> few;  // a node's ranks, without an allocation per call
  std::vector<const void*> many(size > few.size() ? size : 0);
  const void** srcs = size > few.size() ? many.data() : few.data();
  for (size_t q = 0; q < size; ++q) srcs[q] = op.carried[q] + at;
  if (t != DType::kI32 && n < 16) {  // a few scalars (a loss, a norm): the scalar kernel, whose bits every kernel has
    reduce_sum_scalar(srcs, size, t, dst, t, n, divisor);
  } else {
    reduce_sum({srcs, size}, t, dst, t, n, divisor);
  }
}

// Waits for every peer's post tagged `want` (in either of its buffers), widens hi/lo by its signature
// and points s.carried at its data.
void read_posts(const Op& op, bool on_worker, SpinProbe& probe, const ShmNode& node, ShmGroup& s, uint64_t want,
                std::array<int64_t, 4>& hi, std::array<int64_t, 4>& lo) {
  const size_t L = s.local.size(), me = static_cast<size_t>(s.me);
  for (size_t p = 0; p < L; ++p) {
    if (p == me) continue;
    unsigned char* const buffers[2] = {node.small_slot(s.local[p], 0), node.small_slot(s.local[p], 1)};
    unsigned char* theirs = nullptr;
    wait_for(op, on_worker, probe, [&] {
      for (unsigned char* b : buffers) {
        if (tag_word(b).load(std::memory_order_acquire) == want) theirs = b;
      }
      return theirs != nullptr;
    });
    std::array<int64_t, 4> signature;
    std::memcpy(signature.data(), theirs + kSignatureAt, sizeof signature);
    for (size_t i = 0; i < 4; ++i) {
      hi[i] = std::max(hi[i], signature[i]);
      lo[i] = std::min(lo[i], signature[i]);
    }
    s.carried[p] = theirs + kHeader;
  }
}

// Copies `n` bytes to offset `at` of a buffer's data, the part past the buffer's first cache line
// first: that line (the tag's, which the peers poll) is written last, in one burst with the signature
// and the tag (Note [Small path's waits]).
void put(unsigned char* buffer, size_t at, const unsigned char* from, size_t n) {
  constexpr size_t kFirst = 64 - kHeader;  // data bytes in the tag's line
  const size_t head = at < kFirst ? std::min(n, kFirst - at) : 0;
  if (n > head) std::memcpy(buffer + kHeader + at + head, from + head, n - head);
  if (head > 0) std::memcpy(buffer + kHeader + at, from, head);
}

// Copies into `buffer` what this rank's peers read of its carried bytes and returns where this rank
// reads its own contribution (Note [Small collectives]: "What rides per rank"). A reduce-scatter's
// own block is read only here, so it stays in the input (unless the output overlaps the input other
// than exactly in place: then everything is staged, so the sums read nothing they have overwritten),
// and a broadcast's non-root ranks stage nothing: every staged line costs the peers a transfer.
const unsigned char* stage(const Op& op, unsigned char* buffer) {
  const auto* in = static_cast<const unsigned char*>(op.carry_from);
  const size_t me = static_cast<size_t>(op.group->rank), bytes = op.carry_bytes;
  if (op.code == OpCode::kBroadcast && static_cast<int64_t>(me) != op.signature[3]) return buffer + kHeader;
  if (op.code == OpCode::kReduceScatter) {
    const size_t es = memory::dtype_size(op.dtype);
    size_t at = 0;
    for (size_t q = 0; q < me; ++q) at += op.counts[q] * es;
    const size_t own = op.counts[me] * es;
    const auto* out = static_cast<const unsigned char*>(op.carry_to);
    if (own == 0 || out == in + at || out + own <= in || in + bytes <= out) {
      if (bytes > at + own) put(buffer, at + own, in + at + own, bytes - at - own);
      if (at > 0) put(buffer, 0, in, at);
      return in;
    }
  }
  // A rank may contribute nothing (an allgatherv piece of 0 elements): no source to copy from then, and
  // memcpy from a null pointer is undefined even for 0 bytes.
  if (bytes > 0) put(buffer, 0, in, bytes);
  return buffer + kHeader;
}

}  // namespace

bool small_path(const GroupState& g, DType t, size_t payload, bool reduces) {
  if (g.local() || g.simulated || g.size < 2 || g.config.shared_memory == SharedMemory::kOff) return false;
  const ShmGroup* s = g.shm.get();
  if (s == nullptr || !s->enabled || s->nodes > 1 || g.runtime->shm_node() == nullptr) return false;
  if (payload == 0 || payload > kSmallMaxBytes) return false;
  return !reduces || t != DType::kF32 || g.size == 2;  // fp32 on more ranks: MPI's order
}

bool carry_if_small(Op& op, DType t, size_t payload, bool reduces, const memory::Tensor& from, size_t bytes,
                    const memory::Tensor& to, bool async) {
  if (!small_path(*op.group, t, payload, reduces)) return false;
  op.small = true;
  op.carry_from = from.raw();
  op.carry_bytes = bytes;
  op.carry_to = to.raw();
  if (async) op.keep = {from, to};
  return true;
}

void small_exchange(Op& op, bool on_worker) {
  GroupState& g = *op.group;
  ShmGroup& s = *g.shm;
  ShmNode& node = *g.runtime->shm_node();
  const size_t L = s.local.size(), me = static_cast<size_t>(s.me);
  const int self = s.local[me];
  const uint64_t e = ++s.small_epoch;
  s.small_posts_read = false;
  const int b = node.small_next;
  node.small_next ^= 1;
  SpinProbe probe{Clock::time_point{}};  // one for both waits: they share the start and the timeout
  ShmNode::SmallUse& use = node.small_uses[static_cast<size_t>(b)];
  // The readers of this buffer's last contents must be done with it. Implied when they were this
  // group's members two or more of its ops ago: each posted the op after that one, which this rank has
  // read, only after reading this buffer. Otherwise their done words say so.
  if (use.flag_index >= 0 && !(use.flag_index == s.flag_index && use.epoch + 2 <= e)) {
    wait_for(op, on_worker, probe, [&] {
      for (int r : use.readers) {
        if (node.word(r, use.flag_index, kDoneWord).load(std::memory_order_acquire) < use.epoch) return false;
      }
      return true;
    });
  }
  unsigned char* mine = node.small_slot(self, b);
  const unsigned char* own = stage(op, mine);
  std::memcpy(mine + kSignatureAt, op.signature.data(), sizeof op.signature);
  const uint64_t want = tag_of(s.flag_index, e);
  tag_word(mine).store(want, std::memory_order_release);  // the post
  if (use.flag_index != s.flag_index) {
    use.readers.clear();
    for (size_t p = 0; p < L; ++p) {
      if (p != me) use.readers.push_back(s.local[p]);
    }
  }
  use.flag_index = s.flag_index;
  use.epoch = e;
  if (s.carried.size() != L) s.carried.resize(L);
  s.carried[me] = own;
  op.carried = s.carried;
  std::array<int64_t, 4> hi = op.signature, lo = op.signature;
  try {
    read_posts(op, on_worker, probe, node, s, want, hi, lo);
    s.small_posts_read = true;
  } catch (...) {
    // This rank gives up the op (the caller ends the job): nobody waits for its reads, and it does
    // not wait for its readers before writing this buffer again (a late peer then never finds this
    // op's tag, and ends by the timeout or the wait notices, if the job has not ended first).
    small_done(op);
    use.flag_index = -1;
    throw;
  }
  if (hi != lo) {
    small_done(op);  // nothing more is read here
    Runtime::check_signatures(op, hi, lo);
  }
}

void small_done(const Op& op) {
  const ShmGroup& s = *op.group->shm;
  const int self = s.local[static_cast<size_t>(s.me)];
  op.group->runtime->shm_node()->word(self, s.flag_index, kDoneWord).store(s.small_epoch, std::memory_order_release);
}

void small_reclaim(const Op& op) {
  ShmGroup& s = *op.group->shm;
  ShmNode& node = *op.group->runtime->shm_node();
  const int self = s.local[static_cast<size_t>(s.me)];
  // The next buffer's data lines, which this group's peers read in its previous op and still hold
  // shared: stored now, while the caller goes on, so that the next op's stores need no invalidation
  // round trip before its tag (Note [Small path's waits]). Only when that op was this group's and
  // every peer has posted this one since (so each is done reading it); the tag's line is left alone
  // (the peers poll it).
  const ShmNode::SmallUse& next = node.small_uses[static_cast<size_t>(node.small_next)];
  if (s.small_posts_read && next.flag_index == s.flag_index && next.epoch + 1 == s.small_epoch) {
    unsigned char* buffer = node.small_slot(self, node.small_next);
    const size_t end = kHeader + op.carry_bytes;  // this op's size: the likely size of the next
    for (size_t at = 64; at < end; at += 64) {  // a store per line (prefetchw measured no gain)
      reinterpret_cast<std::atomic<uint64_t>*>(buffer + at)->store(0, std::memory_order_relaxed);
    }
  }
  s.small_posts_read = false;
}

void small_body(const Op& op) {
  const DType t = op.dtype;
  const size_t es = memory::dtype_size(t), me = static_cast<size_t>(op.group->rank);
  switch (op.code) {
    case OpCode::kAllreduce: sum_ranks(op, t, 0, op.carry_to, op.numel, op.reduce); return;
    case OpCode::kReduceScatter: {  // this rank's block of every rank's input (its own: from the input)
      size_t at = 0;
      for (size_t q = 0; q < me; ++q) at += op.counts[q];
      sum_ranks(op, t, at * es, op.carry_to, op.counts[me], op.reduce);
      return;
    }
    case OpCode::kAllgather:
    case OpCode::kAllgatherv: {
      const size_t L = op.carried.size();
      auto* out = static_cast<unsigned char*>(op.carry_to);
      size_t total = 0;
      for (size_t q = 0; q < L; ++q) total += op.counts.empty() ? op.numel : op.counts[q];
      // This rank's own block from its input, or nothing in place; an input elsewhere in the output
      // may be overwritten by the blocks before it, so then from its copy in this rank's buffer.
      const auto* in = static_cast<const unsigned char*>(op.carry_from);
      const bool inside = in < out + total * es && out < in + op.carry_bytes;  // overlaps the output
      for (size_t q = 0; q < L; ++q) {
        const size_t bytes = (op.counts.empty() ? op.numel : op.counts[q]) * es;
        const void* from = q != me ? op.carried[q] : inside && in != out ? op.carried[q] : in;
        if (bytes > 0 && from != out) std::memcpy(out, from, bytes);
        out += bytes;
      }
      return;
    }
    case OpCode::kBroadcast: {
      const size_t root = static_cast<size_t>(op.signature[3]);
      if (me != root) std::memcpy(op.carry_to, op.carried[root], op.carry_bytes);
      return;
    }
    default: ZS_ASSERT(false, "{} has no small body", op_name(op.code));
  }
}

}  // namespace zs::comm::detail
