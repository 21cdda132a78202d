// Internals shared by World, Group and the collectives: MPI ownership, the comm worker thread, the
// handshake and the counters. Not part of the public API.
//
// Note [Execution model]
// Every collective becomes an Op executed in submission order by one executor per World: either the
// caller's thread (a synchronous call while nothing is queued: no handoff latency) or the World's
// comm worker thread (async calls, and sync calls issued behind queued async ones). Only one Op runs
// at a time, so MPI sees collectives in program order on every rank, and async collectives truly
// overlap the caller's computation (the worker drives MPI while the caller computes). Point-to-point
// transfers (Group::send/recv/sendrecv) are Ops of the same executor, marked `pairwise`: they skip
// the group handshake and pair with their peer themselves (Note [Point-to-point] in comm/p2p.cpp).
//
// Note [Handshake]
// An Op first runs a timed handshake: an allreduce(MAX) of its signature (collective, dtype, size,
// root) and of the negated signature, polled with MPI_Testall (Note [Polling]) until `timeout_s`. It
// finishes only when every rank of the group has reached a collective, so a rank that never arrives
// raises CommError (timeout) naming the collective instead of hanging, and max != min means the ranks
// called different collectives (or sizes): CommError naming both, on every rank. Ranks waiting in
// collectives of different groups never exchange a message; Note [Waits across groups] finds them.
// The allreduce is a dissemination exchange of nonblocking point-to-point messages (80 bytes): in
// round k = 1, 2, 4, ... < size each rank sends its running max to rank + k and takes the max with
// what rank - k sent. MAX is idempotent, so after ceil(log2 size) rounds every rank holds the max over
// all, and no rank finishes before every rank has started (it is also a barrier). It runs on a
// private duplicate of the group's communicator (GroupState::handshake_comm), so it never matches
// a user's messages on native_handle(). Measured here: 0.7 us per handshake at 2 ranks against 1.9-2.7
// us for OpenMPI's MPI_Iallreduce (libnbc builds a schedule per call) and 0.9 us for MPI_Allreduce.
// A rank that times out leaves its requests posted (Runtime::orphans_): a late peer then completes
// against them and sees the other collective's signature, a mismatch, instead of hanging too.
// Then the body runs the group's transport (Note [Transports] in comm/detail/transport.h): MPI's
// blocking collective (OpenMPI's tuned algorithms, about twice as fast here as the libnbc nonblocking
// ones for large messages), or the node's shared memory. Once all ranks passed the handshake with equal
// signatures the body stalls only if a rank stops or is cut off mid-collective: the body watchdog then
// ends the job after timeout_s (Note [Stalled body] in comm/detail/body_watchdog.h).
//
// Note [Counts in the handshake]
// An op may carry `gather`: w int64 from this rank (w the same on every rank, and in the signature's
// size). The handshake's messages then carry them too, as a dissemination allgather in the same rounds
// (round k sends the k blocks this rank holds, from ranks rank, rank-1, ..., to rank + k), and when it
// ends `gathered` holds every rank's blocks in rank order: a count exchange costs no message round
// beyond the handshake (Group::exchange_counts; MoE's dispatch, moe/dispatch.h). Such an op
// `agrees_next`: the op executed right after it, if it is marked `after_agreed` and runs on the same
// group, skips its own handshake, since every rank has just passed this one with equal signatures and
// its counts came from it (an alltoallv with CountCheck::kExchanged). Any other op in between, on any
// group, clears that, and the op then handshakes as usual. A rank that stops between the two leaves its
// peers in the data exchange, which the body watchdog bounds (Note [Stalled body]).
//
// Note [Handshake lengths]
// A receive posted for fewer values than the matching message fails (MPI_ERR_TRUNCATE), and OpenMPI
// 4.1 crashed in MPI_Testall when the longer message went by its rendezvous protocol (over 4 KiB on
// shared memory: a count exchange of 1024 values against a plain handshake). So a round that carries
// w gathered values uses its own tag (gather_tag(k, w) in runtime.cpp, above 2^20; a plain round's
// tag is k), and messages of different lengths never match. Two ranks in the same op whose rounds
// differ so then wait, each for its own tag; their wait notices tell them apart from two ranks waiting
// for a slow third within WaitNotices::kAnnounceAfter (Note [Waits across groups]), so the mismatch
// still throws on both, naming both collectives. Matching rounds are unchanged. An MPI whose
// MPI_TAG_UB is below 2^21 - 1 (the standard asks only 32767) keeps tag k for every round: there a
// mismatch of lengths is an MPI error (or the crash) as before.
//
// Note [Polling]
// How the handshake waits decides whether the layer costs 5% or 50x. Measured on the 2-core machine
// under load (benchmarks/comm_bench, docs/benchmarks.md): the first design yielded (sched_yield) on
// every MPI_Test miss, and each yield handed the core to another runnable process for a whole
// scheduler slice (~1-4 ms), so a handshake of 3 polls took 4 ms and a 1 MiB allreduce 30x its raw
// time; the peer, yielding too, also made the first rank's body wait. MPI's own blocking calls spin
// without yielding unless the node is oversubscribed. So now:
//  - Spin phase: MPI_Test in a loop with a CPU pause between misses, and sched_yield only when the node
//    runs more ranks than the CPUs they may run on (the union of their affinity masks: then a spinning
//    rank would keep a waiting peer off its core, which is exactly when OpenMPI's own progress loop
//    yields too).
//  - It lasts kCallerSpin (20 ms) on the caller's thread: a sync collective has nothing better to do,
//    and ranks leaving a previous collective or a step together arrive within that. On the comm
//    worker it lasts only kWorkerSpin (50 us) unless a thread is blocked waiting for the World's
//    collectives (WaitHint: Work::wait, a sync call queued behind async ones, flush): during backward
//    the caller computes while the worker waits for slower ranks, and a spinning worker would take
//    that core from the computation.
//  - Back-off phase: sleeps of elapsed/32 (10 us to 1 ms), so the wait adds at most ~3% to a late
//    arrival and costs almost no CPU; the worker wakes early when a thread starts waiting, and runs
//    with a 1 us timer slack (Linux rounds short sleeps up by 50 us by default).
//  - Cores shared with other busy processes (not our ranks: oversubscribed() misses them) are noticed
//    by the spinning thread's own CPU time falling behind the wall clock; the wait then backs off at
//    once, and every wait spins only kWorkerSpin for the next second (Note [Contended cores] in
//    comm/detail/contention.h, with the measurements). An uncontended handshake never reads that clock.
// The deadline is checked in both phases, so a stalled peer still times out after timeout_s.
#pragma once

