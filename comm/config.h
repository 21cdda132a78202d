// Plain settings and result structs of the comm module (the `comm` config section).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zs::comm {

// Whether reduce-scatter, allgather(v), allreduce and all-to-all(v) between ranks of one node go
// through a shared-memory window (Note [Shared-memory collectives] in comm/detail/shm.h) instead of
// MPI's collective.
//   kAuto: when the group has ranks sharing a node, the window could be made (else MPI's) and the
//          tensor has at least 8 KiB (kShmAutoMinBytes: smaller ones are faster through MPI); an
//          all-to-all(v) of a group on one node at every size (its ranks' sizes differ, and the
//          choice must be the same on all of them).
//   kOn:   at every size; a window that cannot be made is an error instead of a fallback.
//   kOff:  always MPI's collectives (no window is made).
enum class SharedMemory { kAuto, kOn, kOff };

struct CommConfig {
  // Seconds a collective may wait for the other ranks of its group before it throws CommError
  // naming the collective, the group, the sizes and the rank. Must be > 0.
  double timeout_s = 300.0;
  // Intra-node shared-memory collectives (comm.shared_memory: "auto", true, false). Read from the
  // World's config when it starts (kOff there makes no window, so no group can use one); a group made
  // by dup() with kOff uses MPI's collectives. Every rank of a group must pass the same value.
  SharedMemory shared_memory = SharedMemory::kAuto;
  // Ranks per "node" for the shared-memory path: 0 = the ranks MPI finds on one node; k > 0 splits
  // them into blocks of k consecutive ranks treated as separate nodes joined by MPI (e.g. one block per
  // socket; also how the tests exercise the multi-node path on one machine). World config only.
  int shared_memory_node_ranks = 0;
};

// How a reduction combines the ranks' values. kAverage is the sum divided by the group size, done in
// fp32 (integers support kSum only).
enum class ReduceOp { kSum, kAverage };

// Per-rank byte sums since the World started (or reset_counters). Counting rule, chosen to match the
// NCCL-tests bus-bandwidth definitions: the bytes a ring (or pipeline) algorithm moves, in the element
// type put on the wire (the tensor's: bf16/fp16 reductions send 16-bit values and accumulate in fp32 on
// the receiving rank), per collective:
//   allreduce of n elements on N ranks       sent = received = 2 (N-1)/N * n elements (rounded down) * size
//   reduce-scatter, allgather(v)             sent = received = total bytes - this rank's own part
//   broadcast of B bytes (a chain from root) sent = B except the last rank of the chain, received = B
//                                            except the root
//   all-to-all(v)                            sent = bytes to other ranks, received = bytes from others
//   barrier, and the 80-byte handshake every collective starts with (Note [Handshake]): not counted.
//   OneBitAllreduce (comm/compressed_allreduce.h) counts as the all-to-all and the allgather it is
//   made of: sent = received = 2 (N-1) (chunk/8 + 4) for chunks of `chunk` elements (~1/32 of fp32).
// A world or group of one moves nothing and counts nothing.
struct CommCounters {
  uint64_t bytes_sent = 0;      // bytes
  uint64_t bytes_received = 0;  // bytes
  uint64_t collectives = 0;     // count of completed collectives (all groups)
  uint64_t shared_memory_collectives = 0;  // count of those that ran through the node's shared memory
  // Of those, the count that read the peers' tensors in place (comm/shared_arena.h).
  uint64_t direct_collectives = 0;
  // Of bytes_sent, those that crossed between hosts (Note [Bytes across hosts]); the rest stayed inside
  // this rank's host.
  uint64_t bytes_sent_inter_host = 0;
  uint64_t bytes_sent_intra_host() const { return bytes_sent - bytes_sent_inter_host; }
};

