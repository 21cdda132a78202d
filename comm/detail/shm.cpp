// The shared-memory collectives (Note [Shared-memory collectives] in comm/detail/shm.h): no MPI call
// here; the window they run in is made in comm/detail/node_window.cpp.
#include "comm/detail/shm.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "comm/detail/runtime.h"
#include "comm/detail/shm_direct.h"
#include "comm/detail/shm_reduce.h"
#include "core/errors.h"

namespace zs::comm::detail {

using memory::DType;

namespace {

constexpr size_t kAlign = 64;                                   // elements: pieces start on cache lines
constexpr auto kSpin = std::chrono::milliseconds(20);           // as the handshake's kCallerSpin
constexpr auto kShortSpin = std::chrono::microseconds(50);      // as its kWorkerSpin (Note [Contended cores])

size_t piece(size_t count, size_t k, size_t m) { return count > k * m ? std::min(m, count - k * m) : 0; }

size_t round_down(size_t x, size_t a) { return std::max(a, x / a * a); }

}  // namespace

ShmGroup* usable(GroupState& g, const Op& op, size_t bytes) {
  const SharedMemory mode = g.config.shared_memory;
  if (g.local() || g.size < 2 || mode == SharedMemory::kOff) return nullptr;
  if (mode == SharedMemory::kAuto && bytes < kShmAutoMinBytes) return nullptr;
  ShmGroup* s = g.shm.get();
  if (s == nullptr || !s->enabled) {
    if (mode == SharedMemory::kOn) {
      throw CommError(fmt::format("{}: comm.shared_memory is true but {}; set it to \"auto\" to fall back to MPI's "
                                  "collectives", op.describe(),
                                  s ? s->disabled_reason : std::string("the World has no shared-memory window (it was "
                                                                       "started with comm.shared_memory = false)")));
    }
    return nullptr;
  }
  return s->max_local > 1 ? s : nullptr;
}

// Note [Shared-memory collectives]: flags, the same timeout as the handshake.
void barrier(GroupState& g, ShmGroup& s, const Op& op) {
  const ShmNode& node = *g.runtime->shm_node();
  const uint64_t e = ++s.epoch;
  node.flag(s.local[static_cast<size_t>(s.me)], s.flag_index).store(e, std::memory_order_release);
  SpinProbe probe(Clock::now());
  const auto start = probe.start();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(g.config.timeout_s));
  const bool yield = g.runtime->oversubscribed();
  RecentContention& contention = g.runtime->contention();
  for (size_t p = 0; p < s.local.size(); ++p) {
    if (static_cast<int>(p) == s.me) continue;
    const std::atomic<uint64_t>& f = node.flag(s.local[p], s.flag_index);
    for (uint64_t polls = 0; f.load(std::memory_order_acquire) < e; ++polls) {
      // Note [Polling] in runtime.h: spin with a pause (a sched_yield per miss would hand the core to
      // another process for a whole slice), yield only when the node runs more ranks than CPUs, and
      // after kSpin sleep elapsed/32 (10 us to 1 ms); after only kShortSpin while the cores are
      // shared with other busy processes (Note [Contended cores] in comm/detail/contention.h).
      if (yield) {
        sched_yield();
      } else {
        cpu_relax();
      }
      if (polls % 64 != 63) continue;
      const auto now = Clock::now();
      if (now >= deadline) [[unlikely]] {
        g.mark_broken(fmt::format("{} timed out in a shared-memory barrier", op_name(op.code)));
        throw CommError(fmt::format(
            "{} timed out after {} s waiting for the other ranks of the group at a shared-memory barrier "
            "(comm.timeout_s = {}): a rank is stuck or has failed; check the other ranks' errors, or raise "
            "comm.timeout_s if a rank legitimately takes longer",
            op.describe(), g.config.timeout_s, g.config.timeout_s));
      }
      // Yields hand the core to our own ranks by design: not contention (Note [Our own ranks' turns]).
      bool contended = !yield && contention.recent(now);
      if (!yield && !contended && now - start <= kSpin && probe.contended(now)) [[unlikely]] {  // still spinning
        contention.seen(now);
        contended = true;
      }
      if (now - start > (contended ? Clock::duration(kShortSpin) : Clock::duration(kSpin))) {
        const long elapsed_us = std::chrono::duration_cast<std::chrono::microseconds>(now - start).count();
        std::this_thread::sleep_for(std::chrono::microseconds(std::clamp(elapsed_us / 32, 10L, 1000L)));
      }
    }
  }
}

