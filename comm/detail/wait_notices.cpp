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

// Frees the notices whose sends have completed.
void WaitNotices::reap_sent() {
  std::erase_if(outgoing_, [](Outgoing& o) {
    int done = 0;
    MPI_Test(&o.request, &done, MPI_STATUS_IGNORE);
    return done != 0;
  });
}

// Completes notice `n` with the groups this rank shares with `peer` (their ids and ops entered) and the
// sender's op, and sends it; with mu_ held.
void WaitNotices::send(std::unique_ptr<Notice> n, int peer, const std::string& what) {
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

void WaitNotices::announce(const Op& op) {
  const GroupState& g = *op.group;
  const int64_t seq = g.entered - 1;
  if (announced_group_ == g.id && announced_seq_ == seq) return;
  announced_group_ = g.id;
  announced_seq_ = seq;
  reap_sent();
  const std::string what = op.describe();
  std::lock_guard lock(mu_);
  for (const int peer : g.world_ranks) {
    if (peer == world_rank_) continue;
    auto n = std::make_unique<Notice>();
    n->group = g.id;
    n->seq = seq;
    std::copy(op.signature.begin(), op.signature.end(), n->signature);
    n->signature[4] = static_cast<int64_t>(op.gather.size());
    send(std::move(n), peer, what);
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
    if (n.seq < 0) {  // the sender waits in a point-to-point op with this rank
      GroupState* p = find(n.group);
      if (p == nullptr) continue;
      {
        std::lock_guard broken_lock(p->mu);
        if (p->is_broken.load(std::memory_order_acquire)) continue;  // this rank gave up its transfers there: the sender's will time out
      }
      const auto at = std::find(p->world_ranks.begin(), p->world_ranks.end(), sender);
      if (at == p->world_ranks.end()) continue;
      const size_t q = static_cast<size_t>(at - p->world_ranks.begin());
      const std::array<int64_t, 2> done = q < p->p2p_done.size() ? p->p2p_done[q] : std::array<int64_t, 2>{0, 0};
      // (1) not stale: a transfer of the sender's with this rank that this rank has not matched yet.
      const bool live = (n.p2p_send >= 0 && done[1] <= n.p2p_send) || (n.p2p_recv >= 0 && done[0] <= n.p2p_recv);
      bool behind = false;  // (2) the sender has not entered this op of g
      for (int i = 0; i < n.shared; ++i) behind = behind || (n.ids[i] == g.id && n.entered[i] <= seq);
      if (!live || !behind) continue;
      return fmt::format("mismatched calls: {} was called here while world rank {} is in {}, a point-to-point "
                         "transfer with this rank; each waits for the other. Every pair of ranks must reach its "
                         "collectives and its sends and receives in the same order",
                         op.describe(), sender, theirs);
    }
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

void WaitNotices::announce_pairwise(const Op& op, const std::vector<PendingTransfer>& pending) {
  const GroupState& g = *op.group;
  reap_sent();
  const std::string what = op.describe();
  std::lock_guard lock(mu_);
  std::vector<int> told;
  for (const PendingTransfer& t : pending) {
    if (std::find(told.begin(), told.end(), t.peer) != told.end()) continue;
    told.push_back(t.peer);
    const int peer = g.world_ranks[static_cast<size_t>(t.peer)];
    auto n = std::make_unique<Notice>();
    n->group = g.id;
    n->seq = -1;
    for (const PendingTransfer& u : pending) {
      if (u.peer == t.peer) (u.send ? n->p2p_send : n->p2p_recv) = u.index;
    }
    send(std::move(n), peer, what);
  }
}

std::string WaitNotices::find_pairwise_deadlock(const Op& op, const std::vector<PendingTransfer>& pending) {
  drain();
  const GroupState& g = *op.group;
  std::lock_guard lock(mu_);
  for (const PendingTransfer& t : pending) {
    const int peer = g.world_ranks[static_cast<size_t>(t.peer)];
    const auto it = latest_.find(peer);
    if (it == latest_.end() || it->second.seq < 0) continue;  // crossed transfers: comm/p2p.cpp
    const Notice& n = it->second;
    const GroupState* h = find(n.group);
    if (h == nullptr || h->entered > n.seq) continue;  // the peer waits in a collective this rank entered
    return fmt::format("mismatched calls: {} waits for world rank {}, which is in {}, a collective that this rank "
                       "has not reached; each waits for the other. Every pair of ranks must reach its collectives "
                       "and its sends and receives in the same order",
                       op.describe(), peer, std::string(n.what, strnlen(n.what, sizeof(n.what))));
  }
  return {};
}

}  // namespace zs::comm::detail
