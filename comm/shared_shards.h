// SharedShards: one-sided gathers of a sharded buffer whose shards lie in the node's shared arena
// (comm/shared_arena.h). Each rank copies the peers' blocks straight out of their shards when it needs
// them; no rank waits for another to arrive at the same call (Note [One-sided gathers]).
//
//   comm::SharedShards shards(group, shard.data(), shard_bytes);  // collective over group
//   if (shards.active()) shards.allgatherv(offsets, out, counts); // where group.allgatherv would run
//   ...
//   shards.begin_write();  // every rank, before it overwrites its shard
//   update(shard);
//   shards.end_write();    // every rank: its shard now holds the next version
//
// Note [One-sided gathers]
// ZeRO-3 gathers a module's parameters before its forward and its backward. As a collective (the
// direct allgatherv of Note [Direct collectives] in comm/detail/shm_direct.h) every gather is a
// meeting of the ranks: a handshake and two barriers, so each forward waits at each module for the
// slowest rank, while stage 0's forward waits for nobody. Gathers made free (a local copy in place of
// each, wrong data, timing only) put stage 3 at 0.756 of stage 0 (OpenMPI) where the real gathers
// measured 0.865-0.872 (docs/benchmarks.md, "ZeRO-3 below stage 0"). Yet between two optimizer steps
// a rank's parameter shard does not change: nothing about the peers needs to be waited for but that
// their shards hold this step's values. So:
//  - Versions. Each rank publishes, in a line of its column of the node window (ShmNode::word; a line
//    of its own, handed out as a group's flag line is, so it serves only this buffer), word 0: the
//    version of its shard (1 once made, +1 at each end_write), and word 1: the last version whose
//    peers' shards it has finished reading (begin_write). A reader at version v waits only until
//    each peer it reads from publishes written >= v: the first gather after a step meets the peers'
//    optimizer steps' ends, and every later gather of the step finds them there at once.
//  - The guard. begin_write publishes done = v and waits until every peer's done >= v before the
//    caller overwrites the shard: no peer still reads version v of it (its reads of version v came
//    before its begin_write in its program order, and it reads nothing between begin_write and
//    end_write: an assertion). So written never passes v while a peer reads version v. In a training
//    step the ranks' loss-and-norm allreduce comes just before, so this wait is over at once.
//  - The same bits as the collective: a byte copy of each block; the own block from the own shard.
//  - Counted as the collective it replaces (CommCounters, Group::op_stats, the comms logger): one
//    allgatherv, the same bytes_sent and bytes_received, a shared-memory and a direct collective
//    exactly when the collective would have run the direct path (a small one: the small path's
//    shared-memory count; a group on MPI's collectives is never active). So the summary's figures
//    and the per-collective tallies are those of the collective path.
//  - Failures: the waits poll like the handshake (Runtime::pause, Note [Polling]) against
//    comm.timeout_s; a peer that stalls or died leaves this rank with a CommError naming the buffer's
//    group, the peer and the version it waited for (the group is then unusable, as after any comm
//    timeout), never a spin forever. A peer's error ends the job through World::abort as before.
//  - Where: a group whose ranks all lie on this rank's node window (one host, or one block of
//    comm.shared_memory_node_ranks), with comm.shared_memory not false and every rank's shard inside
//    one shared arena registered over the group. Elsewhere (MPI's collectives, two hosts, a private
//    or host-memory shard) inactive on every rank alike, and the caller uses the collective.
// Nothing here calls MPI after the constructor, and no executor is involved: a gather runs on the
// caller's thread beside whatever collective the comm worker runs (it touches neither MPI nor the
// group's flag line nor the staging slots).
// Thread-safety: use one object from one thread at a time; the calls are not collectives (no order
// with the group's other collectives), but begin_write / end_write must be called by every rank
// between the same reads (they pair the versions).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/group.h"
#include "memory/tensor.h"

namespace zs::comm {

namespace detail {
struct ArenaView;
}

class SharedShards {
 public:
  SharedShards() = default;  // inactive
  // Collective over `group` (one small allgather) unless inactive for a reason every rank sees alike
  // (a group of one, simulated, or without the node window; comm.shared_memory false). `shard`:
  // this rank's `bytes` bytes, to be read by the peers; it must stay where it is while this object
  // lives. The group must outlive this object.
  SharedShards(const Group& group, const void* shard, size_t bytes);
  SharedShards(SharedShards&&) noexcept = default;
  SharedShards& operator=(SharedShards&&) noexcept = default;
  SharedShards(const SharedShards&) = delete;
  SharedShards& operator=(const SharedShards&) = delete;
  ~SharedShards();

  bool active() const { return view_ != nullptr; }
  const std::string& inactive_reason() const { return reason_; }
  uint64_t version() const { return version_; }

  // What group.allgatherv(own block, output, counts) gives, read one-sided: block p of `output`
  // (counts[p] elements, in rank order) is elements [offsets[p], offsets[p] + counts[p]) of rank p's
  // shard, elements of output's dtype. Waits only for the peers read from to publish this version;
  // CommError after comm.timeout_s (Note [One-sided gathers]). Not between begin_write and end_write.
  void allgatherv(std::span<const size_t> offsets, const memory::Tensor& output, std::span<const size_t> counts) const;
  // Every rank, before overwriting its shard: returns once every peer has finished reading this
  // version (CommError after comm.timeout_s).
  void begin_write();
  // Every rank, after its shard holds the new values: publishes the next version.
  void end_write();

 private:
  // Waits until word `w` of group rank p's line reaches `v`; `what` for the timeout's message.
  void wait_for(int p, int w, uint64_t v, const char* what) const;

  const Group* group_ = nullptr;
  std::shared_ptr<const detail::ArenaView> view_;  // keeps the peers' mappings alive
  std::vector<const unsigned char*> shard_;        // per group rank: its shard as mapped here
  std::vector<size_t> bytes_;                      // per group rank: its shard's size
  std::vector<int> node_rank_;                     // per group rank
  int line_ = -1;
  uint64_t version_ = 0;
  bool writing_ = false;
  std::string reason_ = "not made";
};

}  // namespace zs::comm
