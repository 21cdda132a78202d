#include "comm/detail/runtime.h"

#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <exception>

#include "comm/detail/shm.h"
#include "comm/detail/small.h"
#include "comm/mpi_check.h"
#include "core/errors.h"
#include "memory/dtype.h"

namespace zs::comm::detail {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return fmt::format("MPI error code {}", code);
  return std::string(text, static_cast<size_t>(len));
}

GroupState::~GroupState() {
  // MPI_Comm_free is local and lets pending operations finish; the Runtime (held above) outlives it.
  if (id != 0 && runtime->notices() != nullptr) runtime->notices()->remove(*this);
  if (handshake_comm != MPI_COMM_NULL) MPI_Comm_free(&handshake_comm);
  if (owns_comm && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
}

void GroupState::init_handshake_comm() {
  if (local() || handshake_comm != MPI_COMM_NULL) return;
  ZS_MPI_CHECK(MPI_Comm_dup(comm, &handshake_comm), "duplicating the communicator of {} for handshakes", where());
  runtime->notices()->add(*this);  // Note [Waits across groups]
  std::vector<int> of;
  for (const int w : world_ranks) of.push_back(runtime->host_of(w));
  set_hosts(std::move(of));
  init_shm_group(*this);  // comm/detail/shm.h: with the group, so no collective body waits untimed
}

void GroupState::set_hosts(std::vector<int> of) {
  host_members = static_cast<int>(std::count(of.begin(), of.end(), of[static_cast<size_t>(rank)]));
  hosts = host_members == size ? std::vector<int>() : std::move(of);  // Note [Bytes across hosts]
}

void GroupState::mark_broken(std::string why) {
  std::lock_guard lock(mu);
  broken = std::move(why);
  is_broken.store(true, std::memory_order_release);
}

std::string GroupState::where() const {
  return fmt::format("group '{}' (rank {} of {}, world rank {})", name, rank, size, runtime->world_rank());
}

const char* op_name(OpCode code) {
  switch (code) {
    case OpCode::kAllreduce: return "allreduce";
    case OpCode::kReduceScatter: return "reduce_scatter";
    case OpCode::kAllgather: return "allgather";
    case OpCode::kAllgatherv: return "allgatherv";
    case OpCode::kBroadcast: return "broadcast";
    case OpCode::kAlltoall: return "alltoall";
    case OpCode::kAlltoallv: return "alltoallv";
    case OpCode::kBarrier: return "barrier";
    case OpCode::kSplit: return "split";
    case OpCode::kSend: return "send";
    case OpCode::kRecv: return "recv";
    case OpCode::kSendRecv: return "sendrecv";
  }
  return "unknown collective";
}

namespace {
std::string reduce_name(ReduceOp r) { return r == ReduceOp::kSum ? "sum" : "average"; }

// Buffers that MPI may still write when the Runtime goes (a peer stopped mid-exchange): never freed, and
// held from a static root for the rest of the process, so a leak checker sees them held, as they are
// (a bare `new` of their owner was reported as a leak whenever the peer had not resumed by then).
void keep_for_mpi(std::shared_ptr<void> buffer) {
  static auto* kept = new std::vector<std::shared_ptr<void>>();
  kept->push_back(std::move(buffer));
}
}  // namespace

std::string Op::describe() const {
  std::string text = sizes;
  if (lazy_sizes) {  // the collectives that may be small format their arguments only here
    const std::string_view t = memory::dtype_name(dtype);
    switch (code) {
      case OpCode::kAllreduce: text = fmt::format("{}, {} elements, {}", t, numel, reduce_name(reduce)); break;
      case OpCode::kReduceScatter:
        text = fmt::format("{}, {} elements, {} counts, {}", t, numel, fmt::join(counts, "/"), reduce_name(reduce));
        break;
      case OpCode::kAllgather: text = fmt::format("{}, {} elements per rank", t, numel); break;
      case OpCode::kAllgatherv: text = fmt::format("{}, {} counts", t, fmt::join(counts, "/")); break;
      case OpCode::kBroadcast: text = fmt::format("{}, {} elements, root {}", t, numel, signature[3]); break;
      default: break;
    }
  }
  return fmt::format("{}({}) on {}", op_name(code), text, group->where());
}

void Op::fail(const std::string& what) const { throw CommError(fmt::format("{}: {}", describe(), what)); }

// The online CPU count missed a job confined to fewer cores than the machine has: the hosts of
// tests/multihost/hosts.sh (a core each, of the machine's 2 online) ran 2 ranks a core as if each had
// its own, spinning without a yield.
int node_cpus(MPI_Comm node) {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof(mine), &mine) != 0) {  // no mask to read: every online CPU
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    for (long c = 0; c < std::min<long>(std::max(1L, online), CPU_SETSIZE); ++c) CPU_SET(static_cast<int>(c), &mine);
  }
  cpu_set_t all;
  CPU_ZERO(&all);
  ZS_MPI_CHECK(MPI_Allreduce(&mine, &all, static_cast<int>(sizeof(cpu_set_t)), MPI_BYTE, MPI_BOR, node),
               "joining the node's CPU affinity masks");
  return std::max(1, CPU_COUNT(&all));
}

