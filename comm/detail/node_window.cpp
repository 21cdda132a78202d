// The node's shared-memory window and a group's view of it (comm/detail/shm.h): the one place the
// shared-memory side of comm calls MPI, since the window is an MPI-3 one (MPI_Win_allocate_shared over
// the node's ranks). Made once per World and once per group, never inside a collective.
#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/detail/runtime.h"
#include "comm/detail/shm.h"
#include "comm/detail/shm_direct.h"
#include "comm/mpi_check.h"
#include "core/errors.h"

namespace zs::comm::detail {

namespace {
constexpr size_t kLine = 64;  // one barrier flag per cache line
constexpr size_t kFlagBytes = ShmNode::kMaxGroups * kLine;
}  // namespace

// ---- the node window ----

std::unique_ptr<ShmNode> ShmNode::create(int ranks_per_node, bool required) {
  std::unique_ptr<ShmNode> node(new ShmNode());
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  ZS_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node->comm_),
               "finding the ranks on this node for the shared-memory collectives");
  if (ranks_per_node > 0) {
    int r = 0;
    MPI_Comm_rank(node->comm_, &r);
    MPI_Comm block = MPI_COMM_NULL;
    ZS_MPI_CHECK(MPI_Comm_split(node->comm_, r / ranks_per_node, r, &block),
                 "splitting the node into blocks of comm.shared_memory_node_ranks = {} ranks", ranks_per_node);
    MPI_Comm_free(&node->comm_);
    node->comm_ = block;
  }
  MPI_Comm_rank(node->comm_, &node->node_rank_);
  MPI_Comm_size(node->comm_, &node->node_size_);
  ZS_MPI_CHECK(MPI_Allreduce(&world_rank, &node->node_id_, 1, MPI_INT, MPI_MIN, node->comm_), "naming this node");

  MPI_Info info = MPI_INFO_NULL;
  MPI_Info_create(&info);
  MPI_Info_set(info, "alloc_shared_noncontig", "true");  // each rank's part on its own pages (first touch)
  const size_t bytes = kFlagBytes + 2 * kSlotBytes + 2 * kSmallSlotBytes;  // small_slot() after the slots
  void* base = nullptr;
  int rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(bytes), 1, info, node->comm_, &base, &node->win_);
  MPI_Info_free(&info);
  int ok = rc == MPI_SUCCESS ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, node->comm_);
  if (!all_ok) {
    const std::string why = rc == MPI_SUCCESS ? std::string("another rank of this node failed to allocate it") : mpi_error_text(rc);
    if (node->win_ != MPI_WIN_NULL) MPI_Win_free(&node->win_);
    if (required) {
      throw CommError(fmt::format("comm.shared_memory is true but the {} MiB shared-memory window of each rank could "
                                  "not be made ({}); free space in /dev/shm, or set comm.shared_memory to \"auto\" "
                                  "(falls back to MPI's collectives) or false", bytes >> 20, why));
    }
    return nullptr;
  }
  // Zero this rank's flags and touch its slots (so the pages live near it), then let every rank see it.
  std::memset(base, 0, bytes);
  node->flags_.resize(static_cast<size_t>(node->node_size_));
  node->slots_.resize(static_cast<size_t>(node->node_size_));
  for (int r = 0; r < node->node_size_; ++r) {
    MPI_Aint size = 0;
    int disp = 0;
    void* p = nullptr;
    ZS_MPI_CHECK(MPI_Win_shared_query(node->win_, r, &size, &disp, &p), "locating rank {}'s shared-memory slots", r);
    auto* c = static_cast<unsigned char*>(p);
    node->flags_[static_cast<size_t>(r)] = c;
    node->slots_[static_cast<size_t>(r)] = {c + kFlagBytes, c + kFlagBytes + kSlotBytes};
  }
  ZS_MPI_CHECK(MPI_Barrier(node->comm_), "publishing the shared-memory window");
  return node;
}

ShmNode::ShmNode() : arenas_(std::make_unique<ArenaTable>()) {}

ShmNode::~ShmNode() {
  if (win_ != MPI_WIN_NULL) MPI_Win_free(&win_);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::atomic<uint64_t>& ShmNode::word(int node_rank, int group_index, int w) const {
  static_assert(std::atomic<uint64_t>::is_always_lock_free, "flags are shared between processes");
  static_assert(kLine / sizeof(uint64_t) == 8, "eight words per flag line");
  return *reinterpret_cast<std::atomic<uint64_t>*>(flags_[static_cast<size_t>(node_rank)] +
                                                   static_cast<size_t>(group_index) * kLine +
                                                   static_cast<size_t>(w) * sizeof(uint64_t));
}

// ---- a group's view ----

void init_shm_group(GroupState& g) {
  ShmNode* node = g.runtime->shm_node();
  if (g.local() || node == nullptr) return;
  auto s = std::make_shared<ShmGroup>();
  const int mine[3] = {node->node_id(), node->node_rank(), node->next_group_index};
  std::vector<int> all(static_cast<size_t>(g.size) * 3);
  ZS_MPI_CHECK(MPI_Allgather(mine, 3, MPI_INT, all.data(), 3, MPI_INT, g.comm), "setting up shared memory for {}", g.where());
  auto at = [&](int rank, int field) { return all[static_cast<size_t>(rank) * 3 + static_cast<size_t>(field)]; };
  std::vector<int> ids;
  for (int p = 0; p < g.size; ++p) {
    s->flag_index = std::max(s->flag_index, at(p, 2));
    if (at(p, 0) == node->node_id()) {
      if (p == g.rank) s->me = static_cast<int>(s->local.size());
      s->local.push_back(at(p, 1));
    }
    ids.push_back(at(p, 0));
  }
  node->next_group_index = s->flag_index + 1;
  std::sort(ids.begin(), ids.end());
  s->nodes = 0;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j < ids.size() && ids[j] == ids[i]) ++j;
    ++s->nodes;
    s->max_local = std::max(s->max_local, static_cast<int>(j - i));
    i = j;
  }
  s->enabled = s->flag_index < ShmNode::kMaxGroups;
  if (!s->enabled) {
    s->disabled_reason = fmt::format("more than {} groups were made in this World", ShmNode::kMaxGroups);
  }
  g.shm = std::move(s);
}

}  // namespace zs::comm::detail