#include <mpi.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "comm/detail/body_watchdog.h"
#include "comm/detail/contention.h"
#include "comm/detail/transport.h"
#include "comm/detail/wait_notices.h"
#include "comm/config.h"
#include "comm/work.h"
#include "core/spin.h"  // cpu_relax, for the handshake's and the barriers' spins

namespace zs::comm::detail {

class Runtime;
class ShmNode;
struct ShmGroup;

// One communicator (or a local group of one when `comm == MPI_COMM_NULL`).
struct GroupState {
  std::shared_ptr<Runtime> runtime;
  MPI_Comm comm = MPI_COMM_NULL;
  bool owns_comm = false;
  MPI_Comm handshake_comm = MPI_COMM_NULL;  // owned duplicate of comm (Note [Handshake])
  int rank = 0;
  int size = 1;
  std::string name;
  CommConfig config;
  std::mutex mu;
  // Bytes this rank sent through this group's collectives (CommCounters' rule): Group::bytes_sent; of
  // them, those across hosts (Note [Bytes across hosts] in comm/config.h): Group::bytes_inter_host.
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> bytes_inter_host{0};
  // The host of each member (Runtime::host_of, in group rank order; empty for a local group, a simulated
  // one given no hosts, or one host) and how many members share this rank's host (itself included). Set with the group.
  std::vector<int> hosts;
  int host_members = 1;
  // Sets both from the host of each member (group rank order): `hosts` stays empty on one host.
  void set_hosts(std::vector<int> of);
  std::string broken;  // non-empty once a timeout left this communicator unusable (guarded by mu)
  // Whether `broken` is set, read by every op without the lock (Note [Lean small path] in
  // comm/detail/small.h).
  std::atomic<bool> is_broken{false};
  // Group::simulated: plays rank `rank` of `size` without communicating (the memory estimator).
  bool simulated = false;
  // Its view of the node's shared-memory window, made by its first collective that may use one
  // (comm/detail/shm.h); null until then. Touched only by the Op running on this group.
  std::shared_ptr<ShmGroup> shm;
  // How its collectives move data, chosen once when the group is made (Note [Transports] in
  // comm/detail/transport.h); null only while the group is being made.
  std::unique_ptr<Transport> transport;
  // Note [Waits across groups] (comm/detail/wait_notices.h): an id equal on every member, the
  // members' world ranks, and the ops this rank has started on the group (touched by the executor).
  int64_t id = 0;
  std::vector<int> world_ranks;
  int64_t entered = 0;
  // Point-to-point transfers this rank completed with each group rank: {sends to, receives from}
  // (Note [Waits across groups]); sized on first use, touched by the executor only.
  std::vector<std::array<int64_t, 2>> p2p_done;

