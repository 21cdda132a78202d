// SharedArena: registers this rank's shareable device memory with the other ranks of its node, so
// that collectives on tensors in it read the peers' tensors directly (Note [Direct collectives] in
// comm/detail/shm_direct.h): an allgather then costs one copy of the bytes received instead of two.
// The peers' regions are mapped read-write: an allreduce writes its sums into every rank's tensor
// (Note [Direct allreduce's writes]).
//
//   auto backend = memory::make_backend("cpu", bytes, /*shared_device=*/true);
//   memory::DeviceAllocator alloc(*backend, bytes);
//   comm::SharedArena arena(group, backend->shared_mapping(alloc.base()));   // collective over group
//   group.allgather(shard_in_alloc, full);   // direct when every rank's input lies in its arena
//
// Collective over `group` (two small collectives of its own: an allgather and an allreduce, timed
// like any). Active when the group has ranks sharing a node, the World has its shared-memory window
// (comm.shared_memory is not false) and every rank passed a mapping that every peer on its node could
// map; otherwise inactive on every rank alike (inactive_reason() says why), and collectives take the
// staged path as before. Across nodes only the ranks of one node map each other; reduce-scatter and
// allgather of a group spanning nodes stay MPI's, as before.
// The arena must outlive the collectives issued on its memory (flush async ones first). Destroying it
// is local (no collective): the peers' pages stay mapped by those still holding them.
// Thread-safety: construct and destroy on the thread that issues the group's collectives.
#pragma once

#include <cstdint>
#include <string>

#include "comm/group.h"
#include "memory/shared_mapping.h"

namespace zs::comm {

class SharedArena {
 public:
  SharedArena() = default;  // inactive
  // `mine` may be null (this rank's memory is private): the arena is then inactive on every rank.
  SharedArena(const Group& group, const memory::SharedMapping* mine);
  SharedArena(SharedArena&& other) noexcept;
  SharedArena& operator=(SharedArena&& other) noexcept;
  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;
  ~SharedArena();

  bool active() const { return id_ != 0; }
  const std::string& inactive_reason() const { return reason_; }

 private:
  void reset() noexcept;
  void* node_ = nullptr;  // the World's detail::ShmNode holding the registration
  int64_t id_ = 0;
  std::string reason_ = "not registered";
};

}  // namespace zs::comm