Runtime::Runtime(bool use_mpi) : uses_mpi_(use_mpi) {
  if (!use_mpi) return;
  int initialized = 0, finalized = 0;
  ZS_MPI_CHECK(MPI_Initialized(&initialized), "MPI_Initialized");
  ZS_MPI_CHECK(MPI_Finalized(&finalized), "MPI_Finalized");
  if (finalized) throw CommError("cannot create a comm::World: MPI was already finalized in this process (MPI starts once per process; keep one World alive for the whole run)");
  if (initialized) throw CommError("cannot create a comm::World: MPI is already initialised (another World exists, or other code called MPI_Init); create exactly one World per process and pass its groups around");
  int provided = 0;
  ZS_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
  owns_mpi_ = true;
  if (provided < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    throw CommError(fmt::format("the MPI library provides thread level {} but zeroshard's comm worker needs MPI_THREAD_MULTIPLE ({}); use an MPI built with thread support (OpenMPI 4.1 from Debian has it)", provided, MPI_THREAD_MULTIPLE));
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  watchdog_ = std::make_unique<BodyWatchdog>();
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
  notices_ = std::make_unique<WaitNotices>(world_rank_);
  int* tag_ub = nullptr;
  int has_tag_ub = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &has_tag_ub);
  gather_tags_ = has_tag_ub && *tag_ub >= (1 << 21) - 1;  // Note [Handshake lengths]
  // Note [Polling]: yield while polling only when this node runs more ranks than the CPUs they may use.
  MPI_Comm node = MPI_COMM_NULL;
  ZS_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank_, MPI_INFO_NULL, &node),
               "finding the ranks on this node");
  int node_ranks = 1;
  MPI_Comm_size(node, &node_ranks);
  const int cpus = node_cpus(node);
  MPI_Comm_free(&node);
  oversubscribed_ = node_ranks > cpus;
}

Runtime::~Runtime() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) {
    if (worker_.get_id() == std::this_thread::get_id()) {
      worker_.detach();  // the last owner was dropped by the worker itself; it exits right after
    } else {
      worker_.join();
    }
  }
  // Note [Finalize while unwinding]: MPI_Finalize waits for every rank, so a World destroyed by an
  // exception on one rank would hang there while the others sit in a collective. Leave MPI running
  // instead: the top-level catch calls World::abort, which then still reaches MPI_Abort.
  if (owns_mpi_ && std::uncaught_exceptions() > 0) {
    (void)shm_node_.release();  // MPI_Win_free would wait for the other ranks too: leave it to the OS
    return;
  }
  shm_node_.reset();  // every rank is here, on its way to MPI_Finalize
  if (owns_mpi_) {
    {
      std::lock_guard lock(orphans_mu_);
      for (Orphan& o : orphans_) {
        int done = 0;
        MPI_Testall(2, o.requests.data(), &done, MPI_STATUSES_IGNORE);
        if (!done) keep_for_mpi(o.buffer);  // MPI may still write it: never free
      }
      for (Abandoned& a : abandoned_) {
        int done = 0;
        MPI_Testall(static_cast<int>(a.requests.size()), a.requests.data(), &done, MPI_STATUSES_IGNORE);
        if (!done) keep_for_mpi(a.keep);
      }
    }
    notices_.reset();
    MPI_Finalize();
  }
}