  ~GroupState();
  bool local() const { return comm == MPI_COMM_NULL; }
  // Whether group rank r lies on another host than this rank (Note [Bytes across hosts]).
  bool remote(int r) const { return !hosts.empty() && hosts[static_cast<size_t>(r)] != hosts[static_cast<size_t>(rank)]; }
  // Collective over comm (blocking, untimed, like the MPI_Comm_split that made comm): creates
  // handshake_comm.
  void init_handshake_comm();
  std::string where() const;  // "group 'dp' (rank 1 of 3, world rank 1)"
  // Marks the group unusable after a failure (`why`: "allreduce timed out"); any thread.
  void mark_broken(std::string why);
};

enum class OpCode : int64_t {
  kAllreduce = 1, kReduceScatter, kAllgather, kAllgatherv, kBroadcast, kAlltoall, kAlltoallv, kBarrier, kSplit,
  kSend, kRecv, kSendRecv  // point-to-point (Note [Point-to-point] in comm/p2p.cpp)
};
const char* op_name(OpCode code);

struct Op {
  OpCode code = OpCode::kBarrier;
  std::string sizes;                  // "fp32, 1000 elements, sum": for error messages
  // Or, for the collectives that may be small (Note [Lean small path] in comm/detail/small.h), the
  // arguments the text is formatted from when a message needs it (lazy_sizes), which the small bodies
  // read too: the dtype, the tensor's elements (allgather: per rank), the reduction, and the per-rank
  // counts (reduce-scatter, allgatherv; `counts` views the caller's for a sync call, owned_counts for
  // async: so an Op is never copied).
  bool lazy_sizes = false;
  memory::DType dtype = memory::DType::kF32;
  size_t numel = 0;
  ReduceOp reduce = ReduceOp::kSum;
  std::span<const size_t> counts;
  std::vector<size_t> owned_counts;
  std::array<int64_t, 4> signature{};  // code, dtype, size, root: equal on every rank
  std::function<void()> body;         // the data exchange: the group's transport (comm/detail/transport.h)
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t bytes_inter_host = 0;  // of bytes_sent, across hosts (Note [Bytes across hosts] in comm/config.h)
  // The group's busiest member's bytes, and of them across hosts (Note [Busiest member's bytes] in
  // comm/config.h); left 0 where every member moves as much as this one (tallied as bytes_sent).
  uint64_t busiest_bytes = 0;
  uint64_t busiest_inter_host_bytes = 0;
  std::shared_ptr<GroupState> group;
  std::shared_ptr<WorkState> work;  // made by submit, or by run when the op waits behind the queue
  // Note [Counts in the handshake].
  std::vector<int64_t> gather;    // this rank's block, carried by the handshake
  std::vector<int64_t> gathered;  // every rank's block, in rank order, once the handshake is done
  bool agrees_next = false;
  bool after_agreed = false;
  // Note [Small collectives] (comm/detail/small.h): `small` ops exchange carry_bytes from carry_from
  // through the node's small buffers instead of the handshake; `carried` then points at each rank's,
  // and small_body (no `body`) writes the result to carry_to. `keep`: an async small op's tensors.
  bool small = false;
  const void* carry_from = nullptr;
  size_t carry_bytes = 0;
  void* carry_to = nullptr;
  std::span<const unsigned char* const> carried;
  std::vector<memory::Tensor> keep;
  // Note [Direct collectives] (comm/detail/shm_direct.h): the shared arena holding the tensor this
  // rank's peers would read (0: none), carried by the handshake beside the signature but never a
  // mismatch; after it, `agreed_arena` is that id when every rank passed the same nonzero one, else 0.
  int64_t arena = 0;
  int64_t agreed_arena = 0;
  // Point-to-point (Note [Point-to-point] in comm/p2p.cpp): no group handshake and no op index
  // (only two ranks take part); the body pairs with its peers itself. on_worker: set by the executor.
  bool pairwise = false;
  bool on_worker = false;