// Note [Bytes across hosts]
// A host is the set of ranks MPI finds on one node (MPI_COMM_TYPE_SHARED: OpenMPI tells hosts apart by
// hostname), or a block of comm.shared_memory_node_ranks consecutive ranks of it when that is set (the
// layout the node-aware transports use, comm/detail/transport.h). Of each collective's bytes (the
// rule above), those of the blocks that belong to ranks on other hosts cross between hosts; the others
// stay inside this rank's host. Per collective, on a group of N ranks of which R (this rank included)
// are on this rank's host, with counts c_j per rank j:
//   reduce-scatter, allgather(v)   inter-host = sum of c_j over the ranks j on other hosts (of total - own)
//   allreduce of n elements        inter-host = 2 (N-R)/N * n elements (rounded down) * size, of
//                                  2 (N-1)/N * n: its reduce-scatter and allgather of n/N per rank
//   broadcast                      B when the next rank of the chain is on another host, else 0
//   all-to-all(v), exchange_counts the bytes to ranks on other hosts
//   send, recv, sendrecv           the bytes sent to a peer on another host
// So ZeRO-3 (a forward and a backward allgather and a gradient reduce-scatter of psi parameters, evenly
// partitioned, per step) sends 3 (N-R)/N * psi * bytes-per-element across hosts per rank and step: 3 psi
// in the limit of many hosts (DeepSpeed's and ZeRO++'s figure), 1.5 psi at 2 hosts of 2 ranks. The
// rule counts the data's owners, whatever the transport, as bytes_sent does: on two real hosts the
// links carried 1.12-1.19x the counted bytes for gathers and reduce-scatters (TCP/IP headers and
// OpenMPI's own messages on top) and 0.51x for the hierarchical transport's allreduce, whose host
// partials cross once per host (docs/multihost.md). A world on one host, a local group and a
// simulated one count no bytes across hosts.

// Note [Busiest member's bytes]
// A collective ends when its busiest member has moved its bytes, and the counting rule above gives each
// member its own. Where the blocks differ, the members' bytes differ per call: a ZeRO-3 gather of a
// module that one rank's shard holds (the flat layout is split into contiguous shards, engine/partition.h)
// has that rank send the module and receive nothing, its peer the reverse, so over a full-duplex link the
// call takes the module's bytes' time, twice what the owner's own count says, and the next module's
// gather, held by the peer, turns the traffic round (measured on two hosts at 100 Mbit/s: ZeRO-3's gathers
// and gradient reduce-scatters crossed one way at a time, the link carrying each direction in turn,
// docs/scaling.md "Uneven blocks"). So each reduce-scatter and allgatherv also records, under the same
// rule, the bytes of the member that receives the most: total - min_j c_j; across hosts, the most any
// member takes from other hosts: the total less the least that one host's members own. Other collectives
// move the same on every member: their figure is this rank's own. The projection charges a collective's
// time by these (project/project_compute.cpp); the counters and the summary keep each rank's own bytes.
// An even partition of every parameter across the ranks (DeepSpeed's) would make the two equal.

// One collective's tally on this rank since the World started (or reset_counters): what DeepSpeed's
// comms_logger reports. Always on: one clock read before and after each collective, next to the
// handshake's microsecond, is noise. `seconds` spans the handshake and the body (DeepSpeed's latency
// also includes waiting for late ranks); `bytes_sent` follows the CommCounters rule above, so
// bytes_sent / seconds is NCCL-tests' bus bandwidth.
struct OpStats {
  std::string name;         // "allreduce", "reduce_scatter", "allgather", "allgatherv", "broadcast", ...
  uint64_t count = 0;       // count of completed collectives
  uint64_t bytes_sent = 0;  // bytes
  double seconds = 0.0;     // wall time, summed over the collectives
  uint64_t bytes_inter_host = 0;  // of bytes_sent, those across hosts (Note [Bytes across hosts])
  // Per collective the group's busiest member's bytes (at least this rank's), summed, and of them
  // across hosts: what a collective's time follows (Note [Busiest member's bytes]).
  uint64_t busiest_bytes = 0;
  uint64_t busiest_inter_host_bytes = 0;
};

// One collective of this rank, as a trace records it (Group::start_trace; comms_logger.trace_file):
// when it started and how long it took (the handshake and the body, as OpStats' seconds), where it ran,
// and its bytes by the CommCounters rule. Where a step's time goes between the collectives, and what the
// link carried when (docs/multihost.md, "A trace of the collectives").
struct TraceEvent {
  std::string name;   // as OpStats' name
  std::string group;  // the group's name ("world", "dp", "tp", "hpz", ...)
  double start_s = 0.0;  // std::chrono::steady_clock (CLOCK_MONOTONIC on Linux: one machine's ranks share it)
  double seconds = 0.0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_inter_host = 0;
  bool on_worker = false;  // on the comm worker (an async collective), not the calling thread
};

// The collectives of `now` that `before` (earlier tallies of the same group) does not hold: per name the
// differences of the counts, bytes and seconds; names with no new collective are left out. One step's
// tallies (the projection's measurement), what came after the last step (the comms logger).
std::vector<OpStats> ops_since(const std::vector<OpStats>& now, const std::vector<OpStats>& before);

}  // namespace zs::comm
