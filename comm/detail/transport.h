// Transport: how a group's collectives move their data. Internal to comm.
//
// Group's collectives (comm/group.cpp) validate their arguments, build an Op (signature, byte counts,
// handshake) and hand its body to the group's transport, chosen once when the group is made:
//
//   comm/detail/transport_local.cpp         a local group of one (a world started without mpirun)
//   comm/detail/transport_simulated.cpp     Group::simulated (the memory estimator): moves nothing
//   comm/detail/transport_mpi.cpp           MPI's collectives on the group's communicator
//   comm/detail/transport_shm.cpp           every rank on one node: the node's shared-memory window
//   comm/detail/transport_hierarchical.cpp  ranks on several nodes: the window inside each node, MPI
//                                           between the node leaders
//
// Note [Transports]
// Which transport a group uses depends only on facts fixed when the group is made: whether it has an
// MPI communicator, whether it is simulated, its comm.shared_memory mode, and (from the node window,
// comm/detail/shm.h) how its members lie on nodes. So make_transport decides once, right after the
// group's communicator and its view of the window exist (World's group, Group::split and dup), and
// stores the result in GroupState::transport; a collective never re-tests it. Why once: tested per
// call, the same local/shm/MPI branches stood in every collective and the shared-memory code made the
// inter-node MPI calls itself; decided once, group.cpp holds no transport code, each transport is one
// file that can be tested alone (tests/comm/transport_test.cpp), and another one (a device backend's)
// is a new file, not new branches in every collective. Every rank of a group decides alike:
// make_transport first checks that the ranks passed the same comm.shared_memory and
// shared_memory_node_ranks (CommError naming the group otherwise), and the node layout it reads is
// the same on every member (init_shm_group gathers it).
//  - No communicator: local, or simulated for Group::simulated (whose ops the Runtime only counts).
//  - comm.shared_memory false, a group of one rank, no usable window, or one member per node: MPI.
//  - Otherwise shm on one node, hierarchical across nodes. Both keep an MPI transport on the group's
//    communicator and hand it what they do not do themselves, decided per call by rules that are the
//    same on every rank (so no rank ever waits in a shared-memory barrier for a peer gone to MPI):
//    comm.shared_memory "auto" leaves tensors under kShmAutoMinBytes to MPI, the count exchanges
//    always go to MPI (broadcast too, unless in place in a shared arena), and the hierarchical transport moves only allreduce itself (the
//    others span nodes through MPI's collective, as before transports existed). Within shm, the
//    direct path runs where the handshake agreed on a shared arena (Note [Direct collectives]).
//  - comm.shared_memory true with no window for the group (none was made, or too many groups) picks
//    shm anyway, whose collectives then throw CommError saying why, as "true" promises.
// Whatever the transport, the bits are the same (Note [16-bit reductions] in transport_mpi.cpp; Note
// [Shared-memory collectives] in comm/detail/shm.h) and so are the byte counters, which the Op carries.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/config.h"
#include "memory/tensor.h"

namespace zs::comm::detail {

struct GroupState;
struct Op;

// Per-rank element counts as MPI takes them (int), with their displacements; `total` their sum.
struct Counts {
  std::vector<int> counts, displs;
  size_t total = 0;
  bool equal() const;  // every count the same (MPI's *_block / allgather forms apply)
};

// One rank's block of an all-to-all(v) as the caller holds it: one piece in the contiguous form, or
// several (Group::alltoallv with pieces: rows of different experts, moe/dispatch.h), in order.
struct BlockPiece {
  unsigned char* data = nullptr;
  size_t bytes = 0;
};
using Block = std::vector<BlockPiece>;
// Bytes [at, at + n) of `block` to `dst` / from `src` (memcpy, or `copy` when given).
using CopyFn = void (*)(void* dst, const void* src, size_t bytes);
void copy_from_block(const Block& block, size_t at, size_t n, unsigned char* dst, CopyFn copy = nullptr);
void copy_to_block(const Block& block, size_t at, size_t n, const unsigned char* src, CopyFn copy = nullptr);
// The first n bytes of `from` into `to`, piece to piece, with no staging buffer.
void copy_block(const Block& from, const Block& to, size_t n, CopyFn copy = nullptr);

// One side of an all-to-all(v): the contiguous tensor (`whole` defined) or the piece lists, cut into
// one Block per rank; `keep` holds the pieces' tensors alive until the op has run.
struct ExchangeSide {
  memory::Tensor whole;
  std::vector<Block> blocks;
  std::vector<memory::Tensor> keep;
};

// The data-moving half of every collective. Each call is the body of an Op on the transport's group
// (after its handshake, Note [Handshake] in comm/detail/runtime.h), runs on the executing thread, and
// throws CommError (naming `op`) on failure. Arguments are validated by Group; counts are in elements
// of the tensors' dtype, one per rank in rank order. Tensors may alias exactly as comm/group.h allows.
// Not thread-safe: a World runs one Op at a time (Note [Execution model] in comm/detail/runtime.h).
// A transport moves data only; the Op carries the byte counts, and the shared-memory transports bump
// CommCounters::shared_memory_collectives / direct_collectives for the calls they run themselves.
class Transport {
 public:
  virtual ~Transport() = default;
  // "local", "simulated", "mpi", "shm" or "hierarchical": for tests and messages.
  virtual const char* name() const = 0;