void Runtime::init_shm(const CommConfig& config) {
  if (!uses_mpi_) return;
  check_shm_config_agrees(MPI_COMM_WORLD, config, "the world");
  if (config.shared_memory == SharedMemory::kOff) return;
  shm_node_ = ShmNode::create(config.shared_memory_node_ranks, config.shared_memory == SharedMemory::kOn);
}

void Runtime::init_hosts(const CommConfig& config) {
  if (!uses_mpi_) return;
  MPI_Comm node = MPI_COMM_NULL;
  ZS_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank_, MPI_INFO_NULL, &node),
               "finding the ranks on this host");
  if (config.shared_memory_node_ranks > 0) {  // the same blocks as ShmNode::create's
    int r = 0;
    MPI_Comm_rank(node, &r);
    MPI_Comm block = MPI_COMM_NULL;
    ZS_MPI_CHECK(MPI_Comm_split(node, r / config.shared_memory_node_ranks, r, &block),
                 "splitting the host into blocks of comm.shared_memory_node_ranks = {} ranks", config.shared_memory_node_ranks);
    MPI_Comm_free(&node);
    node = block;
  }
  int first = 0;  // the host's first world rank names it
  ZS_MPI_CHECK(MPI_Allreduce(&world_rank_, &first, 1, MPI_INT, MPI_MIN, node), "naming this host");
  MPI_Comm_free(&node);
  std::vector<int> firsts(static_cast<size_t>(world_size_));
  ZS_MPI_CHECK(MPI_Allgather(&first, 1, MPI_INT, firsts.data(), 1, MPI_INT, MPI_COMM_WORLD), "gathering the hosts' layout");
  std::vector<int> index(static_cast<size_t>(world_size_), -1);  // by first world rank
  host_of_.resize(firsts.size());
  hosts_ = 0;
  for (size_t r = 0; r < firsts.size(); ++r) {
    int& h = index[static_cast<size_t>(firsts[r])];
    if (h < 0) h = hosts_++;
    host_of_[r] = h;
  }
}

void Runtime::count_bytes(const Op& op) {
  bytes_sent_.fetch_add(op.bytes_sent, std::memory_order_relaxed);
  bytes_received_.fetch_add(op.bytes_received, std::memory_order_relaxed);
  bytes_inter_host_.fetch_add(op.bytes_inter_host, std::memory_order_relaxed);
  op.group->bytes_sent.fetch_add(op.bytes_sent, std::memory_order_relaxed);
  op.group->bytes_inter_host.fetch_add(op.bytes_inter_host, std::memory_order_relaxed);
}

void Runtime::record(const Op& op, Clock::duration elapsed) {
  if (op.group->size > 1) count_bytes(op);
  tally(op, elapsed);
  collectives_.fetch_add(1, std::memory_order_relaxed);
}

void Runtime::start_worker() {
  if (!worker_.joinable()) worker_ = std::thread([this] {
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);  // 1 us: the back-off's short sleeps (Note [Polling])
    worker_loop();
  });
}

Work Runtime::simulate(const Op& op, bool async) {
  tally(op, Clock::duration::zero());
  count_bytes(op);
  collectives_.fetch_add(1, std::memory_order_relaxed);
  if (!async) return Work();
  auto state = std::make_shared<WorkState>();
  state->defer();
  return Work(state, op.bytes_sent);
}

void Runtime::run(Op& op) {
  if (op.group->simulated) {
    simulate(op, false);
    return;
  }
  // Nothing queued or running on the worker, which then stays idle (collectives are issued from one
  // thread at a time): run on the caller's thread, no lock (Note [Execution model], Note [Lean small
  // path] in comm/detail/small.h). The acquire pairs with the worker's decrement after its last op.
  if (pending_.load(std::memory_order_acquire) == 0) {
    execute(op, false);
    return;
  }
  // Behind the queue: the caller blocks until it ran, so the queue may point at `op` without owning it.
  op.work = std::make_shared<WorkState>(hint_);  // waiting counts in the hint: the worker spins
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::shared_ptr<Op>(std::shared_ptr<Op>(), &op));
    pending_.fetch_add(1, std::memory_order_relaxed);
    start_worker();
  }
  cv_.notify_all();
  Work(op.work).wait();
}