namespace {
unsigned char* bytes(const memory::Tensor& t) { return static_cast<unsigned char*>(t.raw()); }
}  // namespace

// ---- the collectives ----

bool shm_reduce_scatter(GroupState& g, const Op& op, const memory::Tensor& input, const memory::Tensor& output,
                        std::span<const int> counts, std::span<const int> displs, ReduceOp r) {
  ShmGroup* s = usable(g, op, static_cast<size_t>(input.numel()) * memory::dtype_size(input.dtype()));
  if (s == nullptr || s->nodes > 1) return false;
  if (op.agreed_arena != 0) {  // Note [Direct collectives]
    direct_reduce_scatter(g, *s, op, input, output, counts, displs, r);
    g.runtime->count_direct();
    g.runtime->count_shared_memory();
    return true;
  }
  const ShmNode& node = *g.runtime->shm_node();
  const DType t = input.dtype();
  const size_t es = memory::dtype_size(t);
  const size_t L = s->local.size();
  const size_t me = static_cast<size_t>(s->me);
  const size_t m = round_down(ShmNode::kRoundBytes / L / es, kAlign);  // elements per destination per round
  const size_t most = static_cast<size_t>(*std::max_element(counts.begin(), counts.end()));
  const size_t rounds = (most + m - 1) / m;
  const float divisor = r == ReduceOp::kAverage ? static_cast<float>(g.size) : 1.0f;
  const unsigned char* in = bytes(input);
  unsigned char* out = bytes(output);
  std::vector<const void*> srcs(L);
  for (size_t k = 0; k < rounds; ++k) {
    const int b = static_cast<int>(k & 1);
    unsigned char* mine = node.slot(s->local[me], b);
    for (size_t j = 0; j < L; ++j) {  // stage every other rank's piece of this round
      const size_t n = piece(static_cast<size_t>(counts[j]), k, m);
      if (j != me && n > 0) std::memcpy(mine + j * m * es, in + (static_cast<size_t>(displs[j]) + k * m) * es, n * es);
    }
    barrier(g, *s, op);
    const size_t n = piece(static_cast<size_t>(counts[me]), k, m);
    if (n == 0) continue;
    for (size_t p = 0; p < L; ++p) {
      srcs[p] = p == me ? static_cast<const void*>(in + (static_cast<size_t>(displs[me]) + k * m) * es)
                        : node.slot(s->local[p], b) + me * m * es;
    }
    reduce_sum(srcs, t, out + k * m * es, t, n, divisor);
  }
  barrier(g, *s, op);  // nobody still reads a slot when its owner leaves
  g.runtime->count_shared_memory();
  return true;
}

bool shm_allgatherv(GroupState& g, const Op& op, const memory::Tensor& input, const memory::Tensor& output,
                    std::span<const int> counts, std::span<const int> displs) {
  ShmGroup* s = usable(g, op, static_cast<size_t>(output.numel()) * memory::dtype_size(output.dtype()));
  if (s == nullptr || s->nodes > 1) return false;
  if (op.agreed_arena != 0) {  // Note [Direct collectives]
    direct_allgatherv(g, *s, op, input, output, counts, displs);
    g.runtime->count_direct();
    g.runtime->count_shared_memory();
    return true;
  }
  const ShmNode& node = *g.runtime->shm_node();
  const size_t es = memory::dtype_size(input.dtype());
  const size_t L = s->local.size();
  const size_t me = static_cast<size_t>(s->me);
  const size_t m = round_down(ShmNode::kRoundBytes / es, kAlign);
  const size_t most = static_cast<size_t>(*std::max_element(counts.begin(), counts.end()));
  const size_t rounds = (most + m - 1) / m;
  const unsigned char* in = bytes(input);
  unsigned char* out = bytes(output);
  const size_t own = static_cast<size_t>(counts[me]);
  unsigned char* own_out = out + static_cast<size_t>(displs[me]) * es;
  // Out of place, the own block goes to the output round by round from the piece just staged (still
  // in cache: one read of the input instead of two); an input overlapping the output moves first.
  const bool overlap = own_out != in && own_out < in + own * es && in < own_out + own * es;
  if (overlap && own > 0) std::memmove(own_out, in, own * es);
  const unsigned char* src = overlap ? own_out : in;
  const bool stream = static_cast<size_t>(output.numel()) * es >= kShmStreamMinBytes;
  auto copy_out = [stream](void* d, const void* from, size_t nbytes) {
    stream ? copy_streaming(d, from, nbytes) : static_cast<void>(std::memcpy(d, from, nbytes));
  };
  for (size_t k = 0; k < rounds; ++k) {
    const int b = static_cast<int>(k & 1);
    const size_t n = piece(own, k, m);
    if (n > 0) {
      std::memcpy(node.slot(s->local[me], b), src + k * m * es, n * es);
      if (src != own_out) copy_out(own_out + k * m * es, src + k * m * es, n * es);
    }
    barrier(g, *s, op);
    for (size_t p = 0; p < L; ++p) {
      const size_t np = piece(static_cast<size_t>(counts[p]), k, m);
      if (p != me && np > 0) copy_out(out + (static_cast<size_t>(displs[p]) + k * m) * es, node.slot(s->local[p], b), np * es);
    }
  }
  barrier(g, *s, op);
  g.runtime->count_shared_memory();
  return true;
}

