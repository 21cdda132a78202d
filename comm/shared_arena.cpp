#include "comm/shared_arena.h"

#include <unistd.h>

#include <utility>
#include <vector>

#include "comm/detail/runtime.h"
#include "comm/detail/shm.h"
#include "comm/detail/shm_direct.h"
#include "core/errors.h"

namespace zs::comm {

SharedArena::SharedArena(const Group& group, const memory::SharedMapping* mine) {
  // What each rank tells the others, as int32 (one allgather).
  enum Field { kNodeId, kNodeRank, kPid, kFd, kBytesLo, kBytesHi, kSeqLo, kSeqHi, kFields };
  const detail::GroupState& g = detail::group_state(group);
  detail::ShmNode* node = g.runtime->shm_node();
  // Every condition here is the same on every rank of the group.
  if (g.local() || g.size < 2) {
    reason_ = "the group has one rank";
    return;
  }
  if (node == nullptr || g.shm == nullptr || !g.shm->enabled) {
    reason_ = "the World has no shared-memory window (comm.shared_memory is false, or the window could not be made)";
    return;
  }
  if (g.shm->max_local < 2) {
    reason_ = "no two ranks of the group share a node";
    return;
  }
  const bool have = mine != nullptr && mine->fd() >= 0;
  const int64_t seq = node->arenas().next_seq();
  std::vector<int32_t> out(kFields), all(static_cast<size_t>(g.size) * kFields);
  out[kNodeId] = node->node_id();
  out[kNodeRank] = node->node_rank();
  out[kPid] = static_cast<int32_t>(::getpid());
  out[kFd] = have ? mine->fd() : -1;
  const uint64_t bytes = have ? mine->size() : 0;
  out[kBytesLo] = static_cast<int32_t>(bytes & 0xffffffffu);
  out[kBytesHi] = static_cast<int32_t>(bytes >> 32);
  out[kSeqLo] = static_cast<int32_t>(seq & 0xffffffff);
  out[kSeqHi] = static_cast<int32_t>(seq >> 32);
  group.allgather(memory::Tensor(out.data(), memory::DType::kI32, {kFields}),
                  memory::Tensor(all.data(), memory::DType::kI32, {static_cast<int64_t>(all.size())}));
  auto at = [&](int rank, Field f) { return all[static_cast<size_t>(rank) * kFields + f]; };
  auto u32 = [](int32_t v) { return static_cast<uint64_t>(static_cast<uint32_t>(v)); };
  // The id: the group's most advanced sequence number and its first world rank, unique to this
  // registration (Note [Direct collectives]); every member moves past it.
  int64_t max_seq = 0;
  bool all_have = true;
  for (int p = 0; p < g.size; ++p) {
    max_seq = std::max(max_seq, static_cast<int64_t>(u32(at(p, kSeqLo)) | (u32(at(p, kSeqHi)) << 32)));
    all_have = all_have && at(p, kFd) >= 0;
  }
  node->arenas().next_after(max_seq);
  if (!all_have) {
    reason_ = "a rank's device memory is not shareable (comm.shared_arena is off there, or its backend is not \"cpu\")";
    return;
  }
  int first_world = 0;
  MPI_Group mpi_group = MPI_GROUP_NULL, world_group = MPI_GROUP_NULL;
  MPI_Comm_group(g.comm, &mpi_group);
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  const int zero = 0;
  MPI_Group_translate_ranks(mpi_group, 1, &zero, world_group, &first_world);
  MPI_Group_free(&mpi_group);
  MPI_Group_free(&world_group);

  auto view = std::make_shared<detail::ArenaView>();
  view->id = (static_cast<int64_t>(first_world) << 40) | max_seq;
  view->base.assign(static_cast<size_t>(node->node_size()), nullptr);
  view->bytes.assign(static_cast<size_t>(node->node_size()), 0);
  view->base[static_cast<size_t>(node->node_rank())] = static_cast<unsigned char*>(mine->data());
  view->bytes[static_cast<size_t>(node->node_rank())] = mine->size();
  std::string error;
  for (int p = 0; p < g.size && error.empty(); ++p) {
    if (p == g.rank || at(p, kNodeId) != node->node_id()) continue;
    const size_t peer_bytes = u32(at(p, kBytesLo)) | (u32(at(p, kBytesHi)) << 32);
    memory::SharedMapping m = memory::SharedMapping::open_peer(at(p, kPid), at(p, kFd), peer_bytes, error,
                                                                       memory::PeerAccess::kReadWrite);
    if (!m) break;
    const size_t r = static_cast<size_t>(at(p, kNodeRank));
    view->base[r] = static_cast<unsigned char*>(m.data());
    view->bytes[r] = peer_bytes;
    view->peers.push_back(std::move(m));
  }
  int32_t failed = error.empty() ? 0 : 1;
  group.allreduce(memory::Tensor(&failed, memory::DType::kI32, {1}));
  if (failed != 0) {
    reason_ = error.empty() ? fmt::format("{} rank(s) could not map their peers' arenas", failed)
                            : fmt::format("the peers' arenas could not be mapped ({})", error);
    return;
  }
  node->arenas().add(std::move(view));
  node_ = node;
  id_ = (static_cast<int64_t>(first_world) << 40) | max_seq;
  reason_.clear();
}

SharedArena::SharedArena(SharedArena&& other) noexcept { *this = std::move(other); }

SharedArena& SharedArena::operator=(SharedArena&& other) noexcept {
  if (this != &other) {
    reset();
    node_ = std::exchange(other.node_, nullptr);
    id_ = std::exchange(other.id_, 0);
    reason_ = std::exchange(other.reason_, "not registered");
  }
  return *this;
}

SharedArena::~SharedArena() { reset(); }

void SharedArena::reset() noexcept {
  if (id_ != 0) static_cast<detail::ShmNode*>(node_)->arenas().remove(id_);
  node_ = nullptr;
  id_ = 0;
}

}  // namespace zs::comm