Work Runtime::submit(std::shared_ptr<Op> op) {
  if (op->group->simulated) return simulate(*op, true);
  op->work = std::make_shared<WorkState>(hint_);
  Work work(op->work, op->bytes_sent);
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(op));
    pending_.fetch_add(1, std::memory_order_relaxed);
    start_worker();
  }
  cv_.notify_all();
  return work;
}

void Runtime::flush() {
  std::unique_lock lock(mu_);
  if (queue_.empty() && !busy_) return;
  hint_->enter();
  cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
  hint_->leave();
}

void Runtime::worker_loop() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return (stop_ && queue_.empty()) || (!queue_.empty() && !busy_); });
    if (queue_.empty()) return;
    std::shared_ptr<Op> op = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    Status status;
    try {
      execute(*op, true);
    } catch (...) {
      status = Status::from_current_exception();
    }
    std::shared_ptr<WorkState> work = op->work;
    op.reset();  // drop tensors and scratch before signalling
    lock.lock();
    busy_ = false;
    // Before complete: a caller woken by it may then run its next sync op inline at once. Release:
    // that op sees every effect of this one (the small buffers' records, the group's counters).
    pending_.fetch_sub(1, std::memory_order_release);
    lock.unlock();
    work->complete(std::move(status));
    lock.lock();
    cv_.notify_all();
  }
}

void Runtime::execute(Op& op, bool on_worker) {
  GroupState& g = *op.group;
  if (g.is_broken.load(std::memory_order_acquire)) [[unlikely]] {
    std::lock_guard lock(g.mu);
    throw CommError(fmt::format("{}: not run because this group is unusable after an earlier failure ({}); end the job with World::abort from the top-level error handler", op.describe(), g.broken));
  }
  const auto start = Clock::now();
  const bool agreed = op.after_agreed && agreed_ == &g;  // Note [Counts in the handshake]
  agreed_ = nullptr;
  op.on_worker = on_worker;
  if (!g.local()) {
    if (!op.pairwise) {
      ++g.entered;  // Note [Waits across groups]: every collective on the group counts, handshake or not
      if (op.small) {
        small_exchange(op, on_worker);  // Note [Small collectives]: the handshake and the data at once
      } else if (!agreed) {
        handshake(op, on_worker);
      }
    }
    if (op.small) {  // a local sum or copy: nothing to stall in (Note [Small collectives])
      small_body(op);
      small_done(op);
      count_shared_memory();
    } else {
      const BodyWatchdog::Ticket ticket = watchdog_->arm(
          g.config.timeout_s + BodyWatchdog::kGraceS,
          [](const void* o) { return static_cast<const Op*>(o)->describe(); }, &op);
      try {
        op.body();
      } catch (...) {
        watchdog_->disarm(ticket);
        throw;
      }
      watchdog_->disarm(ticket);
    }
  } else {
    op.gathered = op.gather;
    op.body();
  }
  if (op.agrees_next) agreed_ = &g;
  if (g.size > 1) count_bytes(op);
  tally(op, Clock::now() - start);
  collectives_.fetch_add(1, std::memory_order_relaxed);
  if (op.small) small_reclaim(op);  // last: no locked instruction after it here (Note [Small path's waits])
}

namespace {

constexpr auto kCallerSpin = std::chrono::milliseconds(20);
constexpr auto kWorkerSpin = std::chrono::microseconds(50);

// Note [Handshake lengths]: a round carrying w gathered values has its own tag, above every plain
// round's tag k (a power of two below the group size), so messages of different lengths never match.
// Below 2^21 - 1, the tag bound of the strictest MPI in use (Cray MPICH's MPI_TAG_UB).
int gather_tag(int k, size_t w) {
  ZS_ASSERT(w < (1u << 15), "{} values gathered in a handshake; Group keeps it to kMaxGathered", w);
  const int log2k = std::countr_zero(static_cast<unsigned>(k));
  return (1 << 20) | (static_cast<int>(w) << 5) | log2k;
}

}  // namespace

