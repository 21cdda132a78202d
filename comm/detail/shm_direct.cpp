#include "comm/detail/shm_direct.h"

#include <algorithm>
#include <cstring>

#include "comm/detail/runtime.h"
#include "comm/detail/shm.h"
#include "comm/detail/shm_reduce.h"
#include "core/errors.h"

namespace zs::comm::detail {

using memory::DType;

// ---- the table ----

int64_t ArenaTable::next_seq() const {
  std::lock_guard lock(mu_);
  return next_seq_;
}

void ArenaTable::next_after(int64_t seq) {
  std::lock_guard lock(mu_);
  next_seq_ = std::max(next_seq_, seq + 1);
}

void ArenaTable::add(std::shared_ptr<const ArenaView> view) {
  std::lock_guard lock(mu_);
  views_.push_back(std::move(view));
}

void ArenaTable::remove(int64_t id) {
  std::lock_guard lock(mu_);
  std::erase_if(views_, [id](const auto& v) { return v->id == id; });
}

int64_t ArenaTable::find(int node_rank, const void* p, size_t bytes, uint64_t* offset) const {
  const auto* at = static_cast<const unsigned char*>(p);
  const size_t r = static_cast<size_t>(node_rank);
  std::lock_guard lock(mu_);
  for (const auto& v : views_) {
    const unsigned char* base = v->base[r];
    if (base != nullptr && at >= base && at + bytes <= base + v->bytes[r]) {
      *offset = static_cast<uint64_t>(at - base);
      return v->id;
    }
  }
  return 0;
}

std::shared_ptr<const ArenaView> ArenaTable::get(int64_t id) const {
  std::lock_guard lock(mu_);
  for (const auto& v : views_) {
    if (v->id == id) return v;
  }
  return nullptr;
}

// ---- the collectives ----

namespace {

ShmNode& node_of(const GroupState& g) { return *g.runtime->shm_node(); }

int64_t lookup(const GroupState& g, const void* p, size_t bytes, uint64_t* offset) {
  const ShmNode& node = node_of(g);
  return node.arenas().find(node.node_rank(), p, bytes, offset);
}

// Publishes this rank's offset of the tensor its peers read (an allreduce's: also write), passes the
// "sources ready" barrier and returns every member's base address of that tensor (this rank's own: `t`).
std::vector<unsigned char*> sources(GroupState& g, ShmGroup& s, const Op& op, const memory::Tensor& t,
                                    size_t bytes) {
  ShmNode& node = node_of(g);
  const int self = s.local[static_cast<size_t>(s.me)];
  uint64_t offset = 0;
  const int64_t id = lookup(g, t.raw(), bytes, &offset);
  ZS_ASSERT(id == op.agreed_arena, "{}: the tensor left shared arena {} between issue and run", op.describe(), op.agreed_arena);
  std::shared_ptr<const ArenaView> view = node.arenas().get(op.agreed_arena);
  ZS_ASSERT(view != nullptr, "{}: shared arena {} was dropped while a collective on it was queued", op.describe(), op.agreed_arena);
  node.word(self, s.flag_index, 1).store(offset, std::memory_order_relaxed);  // published by the barrier
  barrier(g, s, op);
  std::vector<unsigned char*> at(s.local.size());
  for (size_t p = 0; p < s.local.size(); ++p) {
    const int r = s.local[p];
    unsigned char* base = view->base[static_cast<size_t>(r)];
    ZS_ASSERT(base != nullptr, "{}: node rank {} has no region in shared arena {}", op.describe(), r, op.agreed_arena);
    at[p] = static_cast<int>(p) == s.me ? static_cast<unsigned char*>(t.raw())
                                        : base + node.word(r, s.flag_index, 1).load(std::memory_order_relaxed);
  }
  return at;
}

unsigned char* bytes_of(const memory::Tensor& t) { return static_cast<unsigned char*>(t.raw()); }

}  // namespace

int64_t arena_vote(const GroupState& g, const memory::Tensor& t, size_t bytes) {
  if (g.local() || g.shm == nullptr || g.runtime->shm_node() == nullptr || t.raw() == nullptr) return 0;
  uint64_t offset = 0;
  return lookup(g, t.raw(), bytes, &offset);
}

void direct_allgatherv(GroupState& g, ShmGroup& s, const Op& op, const memory::Tensor& input,
                       const memory::Tensor& output, std::span<const int> counts, std::span<const int> displs) {
  const size_t es = memory::dtype_size(input.dtype());
  const size_t me = static_cast<size_t>(s.me);
  const size_t own = static_cast<size_t>(counts[me]) * es;
  unsigned char* out = bytes_of(output);
  unsigned char* own_out = out + static_cast<size_t>(displs[me]) * es;
  const auto* in = static_cast<const unsigned char*>(input.raw());
  // Only an input exactly in place may overlap the output (allgatherv_op votes no arena otherwise), so
  // the own block goes out before the first barrier: it overlaps the wait for the peers, and in place
  // (ZeRO's bucket gathers) nothing is copied but the peers' blocks.
  ZS_ASSERT(in == own_out || own_out + own <= in || in + own <= own_out, "{}: shifted overlap on the direct path",
            op.describe());
  const bool stream = static_cast<size_t>(output.numel()) * es >= kShmStreamMinBytes;
  auto copy = [stream](unsigned char* dst, const unsigned char* src, size_t n) {
    stream ? copy_streaming(dst, src, n) : static_cast<void>(std::memcpy(dst, src, n));
  };
  if (own > 0 && in != own_out) copy(own_out, in, own);
  const std::vector<unsigned char*> src = sources(g, s, op, input, own);
  for (size_t p = 0; p < src.size(); ++p) {
    const size_t n = static_cast<size_t>(counts[p]) * es;
    if (p != me && n > 0) copy(out + static_cast<size_t>(displs[p]) * es, src[p], n);
  }
  barrier(g, s, op);  // nobody returns (and overwrites its input) while a peer still reads it
}

void direct_reduce_scatter(GroupState& g, ShmGroup& s, const Op& op, const memory::Tensor& input,
                           const memory::Tensor& output, std::span<const int> counts, std::span<const int> displs,
                           ReduceOp r) {
  const DType t = input.dtype();
  const size_t es = memory::dtype_size(t);
  const size_t me = static_cast<size_t>(s.me);
  const std::vector<unsigned char*> base = sources(g, s, op, input, static_cast<size_t>(input.numel()) * es);
  const size_t n = static_cast<size_t>(counts[me]);
  if (n > 0) {
    std::vector<const void*> srcs(base.size());
    for (size_t p = 0; p < base.size(); ++p) srcs[p] = base[p] + static_cast<size_t>(displs[me]) * es;
    // In place, the output is this rank's own shard of its input: srcs[me] == output, which reduce_sum allows.
    reduce_sum(srcs, t, output.raw(), t, n, r == ReduceOp::kAverage ? static_cast<float>(g.size) : 1.0f);
  }
  barrier(g, s, op);
}

void direct_allreduce(GroupState& g, ShmGroup& s, const Op& op, const memory::Tensor& data, ReduceOp r) {
  const DType t = data.dtype();
  const size_t es = memory::dtype_size(t);
  const size_t n = static_cast<size_t>(data.numel());
  const size_t L = s.local.size();
  const size_t me = static_cast<size_t>(s.me);
  const float divisor = r == ReduceOp::kAverage ? static_cast<float>(g.size) : 1.0f;
  const std::vector<unsigned char*> base = sources(g, s, op, data, n * es);
  // Sub-slice `me` of every rank's tensor is read and written by this rank only (Note [Direct
  // allreduce's writes]): summed chunk by chunk into its own tensor, each chunk then copied, still in
  // L1, into the peers' tensors over lines this rank has just read.
  const auto [lo, hi] = sub_slice(n, L, me);
  const size_t chunk = kAllreduceChunkBytes / es;
  std::vector<const void*> srcs(L);
  for (size_t i = lo; i < hi; i += chunk) {
    const size_t m = std::min(chunk, hi - i);
    for (size_t p = 0; p < L; ++p) srcs[p] = base[p] + i * es;
    reduce_sum(srcs, t, base[me] + i * es, t, m, divisor);
    for (size_t p = 0; p < L; ++p) {
      if (p != me) std::memcpy(base[p] + i * es, base[me] + i * es, m * es);
    }
  }
  barrier(g, s, op);  // every sub-slice written everywhere; nobody returns while a peer still writes
}

void direct_broadcast(GroupState& g, ShmGroup& s, const Op& op, const memory::Tensor& data, int root) {
  const size_t bytes = static_cast<size_t>(data.numel()) * memory::dtype_size(data.dtype());
  const std::vector<unsigned char*> src = sources(g, s, op, data, bytes);
  if (s.me != root) {  // one node: local index = group rank
    if (bytes >= kShmStreamMinBytes) {
      copy_streaming(bytes_of(data), src[static_cast<size_t>(root)], bytes);
    } else {
      std::memcpy(bytes_of(data), src[static_cast<size_t>(root)], bytes);
    }
  }
  barrier(g, s, op);  // the root returns (and may overwrite its tensor) once every rank has read it
}

}  // namespace zs::comm::detail