  Op() = default;
  Op(const Op&) = delete;  // `counts` may view owned_counts
  Op& operator=(const Op&) = delete;
  std::string describe() const;  // "allreduce(fp32, 1000 elements, sum) on group 'dp' (rank ...)"
  // Throws CommError "<describe()>: <what>": a bad argument, found before any rank exchanges anything.
  [[noreturn]] void fail(const std::string& what) const;
};

// The CPUs the ranks of `node` (one host's) may run on together: the union of their affinity masks (a
// launcher's binding, a cpuset, taskset; every online CPU for a rank whose mask cannot be read), at
// least 1. Collective over `node`. Runtime::oversubscribed compares the node's ranks with it.
int node_cpus(MPI_Comm node);

class Runtime {
 public:
  // Initialises MPI (MPI_THREAD_MULTIPLE) when `use_mpi`; otherwise a world of one without MPI.
  explicit Runtime(bool use_mpi);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  bool uses_mpi() const { return uses_mpi_; }
  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  // More ranks on this node than the CPUs they may run on (their affinity masks'; Note [Polling]).
  bool oversubscribed() const { return oversubscribed_; }
  // MPI_TAG_UB admits the handshake's gather tags (Note [Handshake lengths]).
  bool gather_tags() const { return gather_tags_; }
  // Collective over the world (World's constructor): makes the node's shared-memory window unless
  // config.shared_memory is kOff (comm/detail/shm.h). shm_node() is null without one.
  void init_shm(const CommConfig& config);
  // Collective over the world (World's constructor, before init_shm): finds each world rank's host
  // (Note [Bytes across hosts] in comm/config.h): MPI_COMM_TYPE_SHARED, cut into blocks of
  // config.shared_memory_node_ranks when that is set. host_of: 0..hosts()-1, numbered in the order of
  // the hosts' first world ranks; a world without MPI is one host.
  void init_hosts(const CommConfig& config);
  int host_of(int world_rank) const { return host_of_.empty() ? 0 : host_of_[static_cast<size_t>(world_rank)]; }
  int hosts() const { return hosts_; }
  ShmNode* shm_node() const { return shm_node_.get(); }
  WaitNotices* notices() const { return notices_.get(); }  // null without MPI
  // Counts a collective that ran through shared memory (CommCounters::shared_memory_collectives).
  void count_shared_memory() { shm_collectives_.fetch_add(1, std::memory_order_relaxed); }
  // Counts one that read the peers' tensors in place (CommCounters::direct_collectives).
  void count_direct() { direct_collectives_.fetch_add(1, std::memory_order_relaxed); }
  // A collective's data moved without the executor (comm::SharedShards, Note [One-sided gathers] in
  // comm/shared_shards.h): its bytes, tally and count, as execute() records an op it ran.
  void record(const Op& op, Clock::duration elapsed);

  // Runs `op` now on this thread when nothing is queued, else behind the queue; rethrows its error.
  // `op` may live on the caller's stack (Note [Lean small path] in comm/detail/small.h): it is used
  // only until run returns.
  void run(Op& op);
  void run(const std::shared_ptr<Op>& op) { run(*op); }
  // Queues `op` for the worker thread and returns its handle.
  Work submit(std::shared_ptr<Op> op);
  // A simulated group's op: counted, never run; its Work completes when waited for.
  Work simulate(const Op& op, bool async);
  // Blocks until every queued Op has finished.
  void flush();
  // One wait step of a poll loop whose probe started with it (Note [Polling]): spins, yields or
  // sleeps; the probe notices a core shared with other busy processes (Note [Contended cores]).
  void pause(bool on_worker, SpinProbe& probe);
  // Whether a wait found the cores contended within kContendedFor (Note [Contended cores]); the
  // shared-memory barriers consult and set it too.
  RecentContention& contention() { return contention_; }
  // A wait of `op` failed (timeout_s passed, or `failure`: the text of a deadlock WaitNotices found):
  // marks its group unusable and throws the CommError saying so (the handshake's and the small
  // collectives' waits).
  [[noreturn]] void fail_wait(const Op& op, const std::string& failure);
  // CommError naming the first field of the signature that differs across the ranks, from its
  // largest (hi) and smallest (lo) value over the group (Note [Handshake]).
  static void check_signatures(const Op& op, const std::array<int64_t, 4>& hi, const std::array<int64_t, 4>& lo);
  // Keeps requests that a failed op leaves posted, and what they read or write, until MPI_Finalize
  // (never freed if still pending then), as the handshake's orphans are kept.
  void abandon(std::vector<MPI_Request> requests, std::shared_ptr<void> keep);