// Polls `requests` until all complete (true) or timeout_s after `start` passes (false, `failure`
// empty) or another rank's notice shows they never will (false, `failure` says why); Note [Polling].
bool Runtime::poll_until(std::span<MPI_Request> requests, const Op& op, bool on_worker, SpinProbe& probe,
                         std::string& failure) {
  const auto start = probe.start();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(op.group->config.timeout_s));
  auto check_at = start + WaitNotices::kAnnounceAfter;  // Note [Waits across groups]
  while (true) {
    int done = 0;
    ZS_MPI_CHECK(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE),
                 "{}: MPI_Testall of the handshake", op.describe());
    if (done) return true;
    const auto now = Clock::now();
    if (now >= deadline) [[unlikely]] return false;
    if (now >= check_at) [[unlikely]] {
      check_at = now + WaitNotices::kCheckEvery;
      failure = notices_->find_deadlock(op);
      if (!failure.empty()) return false;
    }
    pause(on_worker, probe);
  }
}

void Runtime::pause(bool on_worker, SpinProbe& probe) {
  const auto now = Clock::now();
  const auto start = probe.start();
  // Note [Contended cores]: beside other busy processes every wait spins only kWorkerSpin, and a
  // thread blocked on the World's collectives no longer keeps the worker spinning. Where our own ranks
  // oversubscribe the node, the spin yields and is never judged contended (Note [Our own ranks' turns]).
  const bool contended = !oversubscribed_ && contention_.recent(now);
  const auto spin = on_worker || contended ? Clock::duration(kWorkerSpin) : Clock::duration(kCallerSpin);
  if (now < start + spin || (on_worker && !contended && hint_->waited())) {
    if (oversubscribed_) {
      sched_yield();
      return;
    }
    if (!probe.contended(now)) [[likely]] {
      cpu_relax();
      return;
    }
    contention_.seen(now);  // this thread was preempted while spinning: back off from now on
  }
  // Back-off: a peer is computing, or is waiting for our core. Sleep elapsed/32, within [10 us, 1 ms].
  const long elapsed_us = std::chrono::duration_cast<std::chrono::microseconds>(now - start).count();
  const long sleep_us = std::clamp(elapsed_us / 32, 10L, 1000L);
  probe.slept(now);  // a worker may spin again once a thread waits
  if (on_worker && !contention_.recent(now)) {
    hint_->sleep_unless_waited(sleep_us);
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
  }
}

void Runtime::abandon(std::vector<MPI_Request> requests, std::shared_ptr<void> keep) {
  std::lock_guard lock(orphans_mu_);
  abandoned_.push_back({std::move(requests), std::move(keep)});
}