  // In place; data.numel() > 0.
  virtual void allreduce(const Op& op, const memory::Tensor& data, ReduceOp r) = 0;
  // `input` has c.total elements; `output` this rank's c.counts[rank] (may be input's own block).
  virtual void reduce_scatter(const Op& op, const memory::Tensor& input, const memory::Tensor& output,
                              const Counts& c, ReduceOp r) = 0;
  // `input` has this rank's count; `output` c.total elements (input may be output's own block).
  virtual void allgatherv(const Op& op, const memory::Tensor& input, const memory::Tensor& output,
                          const Counts& c) = 0;
  // data.numel() > 0.
  virtual void broadcast(const Op& op, const memory::Tensor& data, int root) = 0;
  // send.blocks[j] goes to rank j as its recv.blocks[rank] (s and r: the elements of each). `uneven`:
  // alltoallv (else alltoall: equal blocks, as MPI_Alltoall takes them).
  virtual void alltoallv(const Op& op, memory::DType t, const ExchangeSide& send, const Counts& s,
                         const ExchangeSide& recv, const Counts& r, bool uneven) = 0;
  // Control data, never counted as a collective's data path: every rank's `mine` (k values) into
  // `all` (k per rank, in rank order); an all-to-all of w int64 per rank (send and recv: size() * w).
  virtual void allgather_counts(const Op& op, std::span<const int32_t> mine, std::span<int32_t> all) = 0;
  virtual void alltoall_counts(const Op& op, std::span<const int64_t> send, std::span<int64_t> recv) = 0;
  // Collective: gives `child` its communicator, rank and size (MPI_Comm_split) and its handshake
  // communicator; a local group's child stays a local group of one.
  virtual void split(const Op& op, int color, int key, GroupState& child) = 0;
};

// Note [Transports]: collective over g's communicator (blocking, untimed, like the split that made
// it); g's communicator, rank, size, config and shared-memory view are final. CommError when the
// ranks' comm.shared_memory settings differ.
std::unique_ptr<Transport> make_transport(GroupState& g);

// Each transport alone (make_transport picks among them; tests build them directly).
std::unique_ptr<Transport> make_local_transport();
std::unique_ptr<Transport> make_simulated_transport();
// MPI on `comm` (not owned), where this process is rank `rank` of `size`. `context` follows the op's
// description in its errors (the hierarchical transport's ": allreduce between the node leaders").
// `ordered`: fp32 sums in rank order too (an all-to-all, then the sums here), as 16-bit ones always
// are (Note [16-bit reductions] in transport_mpi.cpp); else fp32 sums are MPI's, in its order.
std::unique_ptr<Transport> make_mpi_transport(MPI_Comm comm, int rank, int size, std::string context = {},
                                              bool ordered = false);
// `g` owns the transport and outlives it; `mpi`: the MPI transport on g's communicator.
std::unique_ptr<Transport> make_shm_transport(GroupState& g, std::unique_ptr<Transport> mpi);
std::unique_ptr<Transport> make_hierarchical_transport(GroupState& g, std::unique_ptr<Transport> mpi);

// Collective over `comm`: CommError on every rank when the ranks passed different comm.shared_memory
// or shared_memory_node_ranks values (World's constructor checks the world; make_transport each group).
void check_shm_config_agrees(MPI_Comm comm, const CommConfig& config, const std::string& where);

}  // namespace zs::comm::detail