// Only in place (Note [Direct collectives]): staging a broadcast through the root's slots (round by
// round, or streamed in chunks) measured 0.2-0.5x raw OpenMPI from 16 KiB at times on this VM, the
// readers copying lines the root had just written (docs/benchmarks.md), so a tensor outside a shared
// arena keeps MPI's broadcast.
bool shm_broadcast(GroupState& g, const Op& op, const memory::Tensor& data, int root) {
  ShmGroup* s = usable(g, op, static_cast<size_t>(data.numel()) * memory::dtype_size(data.dtype()));
  if (s == nullptr || s->nodes > 1 || op.agreed_arena == 0) return false;
  direct_broadcast(g, *s, op, data, root);
  g.runtime->count_direct();
  g.runtime->count_shared_memory();
  return true;
}

namespace {
size_t block_bytes(const Block& b) {
  size_t n = 0;
  for (const BlockPiece& p : b) n += p.bytes;
  return n;
}
}  // namespace

bool shm_alltoallv(GroupState& g, const Op& op, std::span<const Block> send, std::span<const Block> recv, bool stream) {
  ShmGroup* s = usable(g, op, kShmAutoMinBytes);  // every size (see the header)
  if (s == nullptr || s->nodes > 1) return false;
  const ShmNode& node = *g.runtime->shm_node();
  const size_t L = s->local.size();
  const size_t me = static_cast<size_t>(s->me);
  const size_t m = round_down(ShmNode::kRoundBytes / (L - 1), 4096);  // bytes per peer per round
  auto region = [m](size_t peer, size_t owner) { return (peer - (peer > owner ? 1 : 0)) * m; };  // peer's, in owner's slot
  std::vector<size_t> send_bytes(L), recv_bytes(L);
  uint64_t need = 0;
  for (size_t j = 0; j < L; ++j) {
    send_bytes[j] = block_bytes(send[j]);
    recv_bytes[j] = block_bytes(recv[j]);
    if (j != me) need = std::max<uint64_t>({need, (send_bytes[j] + m - 1) / m, (recv_bytes[j] + m - 1) / m});
  }
  node.word(s->local[me], s->flag_index, 1).store(need, std::memory_order_relaxed);  // published by barrier 1
  const CopyFn out_copy = stream ? copy_streaming : nullptr;
  uint64_t rounds = 1;  // at least the barrier that publishes `need`
  for (uint64_t k = 0; k < rounds; ++k) {
    const int b = static_cast<int>(k & 1);
    unsigned char* mine = node.slot(s->local[me], b);
    for (size_t j = 0; j < L; ++j) {
      const size_t n = piece(send_bytes[j], k, m);
      if (j != me && n > 0) copy_from_block(send[j], k * m, n, mine + region(j, me));
    }
    barrier(g, *s, op);
    if (k == 0) {
      rounds = 0;
      for (size_t p = 0; p < L; ++p)
        rounds = std::max(rounds, node.word(s->local[p], s->flag_index, 1).load(std::memory_order_relaxed));
    }
    for (size_t p = 0; p < L; ++p) {
      const size_t n = piece(recv_bytes[p], k, m);
      if (p != me && n > 0) copy_to_block(recv[p], k * m, n, node.slot(s->local[p], b) + region(me, p), out_copy);
    }
  }
  // This rank's own block, piece to piece (never staged).
  copy_block(send[me], recv[me], std::min(send_bytes[me], recv_bytes[me]), out_copy);
  barrier(g, *s, op);
  g.runtime->count_shared_memory();
  return true;
}

