// Wait notices: how a handshake tells a slow peer from a rank stuck in another group's collective
// (Note [Waits across groups]). Internal to comm/detail/runtime.cpp.
//
// Note [Waits across groups]
// The handshake (Note [Handshake] in comm/detail/runtime.h) finds two ranks that call different
// collectives on one group, but not two ranks that call collectives on different groups of the same
// ranks: rank 0 in an allgather on the world (zeroshard train's error agreement) while rank 1 is in an
// allgather on 'dp' (the engine's set-up) never exchange a handshake message, so both waited for
// comm.timeout_s (300 s) before this. It is a certain deadlock, not a slow peer: a World runs one
// collective at a time (Note [Execution model]), so neither rank can reach the other's collective
// before its own ends, and neither ends without the other.
// So a handshake that has waited kAnnounceAfter tells the other ranks of its group where it waits, on
// a private duplicate of the world communicator: "I am in op #seq of group G (a group id agreed at
// creation), described as ..., and of the groups I share with you I have entered this many ops".
// A waiting rank Y that reads such a notice from X, stuck in op #t of a group H, concludes a deadlock
// when (1) Y has not entered op #t of H (Y is a member of H: X waits for Y) and (2) X has not entered
// the op #s of Y's group G that Y waits in (X is a member of G: Y waits for X). Both are exact, not
// timing guesses: X cannot have left op #t of H while Y has not entered it, and X's count for G
// cannot grow before that. Both ranks read each other's notice, so both throw a CommError naming both
// collectives, groups and ranks within kAnnounceAfter plus a few polls, and leave their group unusable
// as a timeout does. The same notices find two ranks in the same op of one group whose handshakes use
// different tags and so cannot meet (Note [Handshake lengths] in comm/detail/runtime.h): equal index,
// different signature or gather width. Only two-rank cycles across groups are found; a longer cycle (A waits for B in one group,
// B for C in another, C for A in a third) still ends with the timeout.
// A point-to-point op (comm/p2p.cpp) waits for one peer, not for the group, and has no op index. After
// waiting kAnnounceAfter it tells only its peers that it waits for them (seq = -1), with the index of
// each of its pending transfers with that peer (its k-th send to it, its k-th receive from it). A
// rank in a collective that reads such a notice concludes a deadlock when (1) it has not completed
// the matching transfer (fewer receives from the sender than the send's index, or fewer sends to it
// than the receive's index: else the notice is stale, the sender has moved on) and (2) the sender has
// not entered this rank's collective op. The point-to-point side concludes one when its peer's notice
// shows it in a collective op that this rank has not entered. Both are exact for the same reason.
// Cost: nothing on a handshake that finishes within kAnnounceAfter (one time comparison per poll); a
// handshake that waits longer sends one small message per other rank of its group, once, and probes
// for notices every kCheckEvery. The latest notice of each rank is kept (a rank waits in one place at
// a time), read in again every kDrainEvery handshakes, so notices to a rank that never waits do not
// pile up in MPI's queue.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace zs::comm::detail {

struct GroupState;
struct Op;

class WaitNotices {
 public:
  static constexpr auto kAnnounceAfter = std::chrono::milliseconds(100);
  static constexpr auto kCheckEvery = std::chrono::milliseconds(1);
  static constexpr uint64_t kDrainEvery = 256;

  // Collective over MPI_COMM_WORLD (the Runtime's constructor): duplicates it for the notices.
  explicit WaitNotices(int world_rank);
  ~WaitNotices();  // frees the communicator; sends MPI has not completed keep their buffers (leaked)
  WaitNotices(const WaitNotices&) = delete;
  WaitNotices& operator=(const WaitNotices&) = delete;

  // Collective over g.comm (init_handshake_comm): agrees on g.id, records g.world_ranks, registers g.
  void add(GroupState& g);
  void remove(const GroupState& g);  // from ~GroupState, on any thread

  // For a handshake of `op` that has waited kAnnounceAfter: announces it once, reads the notices that
  // arrived, and returns the CommError text of a deadlock with another group's collective, or "".
  // Called by the executing thread only (one op at a time), like drain().
  std::string find_deadlock(const Op& op);
  void drain();

  // A point-to-point op's transfers still waiting for their peers: peer's group rank, direction, and
  // the transfer's index among this rank's sends to (receives from) that peer on the group.
  struct PendingTransfer {
    int peer = 0;
    bool send = false;
    int64_t index = 0;
  };
  // For a point-to-point op that has waited kAnnounceAfter: announce_pairwise once, then
  // find_pairwise_deadlock as often as wanted: "" or the CommError text of a deadlock with a peer's
  // collective. Executing thread only.
  void announce_pairwise(const Op& op, const std::vector<PendingTransfer>& pending);
  std::string find_pairwise_deadlock(const Op& op, const std::vector<PendingTransfer>& pending);

 private:
  static constexpr int kMaxShared = 16;  // groups shared with the recipient that a notice lists
  struct Notice {
    int64_t group = 0;  // id of the group the sender waits in
    int64_t seq = 0;    // index of its op there (ops the sender entered before it); -1: point-to-point
    int64_t p2p_send = -1, p2p_recv = -1;  // point-to-point: indices of its pending transfers with the recipient
    int64_t signature[5] = {};  // the op's signature, then its gather width (Note [Handshake lengths])
    int32_t shared = 0;
    int64_t ids[kMaxShared] = {};      // groups the sender shares with the recipient,
    int64_t entered[kMaxShared] = {};  // and the ops the sender has entered on each
    char what[224] = {};               // Op::describe() of the sender's op
  };
  struct Outgoing {
    MPI_Request request = MPI_REQUEST_NULL;
    std::unique_ptr<Notice> notice;
  };
  void announce(const Op& op);
  void reap_sent();
  void send(std::unique_ptr<Notice> n, int peer, const std::string& what);  // with mu_ held
  GroupState* find(int64_t id) const;  // with mu_ held

  MPI_Comm comm_ = MPI_COMM_NULL;
  int world_rank_ = 0;
  int64_t created_ = 0;  // groups this rank created as a group's rank 0 (the id's low bits)
  mutable std::mutex mu_;  // guards groups_ against add/remove on other threads
  std::vector<GroupState*> groups_;
  std::vector<Outgoing> outgoing_;
  std::unordered_map<int, Notice> latest_;  // by sender's world rank
  int64_t announced_group_ = 0;             // the op announced last: its group's id and index
  int64_t announced_seq_ = -1;
};

}  // namespace zs::comm::detail