void Runtime::handshake(Op& op, bool on_worker) {
  GroupState& g = *op.group;
  auto buffer = std::make_shared<HandshakeBuffer>();
  constexpr size_t kF = 5, kV = 2 * kF;  // fields (the signature, then the arena vote) and values per message
  for (size_t i = 0; i < kF; ++i) {
    buffer->mine[i] = i < 4 ? op.signature[i] : op.arena;
    buffer->mine[kF + i] = -buffer->mine[i];
  }
  SpinProbe probe(Clock::now());  // one for all rounds: they share the start and the timeout
  const size_t w = op.gather.size();  // Note [Counts in the handshake]
  buffer->held = op.gather;
  if (++handshakes_ % WaitNotices::kDrainEvery == 0) notices_->drain();  // Note [Waits across groups]
  for (int k = 1; k < g.size; k *= 2) {  // dissemination rounds (Note [Handshake]); tag k, or gather_tag
    std::array<MPI_Request, 2> requests{MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int64_t* recv_at = buffer->received.data();
    const int64_t* send_at = buffer->mine.data();
    int n = static_cast<int>(kV);
    int tag = k;
    if (w > 0) {  // one message: the kV values, then the k blocks held
      n = static_cast<int>(kV + static_cast<size_t>(k) * w);
      buffer->out.assign(buffer->mine.begin(), buffer->mine.end());
      buffer->out.insert(buffer->out.end(), buffer->held.begin(), buffer->held.end());
      buffer->in.assign(static_cast<size_t>(n), 0);
      send_at = buffer->out.data();
      recv_at = buffer->in.data();
      if (gather_tags_) tag = gather_tag(k, w);  // Note [Handshake lengths]
    }
    ZS_MPI_CHECK(MPI_Irecv(recv_at, n, MPI_INT64_T, (g.rank - k + g.size) % g.size, tag, g.handshake_comm, &requests[0]),
                 "{}: posting the handshake receive", op.describe());
    ZS_MPI_CHECK(MPI_Isend(send_at, n, MPI_INT64_T, (g.rank + k) % g.size, tag, g.handshake_comm, &requests[1]),
                 "{}: posting the handshake send", op.describe());
    std::string failure;
    if (!poll_until(requests, op, on_worker, probe, failure)) [[unlikely]] {
      {
        std::lock_guard lock(orphans_mu_);
        orphans_.push_back({requests, std::move(buffer)});
      }
      fail_wait(op, failure);
    }
    if (w > 0) {  // rank - k's blocks (ranks rank-k, rank-k-1, ...): as many as are still missing
      std::copy_n(buffer->in.begin(), kV, buffer->received.begin());
      const size_t take = static_cast<size_t>(std::min(k, g.size - k)) * w;
      buffer->held.insert(buffer->held.end(), buffer->in.begin() + kV, buffer->in.begin() + kV + static_cast<std::ptrdiff_t>(take));
    }
    for (size_t i = 0; i < kV; ++i) buffer->mine[i] = std::max(buffer->mine[i], buffer->received[i]);
  }
  const auto& b = buffer->mine;
  check_signatures(op, {b[0], b[1], b[2], b[3]}, {-b[kF], -b[kF + 1], -b[kF + 2], -b[kF + 3]});
  op.agreed_arena = b[4] == -b[kF + 4] ? b[4] : 0;  // a vote, not a mismatch (Note [Direct collectives])
  if (w > 0) {  // held[i] is rank (rank - i)'s block
    op.gathered.resize(static_cast<size_t>(g.size) * w);
    for (int q = 0; q < g.size; ++q) {
      const size_t i = static_cast<size_t>((g.rank - q + g.size) % g.size);
      std::copy_n(buffer->held.begin() + static_cast<std::ptrdiff_t>(i * w), w,
                  op.gathered.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(q) * w));
    }
  }
}

void Runtime::fail_wait(const Op& op, const std::string& failure) {
  GroupState& g = *op.group;
  std::string message = !failure.empty() ? failure : fmt::format(
      "{} timed out after {} s waiting for the other ranks of the group (comm.timeout_s = {}): a rank is "
      "stuck, has failed, or called a different sequence of collectives; check the other ranks' errors, "
      "or raise comm.timeout_s if a rank legitimately computes longer",
      op.describe(), g.config.timeout_s, g.config.timeout_s);
  g.mark_broken(fmt::format("{} {}", op_name(op.code),
                            failure.empty() ? "timed out" : "mismatched another rank's collective"));
  throw CommError(message);
}

void Runtime::check_signatures(const Op& op, const std::array<int64_t, 4>& high, const std::array<int64_t, 4>& low) {
  auto hi = [&](size_t i) { return high[i]; };
  auto lo = [&](size_t i) { return low[i]; };
  static constexpr const char* kField[] = {"collective", "dtype", "size", "root"};
  auto text = [&](size_t i, int64_t v) {  // a field's value as the caller passed it
    if (i == 1) return std::string(memory::dtype_name(static_cast<memory::DType>(v)));
    const bool hashed = i == 2 && (op.code == OpCode::kAllgatherv || op.code == OpCode::kReduceScatter);
    return hashed ? fmt::format("{:#x} (a hash of the counts)", v) : fmt::format("{}", v);
  };
  auto other = [&](size_t i) { return hi(i) == op.signature[i] ? lo(i) : hi(i); };  // exact at 2 ranks
  if (hi(0) != lo(0)) {
    throw CommError(fmt::format(
        "mismatched collectives: {} was called here while another rank of the group called {} (dtype {}, size {}, "
        "root {}); every rank of a group must call the same collectives in the same order",
        op.describe(), op_name(static_cast<OpCode>(other(0))), text(1, other(1)), other(2), other(3)));
  }
  for (size_t i = 1; i < 4; ++i) {
    if (hi(i) != lo(i)) {
      throw CommError(fmt::format(
          "mismatched {} across ranks: {} was called with {} {} here while other ranks passed values from {} "
          "to {}; every rank must pass the same {}",
          kField[i], op.describe(), kField[i], text(i, op.signature[i]), text(i, lo(i)), text(i, hi(i)), kField[i]));
    }
  }
}