  CommCounters counters() const;
  void reset_counters();
  // Tallies of the collectives run so far, in OpCode order, those never run left out.
  std::vector<OpStats> op_stats() const;
  // From start_trace() on, every collective of this rank is also recorded with its start (TraceEvent);
  // trace() copies the records so far. Off by default: a lock per collective while on.
  void start_trace() { tracing_.store(true, std::memory_order_relaxed); }
  std::vector<TraceEvent> trace() const;

 private:
  void start_worker();
  void worker_loop();
  void execute(Op& op, bool on_worker);
  void handshake(Op& op, bool on_worker);
  bool poll_until(std::span<MPI_Request> requests, const Op& op, bool on_worker, SpinProbe& probe,
                  std::string& failure);

  bool uses_mpi_ = false;
  bool owns_mpi_ = false;
  int world_rank_ = 0;
  int world_size_ = 1;
  bool oversubscribed_ = false;  // more ranks on this node than CPUs they may run on (Note [Polling])
  bool gather_tags_ = false;     // MPI_TAG_UB admits gather_tag (Note [Handshake lengths])
  std::vector<int> host_of_;  // per world rank (init_hosts)
  int hosts_ = 1;
  std::unique_ptr<ShmNode> shm_node_;  // freed right before MPI_Finalize (MPI_Win_free is collective)
  std::shared_ptr<WaitHint> hint_ = std::make_shared<WaitHint>();
  RecentContention contention_;  // Note [Contended cores]

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Op>> queue_;
  bool busy_ = false;  // the worker runs an op (guarded by mu_)
  // Ops queued or running on the worker: a sync call runs on its own thread, without mu_, when none
  // are (Note [Lean small path] in comm/detail/small.h). Changed under mu_; the worker's decrement
  // releases its op's effects.
  std::atomic<int64_t> pending_{0};
  bool stop_ = false;
  std::thread worker_;
  std::unique_ptr<BodyWatchdog> watchdog_;  // with MPI only (Note [Stalled body])
  std::unique_ptr<WaitNotices> notices_;    // with MPI only (Note [Waits across groups])
  uint64_t handshakes_ = 0;                 // counts handshakes, for WaitNotices::kDrainEvery
  // The group of the last op executed when it agrees_next (Note [Counts in the handshake]), else null.
  // Touched only by the executing thread (one op at a time).
  const GroupState* agreed_ = nullptr;

  // Handshake requests abandoned by a timeout, with their buffers: MPI may still complete them.
  struct HandshakeBuffer {
    std::array<int64_t, 10> mine;      // running max: signature and arena, then both negated
    std::array<int64_t, 10> received;  // this round's message from rank - k
    // With a gather (Note [Counts in the handshake]): the blocks held (ranks rank, rank-1, ...), and
    // this round's outgoing and incoming messages (the 10 values above, then the blocks).
    std::vector<int64_t> held, out, in;
  };
  struct Orphan {
    std::array<MPI_Request, 2> requests;
    std::shared_ptr<HandshakeBuffer> buffer;
  };
  std::mutex orphans_mu_;
  std::vector<Orphan> orphans_;
  struct Abandoned {
    std::vector<MPI_Request> requests;
    std::shared_ptr<void> keep;
  };
  std::vector<Abandoned> abandoned_;  // guarded by orphans_mu_

  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
  std::atomic<uint64_t> bytes_inter_host_{0};
  std::atomic<uint64_t> collectives_{0};
  std::atomic<uint64_t> shm_collectives_{0};
  std::atomic<uint64_t> direct_collectives_{0};
  static constexpr size_t kNumOpCodes = static_cast<size_t>(OpCode::kSendRecv) + 1;
  void tally(const Op& op, Clock::duration elapsed);
  void count_bytes(const Op& op);  // the op's bytes into the World's and its group's counters
  // Per OpCode, written by the executing thread, read by any: atomics, no lock (Note [Lean small
  // path] in comm/detail/small.h).
  struct Tally {
    std::atomic<uint64_t> count{0}, bytes_sent{0}, bytes_inter_host{0}, busiest_bytes{0}, busiest_inter_host_bytes{0};
    std::atomic<int64_t> nanoseconds{0};
  };
  std::array<Tally, kNumOpCodes> tallies_{};
  std::atomic<bool> tracing_{false};
  mutable std::mutex trace_mu_;
  std::vector<TraceEvent> trace_;  // guarded by trace_mu_
};

}  // namespace zs::comm::detail