std::pair<size_t, size_t> sub_slice(size_t n, size_t L, size_t j) {
  const size_t q = (n + L - 1) / L;
  const size_t step = (q + kAlign - 1) / kAlign * kAlign;
  return {std::min(n, j * step), std::min(n, (j + 1) * step)};
}

bool shm_allreduce(GroupState& g, const Op& op, const memory::Tensor& data, ReduceOp r) {
  ShmGroup* s = usable(g, op, static_cast<size_t>(data.numel()) * memory::dtype_size(data.dtype()));
  if (s == nullptr || s->nodes > 1) return false;  // across nodes: comm/detail/transport_hierarchical.cpp
  const DType t = data.dtype();
  const size_t n = static_cast<size_t>(data.numel());
  const float divisor = r == ReduceOp::kAverage ? static_cast<float>(g.size) : 1.0f;
  unsigned char* d = bytes(data);
  if (op.agreed_arena != 0) {  // Note [Direct collectives]
    direct_allreduce(g, *s, op, data, r);
    g.runtime->count_direct();
    g.runtime->count_shared_memory();
    return true;
  }
  const ShmNode& node = *g.runtime->shm_node();
  const size_t es = memory::dtype_size(t);
  const size_t L = s->local.size();
  const size_t me = static_cast<size_t>(s->me);
  std::vector<const void*> srcs(L);
  if (L == 2) {  // both sum everything: one barrier per round (Note [Shared-memory collectives])
    const size_t M = round_down(ShmNode::kRoundBytes / es, kAlign);
    for (size_t k = 0; k * M < n; ++k) {
      const int b = static_cast<int>(k & 1);
      const size_t nk = std::min(M, n - k * M);
      unsigned char* base = d + k * M * es;
      std::memcpy(node.slot(s->local[me], b), base, nk * es);
      barrier(g, *s, op);
      srcs[me] = base;
      srcs[1 - me] = node.slot(s->local[1 - me], b);
      reduce_sum(srcs, t, base, t, nk, divisor);
    }
    barrier(g, *s, op);
    g.runtime->count_shared_memory();
    return true;
  }
  const size_t M = round_down(ShmNode::kRoundBytes / es, kAlign * L);
  const bool stream = n * es >= kShmStreamMinBytes;
  for (size_t k = 0; k * M < n; ++k) {
    const int b = static_cast<int>(k & 1);
    const size_t nk = std::min(M, n - k * M);
    unsigned char* base = d + k * M * es;
    unsigned char* mine = node.slot(s->local[me], b);
    const auto [lo, hi] = sub_slice(nk, L, me);
    std::memcpy(mine, base, lo * es);  // stage all but this rank's own sub-slice, which only it reads
    std::memcpy(mine + hi * es, base + hi * es, (nk - hi) * es);
    barrier(g, *s, op);
    for (size_t p = 0; p < L; ++p) srcs[p] = p == me ? base + lo * es : node.slot(s->local[p], b) + lo * es;
    if (hi > lo) reduce_sum(srcs, t, mine + lo * es, t, hi - lo, divisor);
    barrier(g, *s, op);
    for (size_t p = 0; p < L; ++p) {
      const auto [plo, phi] = sub_slice(nk, L, p);
      if (phi <= plo) continue;
      if (stream) {
        copy_streaming(base + plo * es, node.slot(s->local[p], b) + plo * es, (phi - plo) * es);
      } else {
        std::memcpy(base + plo * es, node.slot(s->local[p], b) + plo * es, (phi - plo) * es);
      }
    }
  }
  barrier(g, *s, op);
  g.runtime->count_shared_memory();
  return true;
}

}  // namespace zs::comm::detail
