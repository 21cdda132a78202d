// The choice of a group's transport (Note [Transports] in comm/detail/transport.h) and the helpers
// every transport shares.
#include "comm/detail/transport.h"

#include <algorithm>
#include <cstring>

#include "comm/detail/runtime.h"
#include "comm/detail/shm.h"
#include "comm/mpi_check.h"
#include "core/errors.h"

namespace zs::comm::detail {

bool Counts::equal() const {
  return std::all_of(counts.begin(), counts.end(), [&](int x) { return x == counts[0]; });
}

// ---- blocks ----

namespace {
// Calls fn(piece_bytes, linear_offset, c) for each run of the block's bytes [at, at + n): the one walk
// both copy directions share.
template <typename Fn>
void for_each_block_run(const Block& block, size_t at, size_t n, const char* what, Fn&& fn) {
  size_t done = 0;
  for (const BlockPiece& p : block) {
    if (done == n) return;
    if (at >= p.bytes) {
      at -= p.bytes;
      continue;
    }
    const size_t c = std::min(n - done, p.bytes - at);
    fn(p.data + at, done, c);
    done += c;
    at = 0;
  }
  ZS_ASSERT(done == n, "{}: {} bytes past the block's end", what, n - done);
}
}  // namespace

void copy_from_block(const Block& block, size_t at, size_t n, unsigned char* dst, CopyFn copy) {
  if (copy == nullptr) copy = [](void* d, const void* s, size_t c) { std::memcpy(d, s, c); };
  for_each_block_run(block, at, n, "copy_from_block",
                     [&](unsigned char* piece, size_t off, size_t c) { copy(dst + off, piece, c); });
}

void copy_to_block(const Block& block, size_t at, size_t n, const unsigned char* src, CopyFn copy) {
  if (copy == nullptr) copy = [](void* d, const void* s, size_t c) { std::memcpy(d, s, c); };
  for_each_block_run(block, at, n, "copy_to_block",
                     [&](unsigned char* piece, size_t off, size_t c) { copy(piece, src + off, c); });
}

void copy_block(const Block& from, const Block& to, size_t n, CopyFn copy) {
  for_each_block_run(from, 0, n, "copy_block",
                     [&](unsigned char* piece, size_t off, size_t c) { copy_to_block(to, off, c, piece, copy); });
}

// ---- the choice ----

namespace {

const char* mode_name(SharedMemory m) {
  switch (m) {
    case SharedMemory::kAuto: return "\"auto\"";
    case SharedMemory::kOn: return "true";
    case SharedMemory::kOff: return "false";
  }
  return "?";
}

}  // namespace

void check_shm_config_agrees(MPI_Comm comm, const CommConfig& config, const std::string& where) {
  const int mode = static_cast<int>(config.shared_memory), nr = config.shared_memory_node_ranks;
  int v[4] = {mode, -mode, nr, -nr};
  ZS_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v, 4, MPI_INT, MPI_MAX, comm), "comparing comm.shared_memory across {}", where);
  if (v[0] != -v[1]) {
    throw CommError(fmt::format("comm.shared_memory differs across the ranks of {} (this rank: {}; others pass {} or "
                                "{}); pass the same value on every rank",
                                where, mode_name(config.shared_memory), mode_name(static_cast<SharedMemory>(v[0])),
                                mode_name(static_cast<SharedMemory>(-v[1]))));
  }
  if (v[2] != -v[3]) {
    throw CommError(fmt::format("comm shared_memory_node_ranks differs across the ranks of {} ({} to {}); pass the same "
                                "value on every rank", where, -v[3], v[2]));
  }
}

std::unique_ptr<Transport> make_transport(GroupState& g) {
  if (g.simulated) return make_simulated_transport();
  if (g.local()) return make_local_transport();
  check_shm_config_agrees(g.comm, g.config, g.where());  // so every rank below decides alike
  auto mpi = make_mpi_transport(g.comm, g.rank, g.size);
  const SharedMemory mode = g.config.shared_memory;
  if (g.size < 2 || mode == SharedMemory::kOff) return mpi;
  const ShmGroup* s = g.shm.get();
  if (s == nullptr || !s->enabled) {
    // "true" promises shared memory: the shm transport's collectives say why there is none.
    return mode == SharedMemory::kOn ? make_shm_transport(g, std::move(mpi)) : std::move(mpi);
  }
  if (s->max_local < 2) return mpi;  // one member per node: nothing to share
  return s->nodes == 1 ? make_shm_transport(g, std::move(mpi)) : make_hierarchical_transport(g, std::move(mpi));
}

}  // namespace zs::comm::detail
