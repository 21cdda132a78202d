#include "comm/detail/wait_notices.h"

#include <algorithm>
#include <cstring>

#include "comm/detail/runtime.h"
#include "comm/mpi_check.h"

namespace zs::comm::detail {

namespace {
constexpr int kTag = 1;
}

WaitNotices::WaitNotices(int world_rank) : world_rank_(world_rank) {
  ZS_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "duplicating the world communicator for wait notices");
}

WaitNotices::~WaitNotices() {
  for (Outgoing& o : outgoing_) {
    int done = 0;
    MPI_Test(&o.request, &done, MPI_STATUS_IGNORE);
    if (!done) (void)o.notice.release();  // MPI may still read it: never free
  }
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void WaitNotices::add(GroupState& g) {
  // Rank 0 of the group names it: unique, since that rank creates each of its groups once.
  int64_t id = g.rank == 0 ? (static_cast<int64_t>(world_rank_) << 32) | ++created_ : 0;
  ZS_MPI_CHECK(MPI_Bcast(&id, 1, MPI_INT64_T, 0, g.comm), "agreeing on an id for {}", g.where());
  g.id = id;
  MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MPI_Comm_group(g.comm, &mine);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> ranks(static_cast<size_t>(g.size));
  for (int r = 0; r < g.size; ++r) ranks[static_cast<size_t>(r)] = r;
  g.world_ranks.resize(ranks.size());
  MPI_Group_translate_ranks(mine, g.size, ranks.data(), world, g.world_ranks.data());
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
  std::lock_guard lock(mu_);
  groups_.push_back(&g);
}

void WaitNotices::remove(const GroupState& g) {
  std::lock_guard lock(mu_);
  std::erase(groups_, &g);
}

GroupState* WaitNotices::find(int64_t id) const {
  for (GroupState* g : groups_) {
    if (g->id == id) return g;
  }
  return nullptr;
}

void WaitNotices::announce(const Op& op) {
  const GroupState& g = *op.group;
  const int64_t seq = g.entered - 1;
  if (announced_group_ == g.id && announced_seq_ == seq) return;
  announced_group_ = g.id;
  announced_seq_ = seq;
  std::erase_if(outgoing_, [](Outgoing& o) {
    int done = 0;
    MPI_Test(&o.request, &done, MPI_STATUS_IGNORE);
    return done != 0;
  });
  const std::string what = op.describe();
  std::lock_guard lock(mu_);
  for (const int peer : g.world_ranks) {
    if (peer == world_rank_) continue;
    auto n = std::make_unique<Notice>();
    n->group = g.id;
    n->seq = seq;
    std::copy(op.signature.begin(), op.signature.end(), n->signature);
    n->signature[4] = static_cast<int64_t>(op.gather.size());
    for (const GroupState* k : groups_) {
      if (n->shared == kMaxShared) break;
      if (std::find(k->world_ranks.begin(), k->world_ranks.end(), peer) == k->world_ranks.end()) continue;
      n->ids[n->shared] = k->id;
      n->entered[n->shared] = k->entered;
      ++n->shared;
    }
    std::memcpy(n->what, what.data(), std::min(what.size(), sizeof(n->what) - 1));
    Outgoing o{MPI_REQUEST_NULL, std::move(n)};
    ZS_MPI_CHECK(MPI_Isend(o.notice.get(), sizeof(Notice), MPI_BYTE, peer, kTag, comm_, &o.request),
                 "{}: sending a wait notice to world rank {}", what, peer);
    outgoing_.push_back(std::move(o));
  }
}

void WaitNotices::drain() {
  while (true) {
    int flag = 0;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    ZS_MPI_CHECK(MPI_Improbe(MPI_ANY_SOURCE, kTag, comm_, &flag, &message, &status), "probing for wait notices");
    if (!flag) return;
    Notice n;
    ZS_MPI_CHECK(MPI_Mrecv(&n, sizeof(Notice), MPI_BYTE, &message, MPI_STATUS_IGNORE), "receiving a wait notice");
    latest_[status.MPI_SOURCE] = n;
  }
}

std::string WaitNotices::find_deadlock(const Op& op) {
  announce(op);
  drain();
  const GroupState& g = *op.group;
  const int64_t seq = g.entered - 1;  // this op's index on g
  std::lock_guard lock(mu_);
  for (const auto& [sender, n] : latest_) {
    const std::string theirs(n.what, strnlen(n.what, sizeof(n.what)));
    if (n.group == g.id && n.seq == seq) {  // the same op of our group: do our handshakes differ?
      const bool same = std::equal(op.signature.begin(), op.signature.end(), n.signature) &&
                        n.signature[4] == static_cast<int64_t>(op.gather.size());
      if (same) continue;  // both wait for a third rank
      return fmt::format("mismatched collectives: {} was called here while world rank {} called {}; every rank of a "
                         "group must call the same collectives in the same order",
                         op.describe(), sender, theirs);
    }
    const GroupState* h = find(n.group);
    // (1) The sender waits in op #n.seq of a group of ours that we have not entered yet.
    if (h == nullptr || h == &g || h->entered > n.seq) continue;
    // (2) The sender, a member of g, has not entered our op #seq of g.
    bool behind = false;
    for (int i = 0; i < n.shared; ++i) behind = behind || (n.ids[i] == g.id && n.entered[i] <= seq);
    if (!behind) continue;
    return fmt::format(
        "mismatched collectives across groups: {} was called here while world rank {} is in {}, a collective of "
        "another group that this rank has not reached; each waits for the other (Note [Waits across groups] in "
        "comm/detail/wait_notices.h). Every rank must call the collectives of all its groups in the same order",
        op.describe(), sender, theirs);
  }
  return {};
}

}  // namespace zs::comm::detail