CommCounters Runtime::counters() const {
  return {bytes_sent_.load(), bytes_received_.load(), collectives_.load(), shm_collectives_.load(),
          direct_collectives_.load(), bytes_inter_host_.load()};
}

void Runtime::tally(const Op& op, Clock::duration elapsed) {
  const size_t i = static_cast<size_t>(op.code);
  ZS_ASSERT(i < kNumOpCodes, "collective code {} out of range", i);
  Tally& t = tallies_[i];
  t.count.fetch_add(1, std::memory_order_relaxed);
  // A group of one moves nothing (CommCounters): its collectives count, their bytes do not.
  if (op.group->size > 1) {
    t.bytes_sent.fetch_add(op.bytes_sent, std::memory_order_relaxed);
    t.bytes_inter_host.fetch_add(op.bytes_inter_host, std::memory_order_relaxed);
    // At least this member's own: an op that sets no busiest figure moves as much on every member.
    t.busiest_bytes.fetch_add(std::max(op.busiest_bytes, op.bytes_sent), std::memory_order_relaxed);
    t.busiest_inter_host_bytes.fetch_add(std::max(op.busiest_inter_host_bytes, op.bytes_inter_host),
                                         std::memory_order_relaxed);
  }
  t.nanoseconds.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count(),
                          std::memory_order_relaxed);
  if (tracing_.load(std::memory_order_relaxed)) [[unlikely]] {
    const auto now = Clock::now();
    const bool moved = op.group->size > 1;
    TraceEvent e{.name = op_name(op.code), .group = op.group->name,
                 .start_s = std::chrono::duration<double>((now - elapsed).time_since_epoch()).count(),
                 .seconds = std::chrono::duration<double>(elapsed).count(), .bytes_sent = moved ? op.bytes_sent : 0,
                 .bytes_inter_host = moved ? op.bytes_inter_host : 0, .on_worker = op.on_worker};
    std::lock_guard lock(trace_mu_);
    trace_.push_back(std::move(e));
  }
}

std::vector<TraceEvent> Runtime::trace() const {
  std::lock_guard lock(trace_mu_);
  return trace_;
}

std::vector<OpStats> Runtime::op_stats() const {
  std::vector<OpStats> out;
  for (size_t i = 0; i < kNumOpCodes; ++i) {
    const Tally& t = tallies_[i];
    const uint64_t count = t.count.load(std::memory_order_relaxed);
    if (count == 0) continue;
    out.push_back({op_name(static_cast<OpCode>(i)), count, t.bytes_sent.load(std::memory_order_relaxed),
                   static_cast<double>(t.nanoseconds.load(std::memory_order_relaxed)) * 1e-9,
                   t.bytes_inter_host.load(std::memory_order_relaxed), t.busiest_bytes.load(std::memory_order_relaxed),
                   t.busiest_inter_host_bytes.load(std::memory_order_relaxed)});
  }
  return out;
}

void Runtime::reset_counters() {
  for (Tally& t : tallies_) {
    t.count = 0;
    t.bytes_sent = 0;
    t.bytes_inter_host = 0;
    t.busiest_bytes = 0;
    t.busiest_inter_host_bytes = 0;
    t.nanoseconds = 0;
  }
  bytes_sent_ = 0;
  bytes_received_ = 0;
  bytes_inter_host_ = 0;
  collectives_ = 0;
  shm_collectives_ = 0;
  direct_collectives_ = 0;
}

}  // namespace zs::comm::detail
