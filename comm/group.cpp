// Group's collectives: each checks its arguments, builds an Op (signature, sizes for messages, byte
// counts, the arena vote) and gives it a body that hands the data to the group's transport, chosen
// when the group was made (Note [Transports] in comm/detail/transport.h), or marks it small (Note
// [Small collectives] in comm/detail/small.h: no body). A sync call's Op lives on its stack (Note [Lean
// small path]). No transport is tested here.
#include "comm/group.h"

#include <algorithm>
#include <climits>
#include <numeric>
#include <vector>

#include "comm/detail/runtime.h"
#include "comm/detail/shm.h"         // shm_node_of
#include "comm/detail/shm_direct.h"  // arena_vote
#include "comm/detail/small.h"
#include "comm/detail/transport.h"
#include "comm/native.h"
#include "memory/dtype.h"

namespace zs::comm {

using detail::Op;
using detail::OpCode;
using memory::DType;

namespace {

void check_tensor(const Op& op, const memory::Tensor& t, const char* role) {
  if (!t.defined()) op.fail(fmt::format("the {} tensor is undefined; pass a tensor with storage", role));
  if (!t.is_contiguous()) op.fail(fmt::format("the {} tensor is not contiguous; pass a contiguous view (flatten a copy)", role));
}

int to_int(const Op& op, size_t n) {
  if (n > static_cast<size_t>(INT_MAX)) op.fail(fmt::format("{} elements exceed MPI's int count; split the buffer into buckets", n));
  return static_cast<int>(n);
}

uint64_t hash_counts(std::span<const size_t> counts) {  // FNV-1a: equal on every rank iff counts agree (w.h.p.)
  uint64_t h = 1469598103934665603ull;
  for (size_t c : counts) h = (h ^ c) * 1099511628211ull;
  return h >> 1;  // keep it positive: the handshake negates values
}

std::shared_ptr<Op> make_op(const std::shared_ptr<detail::GroupState>& g, OpCode code, DType dtype, int64_t size,
                            int64_t root, std::string sizes) {
  auto op = std::make_shared<Op>();
  op->code = code;
  op->group = g;
  op->sizes = std::move(sizes);
  op->signature = {static_cast<int64_t>(code), static_cast<int64_t>(dtype), size, root};
  return op;
}
// The Op of a collective that may take the small path (Note [Lean small path] in comm/detail/small.h):
// a sync call's lives on the caller's stack with a group pointer that does not own (the Group outlives
// the call); an async call's is shared with the queue. Its sizes text is formatted from the op's
// arguments when a message needs it; `counts` views the caller's for a sync call, a copy for async.
void init_op(Op& op, const std::shared_ptr<detail::GroupState>& g, bool async, OpCode code, DType dtype, int64_t size,
             int64_t root, size_t numel, std::span<const size_t> counts = {}, ReduceOp r = ReduceOp::kSum) {
  op.code = code;
  op.group = async ? g : std::shared_ptr<detail::GroupState>(std::shared_ptr<detail::GroupState>(), g.get());
  op.signature = {static_cast<int64_t>(code), static_cast<int64_t>(dtype), size, root};
  op.lazy_sizes = true;
  op.dtype = dtype;
  op.numel = numel;
  op.reduce = r;
  if (async) {
    op.owned_counts.assign(counts.begin(), counts.end());
    op.counts = op.owned_counts;
  } else {
    op.counts = counts;
  }
}

void check_reduce(const Op& op, DType t, ReduceOp r) {
  if (t == DType::kI32 && r == ReduceOp::kAverage) op.fail("int32 supports ReduceOp::kSum only; average in fp32");
}

using detail::Counts;

Counts int_counts(const Op& op, std::span<const size_t> counts) {
  Counts c;
  for (size_t n : counts) {
    c.counts.push_back(to_int(op, n));
    c.displs.push_back(to_int(op, c.total));
    c.total += n;
  }
  to_int(op, c.total);
  return c;
}

std::vector<size_t> counts_of(const Op& op, std::span<const memory::ShardRange> shards) {
  std::vector<size_t> counts;
  size_t next = 0;
  for (const auto& s : shards) {
    if (s.offset != next) op.fail(fmt::format("shard {} starts at element {} but the previous shard ends at {}; shards must tile the buffer in rank order (use memory::partition)", counts.size(), s.offset, next));
    counts.push_back(s.size);
    next = s.end();
  }
  return counts;
}

// The bytes of the blocks of the ranks on other hosts than this one (Note [Bytes across hosts] in
// comm/config.h): counts[j] elements of `wire_size` bytes for rank j, or, with no counts (allgather),
// `even` elements for every rank.
uint64_t remote_bytes(const detail::GroupState& g, std::span<const size_t> counts, size_t even, size_t wire_size) {
  if (g.hosts.empty()) return 0;  // a local or simulated group: one host
  if (counts.empty()) return static_cast<uint64_t>(g.size - g.host_members) * even * wire_size;
  uint64_t n = 0;
  for (size_t j = 0; j < counts.size(); ++j) {
    if (g.remote(static_cast<int>(j))) n += counts[j];
  }
  return n * wire_size;
}

// Of `counts`, the most elements any member takes from members on other hosts: the sum over all
// hosts but the one whose members own the least (Note [Busiest member's bytes] in comm/config.h).
uint64_t busiest_remote_elems(const detail::GroupState& g, std::span<const size_t> counts) {
  if (g.hosts.empty()) return 0;
  std::vector<uint64_t> on_host(static_cast<size_t>(*std::max_element(g.hosts.begin(), g.hosts.end())) + 1, 0);
  std::vector<bool> present(on_host.size(), false);
  uint64_t total = 0;
  for (size_t j = 0; j < counts.size(); ++j) {
    const size_t h = static_cast<size_t>(g.hosts[j]);
    on_host[h] += counts[j];
    present[h] = true;
    total += counts[j];
  }
  uint64_t least = total;
  for (size_t h = 0; h < on_host.size(); ++h) {
    if (present[h]) least = std::min(least, on_host[h]);
  }
  return total - least;
}

// Ring/pipeline byte counting (CommCounters in comm/config.h), its share across hosts, and the busiest
// member's (Note [Busiest member's bytes]; with no counts every member's block is the same).
void count_block_bytes(Op& op, std::span<const size_t> counts, size_t total_elems, size_t own_elems, size_t wire_size) {
  op.bytes_sent = op.bytes_received = (total_elems - own_elems) * wire_size;
  op.bytes_inter_host = remote_bytes(*op.group, counts, own_elems, wire_size);
  if (!counts.empty()) {
    op.busiest_bytes = (total_elems - *std::min_element(counts.begin(), counts.end())) * wire_size;
    op.busiest_inter_host_bytes = busiest_remote_elems(*op.group, counts) * wire_size;
  }
}

}  // namespace

Group::Group(std::shared_ptr<detail::GroupState> state) : state_(std::move(state)) {}
Group::~Group() = default;

Group Group::simulated(int rank, int size, const std::string& name, std::vector<int> hosts) {
  ZS_ASSERT(size >= 1 && rank >= 0 && rank < size, "simulated group: rank {} of {}", rank, size);
  ZS_ASSERT(hosts.empty() || hosts.size() == static_cast<size_t>(size), "simulated group: {} hosts for {} ranks",
            hosts.size(), size);
  auto state = std::make_shared<detail::GroupState>();
  state->runtime = std::make_shared<detail::Runtime>(false);
  state->rank = rank;
  state->size = size;
  state->name = name;
  state->simulated = true;
  if (!hosts.empty()) state->set_hosts(std::move(hosts));  // as a real group's
  state->transport = detail::make_transport(*state);
  return Group(std::move(state));
}

Group Group::simulated_subgroup(std::span<const int> members, const std::string& name) const {
  ZS_ASSERT(state_->simulated, "simulated_subgroup of group '{}', which is not simulated", state_->name);
  const auto me = std::find(members.begin(), members.end(), state_->rank);
  ZS_ASSERT(me != members.end(), "simulated_subgroup: rank {} of '{}' is not among the members", state_->rank, state_->name);
  std::vector<int> hosts;
  if (!state_->hosts.empty()) {
    for (int m : members) {
      ZS_ASSERT(m >= 0 && m < state_->size, "simulated_subgroup: member {} of a group of {}", m, state_->size);
      hosts.push_back(state_->hosts[static_cast<size_t>(m)]);
    }
  }
  return simulated(static_cast<int>(me - members.begin()), static_cast<int>(members.size()), name, std::move(hosts));
}

int Group::rank() const { return state_->rank; }
int Group::size() const { return state_->size; }
const std::string& Group::name() const { return state_->name; }
const CommConfig& Group::config() const { return state_->config; }
CommCounters Group::counters() const { return state_->runtime->counters(); }
uint64_t Group::bytes_sent() const { return state_->bytes_sent.load(std::memory_order_relaxed); }
uint64_t Group::bytes_inter_host() const { return state_->bytes_inter_host.load(std::memory_order_relaxed); }
uint64_t Group::bytes_intra_host() const { return bytes_sent() - bytes_inter_host(); }
int Group::hosts() const {
  if (state_->hosts.empty()) return 1;
  std::vector<int> h = state_->hosts;
  std::sort(h.begin(), h.end());
  return static_cast<int>(std::unique(h.begin(), h.end()) - h.begin());
}
int Group::host_ranks() const { return state_->host_members; }
const std::vector<int>& Group::member_hosts() const { return state_->hosts; }
std::vector<OpStats> Group::op_stats() const { return state_->runtime->op_stats(); }

void Group::start_trace() const { state_->runtime->start_trace(); }

std::vector<TraceEvent> Group::trace() const { return state_->runtime->trace(); }

std::vector<OpStats> ops_since(const std::vector<OpStats>& now, const std::vector<OpStats>& before) {
  std::vector<OpStats> out;
  for (const OpStats& op : now) {
    OpStats d = op;
    const auto was = std::find_if(before.begin(), before.end(), [&](const OpStats& b) { return b.name == op.name; });
    if (was != before.end()) {
      d.count -= was->count;
      d.bytes_sent -= was->bytes_sent;
      d.seconds -= was->seconds;
      d.bytes_inter_host -= was->bytes_inter_host;
      d.busiest_bytes -= was->busiest_bytes;
      d.busiest_inter_host_bytes -= was->busiest_inter_host_bytes;
    }
    if (d.count > 0) out.push_back(d);
  }
  return out;
}
bool Group::is_mpi() const { return !state_->local(); }
namespace detail {
struct GroupAccess {
  static const GroupState& state(const Group& g) { return *g.state_; }
};
}  // namespace detail

MPI_Comm native_handle(const Group& group) { return detail::GroupAccess::state(group).comm; }

detail::ShmNode* detail::shm_node_of(const Group& group) { return GroupAccess::state(group).runtime->shm_node(); }
const detail::GroupState& detail::group_state(const Group& group) { return GroupAccess::state(group); }

Group Group::split(int color, int key, const std::string& name) const {
  return split_as(color, key, name, state_->config);
}

Group Group::dup(const std::string& name, const CommConfig& config) const {
  if (!(config.timeout_s > 0)) throw ConfigError(fmt::format("comm.timeout_s: expected a positive number of seconds, got {}", config.timeout_s));
  return split_as(0, rank(), name, config);
}

Group Group::split_as(int color, int key, const std::string& name, const CommConfig& config) const {
  auto child = std::make_shared<detail::GroupState>();
  child->runtime = state_->runtime;
  child->name = name;
  child->config = config;
  auto op = make_op(state_, OpCode::kSplit, DType::kI32, 0, 0, fmt::format("color {}, key {}, into '{}'", color, key, name));
  if (color < 0) op->fail("color must be >= 0 on every rank");
  op->body = [g = state_.get(), child, color, key, o = op.get()] {
    g->transport->split(*o, color, key, *child);
    child->transport = detail::make_transport(*child);  // Note [Transports]: collective over the new group
  };
  state_->runtime->run(op);
  // A simulated group runs no bodies: its split is a local group of one.
  if (child->transport == nullptr) child->transport = detail::make_transport(*child);
  return Group(child);
}

// ---- allreduce ----

namespace {
// `async`: the op may run after the call returns, so it keeps the tensor's storage alive.
void allreduce_op(Op& op, const std::shared_ptr<detail::GroupState>& g, const memory::Tensor& data, ReduceOp r,
                  bool async) {
  const DType t = data.dtype();
  const size_t n = static_cast<size_t>(data.numel());
  init_op(op, g, async, OpCode::kAllreduce, t, static_cast<int64_t>(n), 0, n, {}, r);
  check_tensor(op, data, "data");
  check_reduce(op, t, r);
  to_int(op, n);
  const int size = g->size;
  const size_t wire = memory::dtype_size(t);  // 16-bit values travel as they are (Note [16-bit reductions])
  // Whole elements first, so the bytes scale exactly with the element size (bf16 = fp32 / 2).
  op.bytes_sent = op.bytes_received = 2 * static_cast<uint64_t>(size - 1) * n / static_cast<uint64_t>(size) * wire;
  if (!g->hosts.empty()) {  // Note [Bytes across hosts]
    op.bytes_inter_host = 2 * static_cast<uint64_t>(size - g->host_members) * n / static_cast<uint64_t>(size) * wire;
  }
  if (detail::carry_if_small(op, t, n * wire, true, data, n * wire, data, async)) return;  // Note [Small collectives]
  op.arena = detail::arena_vote(*g, data, n * wire);  // Note [Direct collectives]
  op.body = [g = g.get(), data, r, n, o = &op] {
    if (n > 0) g->transport->allreduce(*o, data, r);  // a sum over no elements moves nothing
  };
}

template <typename Build>
Work submit_new(detail::Runtime& rt, Build&& build) {
  auto op = std::make_shared<Op>();
  build(*op);
  return rt.submit(std::move(op));
}
}  // namespace

void Group::allreduce(const Tensor& data, ReduceOp op) const {
  Op o;
  allreduce_op(o, state_, data, op, false);
  state_->runtime->run(o);
}
Work Group::allreduce_async(const Tensor& data, ReduceOp op) const {
  return submit_new(*state_->runtime, [&](Op& o) { allreduce_op(o, state_, data, op, true); });
}

// ---- reduce-scatter ----

namespace {
void reduce_scatter_op(Op& op, const std::shared_ptr<detail::GroupState>& g, const memory::Tensor& input,
                       const memory::Tensor& output, std::span<const size_t> counts, ReduceOp r, bool async) {
  const DType t = input.dtype();
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  init_op(op, g, async, OpCode::kReduceScatter, t, static_cast<int64_t>(hash_counts(counts)), 0,
          static_cast<size_t>(input.numel()), counts, r);
  check_tensor(op, input, "input");
  check_tensor(op, output, "output");
  check_reduce(op, t, r);
  if (counts.size() != static_cast<size_t>(g->size)) op.fail(fmt::format("got {} counts for a group of {} ranks; pass one count per rank", counts.size(), g->size));
  if (total != static_cast<size_t>(input.numel())) op.fail(fmt::format("the counts sum to {} but the input has {} elements", total, input.numel()));
  const size_t own = counts[static_cast<size_t>(g->rank)];
  if (static_cast<size_t>(output.numel()) != own) op.fail(fmt::format("the output has {} elements but this rank's count is {}", output.numel(), own));
  if (output.dtype() != t) op.fail(fmt::format("output dtype {} differs from input dtype {}", memory::dtype_name(output.dtype()), memory::dtype_name(t)));
  to_int(op, total);
  count_block_bytes(op, counts, total, own, memory::dtype_size(t));  // Note [16-bit reductions]
  const size_t bytes = total * memory::dtype_size(t);
  if (detail::carry_if_small(op, t, bytes, true, input, bytes, output, async)) return;  // Note [Small collectives]
  Counts c = int_counts(op, counts);
  op.arena = detail::arena_vote(*g, input, bytes);  // Note [Direct collectives]
  op.body = [g = g.get(), input, output, r, c = std::move(c), o = &op] {
    g->transport->reduce_scatter(*o, input, output, c, r);
  };
}
}  // namespace

void Group::reduce_scatter(const Tensor& input, const Tensor& output, std::span<const size_t> counts, ReduceOp op) const {
  Op o;
  reduce_scatter_op(o, state_, input, output, counts, op, false);
  state_->runtime->run(o);
}
void Group::reduce_scatter(const Tensor& input, const Tensor& output, std::span<const ShardRange> shards, ReduceOp op) const {
  auto probe = make_op(state_, OpCode::kReduceScatter, input.dtype(), 0, 0, "shards");
  const std::vector<size_t> counts = counts_of(*probe, shards);
  reduce_scatter(input, output, std::span<const size_t>(counts), op);
}
Work Group::reduce_scatter_async(const Tensor& input, const Tensor& output, std::span<const size_t> counts, ReduceOp op) const {
  return submit_new(*state_->runtime, [&](Op& o) { reduce_scatter_op(o, state_, input, output, counts, op, true); });
}
Work Group::reduce_scatter_async(const Tensor& input, const Tensor& output, std::span<const ShardRange> shards, ReduceOp op) const {
  auto probe = make_op(state_, OpCode::kReduceScatter, input.dtype(), 0, 0, "shards");
  return reduce_scatter_async(input, output, std::span<const size_t>(counts_of(*probe, shards)), op);
}

// ---- allgather(v) ----

namespace {
// !uneven_api: allgather, every rank contributes input.numel() elements (`counts` unused, empty).
void allgatherv_op(Op& op, const std::shared_ptr<detail::GroupState>& g, const memory::Tensor& input,
                   const memory::Tensor& output, std::span<const size_t> counts, bool uneven_api, bool async) {
  const DType t = input.dtype();
  const size_t per_rank = static_cast<size_t>(input.numel());
  const size_t total = uneven_api ? std::accumulate(counts.begin(), counts.end(), size_t{0})
                                  : per_rank * static_cast<size_t>(g->size);
  const OpCode code = uneven_api ? OpCode::kAllgatherv : OpCode::kAllgather;
  // allgather's counts are all input.numel(): its size, readable in a mismatch's message.
  init_op(op, g, async, code, t, uneven_api ? static_cast<int64_t>(hash_counts(counts)) : static_cast<int64_t>(per_rank),
          0, per_rank, counts);
  check_tensor(op, input, "input");
  check_tensor(op, output, "output");
  if (uneven_api && counts.size() != static_cast<size_t>(g->size)) op.fail(fmt::format("got {} counts for a group of {} ranks; pass one count per rank", counts.size(), g->size));
  const size_t own = uneven_api ? counts[static_cast<size_t>(g->rank)] : per_rank;
  if (per_rank != own) op.fail(fmt::format("the input has {} elements but this rank's count is {}", input.numel(), own));
  if (static_cast<size_t>(output.numel()) != total) op.fail(fmt::format("the output has {} elements but the counts sum to {}", output.numel(), total));
  if (output.dtype() != t) op.fail(fmt::format("output dtype {} differs from input dtype {}", memory::dtype_name(output.dtype()), memory::dtype_name(t)));
  to_int(op, total);
  count_block_bytes(op, counts, total, own, memory::dtype_size(t));
  const size_t widest = memory::dtype_size(t) * (uneven_api ? *std::max_element(counts.begin(), counts.end()) : per_rank);
  if (detail::carry_if_small(op, t, widest, false, input, own * memory::dtype_size(t), output, async)) return;  // Note [Small collectives]
  Counts c = int_counts(op, uneven_api ? std::vector<size_t>(counts.begin(), counts.end())
                                       : std::vector<size_t>(static_cast<size_t>(g->size), per_rank));
  {  // Note [Direct collectives]: an input overlapping the output other than exactly in place would be
     // moved while the peers read it, so that rank votes no arena (every rank then stages).
    const size_t es = memory::dtype_size(t);
    const auto* in = static_cast<const char*>(input.raw());
    const auto* own_out = static_cast<const char*>(output.raw()) + static_cast<size_t>(c.displs[static_cast<size_t>(g->rank)]) * es;
    const bool shifted = in != own_out && in < own_out + own * es && own_out < in + own * es;
    op.arena = shifted ? 0 : detail::arena_vote(*g, input, own * es);
  }
  op.body = [g = g.get(), input, output, c = std::move(c), o = &op] {
    g->transport->allgatherv(*o, input, output, c);
  };
}
}  // namespace

void Group::allgather(const Tensor& input, const Tensor& output) const {
  Op o;
  allgatherv_op(o, state_, input, output, {}, false, false);
  state_->runtime->run(o);
}
Work Group::allgather_async(const Tensor& input, const Tensor& output) const {
  return submit_new(*state_->runtime, [&](Op& o) { allgatherv_op(o, state_, input, output, {}, false, true); });
}
void Group::allgatherv(const Tensor& input, const Tensor& output, std::span<const size_t> counts) const {
  Op o;
  allgatherv_op(o, state_, input, output, counts, true, false);
  state_->runtime->run(o);
}
void Group::allgatherv(const Tensor& input, const Tensor& output, std::span<const ShardRange> shards) const {
  auto probe = make_op(state_, OpCode::kAllgatherv, input.dtype(), 0, 0, "shards");
  const std::vector<size_t> counts = counts_of(*probe, shards);
  allgatherv(input, output, std::span<const size_t>(counts));
}
Work Group::allgatherv_async(const Tensor& input, const Tensor& output, std::span<const size_t> counts) const {
  return submit_new(*state_->runtime, [&](Op& o) { allgatherv_op(o, state_, input, output, counts, true, true); });
}
Work Group::allgatherv_async(const Tensor& input, const Tensor& output, std::span<const ShardRange> shards) const {
  auto probe = make_op(state_, OpCode::kAllgatherv, input.dtype(), 0, 0, "shards");
  return allgatherv_async(input, output, std::span<const size_t>(counts_of(*probe, shards)));
}

// ---- broadcast ----

namespace {
void broadcast_op(Op& op, const std::shared_ptr<detail::GroupState>& g, const memory::Tensor& data, int root,
                  bool async) {
  const DType t = data.dtype();
  const size_t n = static_cast<size_t>(data.numel());
  init_op(op, g, async, OpCode::kBroadcast, t, static_cast<int64_t>(n), root, n);
  check_tensor(op, data, "data");
  if (root < 0 || root >= g->size) op.fail(fmt::format("root {} is outside the group of {} ranks", root, g->size));
  const int count = to_int(op, n);
  const uint64_t bytes = n * memory::dtype_size(t);
  const int chain_pos = (g->rank - root + g->size) % g->size;  // position in the pipeline chain from root
  op.bytes_sent = chain_pos < g->size - 1 ? bytes : 0;
  op.bytes_inter_host = op.bytes_sent > 0 && g->remote((g->rank + 1) % g->size) ? bytes : 0;
  op.bytes_received = chain_pos > 0 ? bytes : 0;
  if (detail::carry_if_small(op, t, bytes, false, data, bytes, data, async)) return;  // Note [Small collectives]
  op.arena = detail::arena_vote(*g, data, bytes);  // Note [Direct collectives]
  op.body = [g = g.get(), data, count, root, o = &op] {
    if (count > 0) g->transport->broadcast(*o, data, root);
  };
}
}  // namespace

void Group::broadcast(const Tensor& data, int root) const {
  Op o;
  broadcast_op(o, state_, data, root, false);
  state_->runtime->run(o);
}
Work Group::broadcast_async(const Tensor& data, int root) const {
  return submit_new(*state_->runtime, [&](Op& o) { broadcast_op(o, state_, data, root, true); });
}

// ---- all-to-all(v) ----

namespace {
// Note [alltoallv counts]: MPI_Alltoallv reports a receive count smaller than the matching send count
// as a truncation error on the receiving rank only, and a larger one not at all (the tail of the
// output is left as it was). So before the data moves, every rank gathers every rank's send and receive
// counts (2 * size int32 each, one allgather after the handshake, so it cannot hang) and checks the
// whole matrix: every rank reaches the same verdict and a mismatch throws CommError on all of them,
// naming the first pair, with no data moved.
void check_alltoallv_counts(const Op& op, detail::Transport& transport, int rank, int size,
                            const std::vector<int>& send, const std::vector<int>& recv) {
  const size_t n = static_cast<size_t>(size);
  std::vector<int32_t> mine(2 * n), all(2 * n * n);
  std::copy(send.begin(), send.end(), mine.begin());
  std::copy(recv.begin(), recv.end(), mine.begin() + static_cast<std::ptrdiff_t>(n));
  transport.allgather_counts(op, mine, all);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      const int32_t sent = all[i * 2 * n + j], expected = all[j * 2 * n + n + i];
      if (sent != expected) {
        op.fail(fmt::format("mismatched counts: rank {} sends {} elements to rank {}, which expects {} from it "
                             "(this is rank {}); recv_counts[i] on rank j must equal send_counts[j] on rank i "
                             "(exchange the counts first, e.g. with alltoall)",
                             i, sent, j, expected, rank));
      }
    }
  }
}

using Side = detail::ExchangeSide;

Side contiguous_side(const memory::Tensor& t, const Counts& c, size_t es) {
  Side side{t, {}, {}};
  auto* base = static_cast<unsigned char*>(t.raw());
  for (size_t j = 0; j < c.counts.size(); ++j) {
    side.blocks.push_back({{base + static_cast<size_t>(c.displs[j]) * es, static_cast<size_t>(c.counts[j]) * es}});
  }
  return side;
}

std::shared_ptr<Op> alltoallv_op(const std::shared_ptr<detail::GroupState>& g, DType t, Side in, std::vector<size_t> send,
                                 Side out, std::vector<size_t> recv, bool uneven_api, bool check_counts) {
  const OpCode code = uneven_api ? OpCode::kAlltoallv : OpCode::kAlltoall;
  const size_t ns = std::accumulate(send.begin(), send.end(), size_t{0});
  const size_t nr = std::accumulate(recv.begin(), recv.end(), size_t{0});
  // Per-rank counts legitimately differ in alltoallv, so only alltoall's size enters the signature.
  auto op = make_op(g, code, t, uneven_api ? 0 : static_cast<int64_t>(ns), 0,
                    fmt::format("{}, send {} / receive {} elements", memory::dtype_name(t), ns, nr));
  if (send.size() != static_cast<size_t>(g->size) || recv.size() != static_cast<size_t>(g->size))
    op->fail(fmt::format("got {} send and {} receive counts for a group of {} ranks; pass one count per rank", send.size(), recv.size(), g->size));
  Counts s = int_counts(*op, send);
  Counts r = int_counts(*op, recv);
  const size_t es = memory::dtype_size(t);
  if (in.whole.defined()) in = contiguous_side(in.whole, s, es);
  if (out.whole.defined()) out = contiguous_side(out.whole, r, es);
  const size_t me = static_cast<size_t>(g->rank);
  op->bytes_sent = (s.total - send[me]) * es;
  op->bytes_inter_host = remote_bytes(*g, send, 0, es);
  op->bytes_received = (r.total - recv[me]) * es;
  op->body = [g = g.get(), t, s = std::move(s), r = std::move(r), in = std::move(in), out = std::move(out), uneven_api,
              check_counts, o = op.get()] {
    if (uneven_api && check_counts) check_alltoallv_counts(*o, *g->transport, g->rank, g->size, s.counts, r.counts);
    g->transport->alltoallv(*o, t, in, s, out, r, uneven_api);
  };
  return op;
}

// The contiguous form: input and output tensors with per-rank counts.
std::shared_ptr<Op> alltoallv_op(const std::shared_ptr<detail::GroupState>& g, const memory::Tensor& input,
                                 std::vector<size_t> send, const memory::Tensor& output, std::vector<size_t> recv,
                                 bool uneven_api, bool check_counts = true) {
  const DType t = input.dtype();
  auto probe = make_op(g, uneven_api ? OpCode::kAlltoallv : OpCode::kAlltoall, t, 0, 0,
                       fmt::format("{}, send {} / receive {} elements", memory::dtype_name(t), input.numel(), output.numel()));
  check_tensor(*probe, input, "input");
  check_tensor(*probe, output, "output");
  if (output.dtype() != t) probe->fail(fmt::format("output dtype {} differs from input dtype {}", memory::dtype_name(output.dtype()), memory::dtype_name(t)));
  const size_t ns = std::accumulate(send.begin(), send.end(), size_t{0});
  const size_t nr = std::accumulate(recv.begin(), recv.end(), size_t{0});
  if (ns != static_cast<size_t>(input.numel())) probe->fail(fmt::format("the send counts sum to {} but the input has {} elements", ns, input.numel()));
  if (nr != static_cast<size_t>(output.numel())) probe->fail(fmt::format("the receive counts sum to {} but the output has {} elements", nr, output.numel()));
  return alltoallv_op(g, t, Side{input, {}, {}}, std::move(send), Side{output, {}, {}}, std::move(recv), uneven_api,
                      check_counts);
}

// The piece form: per-rank lists of contiguous tensors of one dtype.
std::shared_ptr<Op> alltoallv_pieces_op(const std::shared_ptr<detail::GroupState>& g,
                                        std::span<const std::vector<memory::Tensor>> send,
                                        std::span<const std::vector<memory::Tensor>> recv, bool check_counts) {
  auto probe = make_op(g, OpCode::kAlltoallv, DType::kF32, 0, 0, "pieces");
  if (send.size() != static_cast<size_t>(g->size) || recv.size() != static_cast<size_t>(g->size))
    probe->fail(fmt::format("got {} send and {} receive blocks for a group of {} ranks; pass one piece list per rank", send.size(), recv.size(), g->size));
  DType t = DType::kF32;
  bool typed = false;
  auto side = [&](std::span<const std::vector<memory::Tensor>> lists, std::vector<size_t>& counts, const char* role) {
    Side sd;
    for (const auto& list : lists) {
      detail::Block block;
      size_t n = 0;
      for (const memory::Tensor& p : list) {
        check_tensor(*probe, p, role);
        if (typed && p.dtype() != t) probe->fail(fmt::format("a {} piece is {} but another is {}; pass one dtype", role, memory::dtype_name(p.dtype()), memory::dtype_name(t)));
        t = p.dtype();
        typed = true;
        n += static_cast<size_t>(p.numel());
        if (p.numel() > 0) block.push_back({static_cast<unsigned char*>(p.raw()), static_cast<size_t>(p.numel()) * memory::dtype_size(p.dtype())});
        sd.keep.push_back(p);
      }
      counts.push_back(n);
      sd.blocks.push_back(std::move(block));
    }
    return sd;
  };
  std::vector<size_t> sc, rc;
  Side in = side(send, sc, "input");
  Side out = side(recv, rc, "output");
  return alltoallv_op(g, t, std::move(in), std::move(sc), std::move(out), std::move(rc), true, check_counts);
}

std::shared_ptr<Op> alltoall_op(const std::shared_ptr<detail::GroupState>& g, const memory::Tensor& input,
                                const memory::Tensor& output) {
  const size_t n = static_cast<size_t>(input.numel());
  const size_t size = static_cast<size_t>(g->size);
  if (n % size != 0 || static_cast<size_t>(output.numel()) != n) {
    auto probe = make_op(g, OpCode::kAlltoall, input.dtype(), 0, 0,
                         fmt::format("send {} / receive {} elements", n, output.numel()));
    probe->fail(fmt::format("input and output need the same numel, divisible by the group size {}; use alltoallv for uneven blocks", size));
  }
  std::vector<size_t> blocks(size, n / size);
  return alltoallv_op(g, input, blocks, output, blocks, false);
}

// Note [Counts in the handshake] (comm/detail/runtime.h): every rank's whole send vector rides on the
// handshake (an allgather of size * w values each), and each rank keeps its column. Past kMaxGathered
// values per rank the allgather would outgrow an alltoall, so the body runs the transport's
// alltoall_counts (MPI_Alltoall) instead. Root -1 marks it apart from a plain alltoall of the same size.
constexpr size_t kMaxGathered = 1024;

std::shared_ptr<Op> exchange_counts_op(const std::shared_ptr<detail::GroupState>& g, std::span<const int64_t> send,
                                       std::span<int64_t> recv) {
  const size_t size = static_cast<size_t>(g->size), w = send.size() / size;
  auto op = make_op(g, OpCode::kAlltoall, DType::kI32, static_cast<int64_t>(w), -1,
                    fmt::format("counts, {} int64 per rank", w));
  if (send.size() != w * size || recv.size() != send.size())
    op->fail(fmt::format("send ({}) and recv ({}) need size() = {} blocks of the same width", send.size(), recv.size(), size));
  const bool in_handshake = send.size() <= kMaxGathered;
  if (in_handshake) op->gather.assign(send.begin(), send.end());  // a local group's is its own (Runtime::execute)
  op->agrees_next = true;
  op->bytes_sent = op->bytes_received = (size - 1) * w * sizeof(int64_t);
  if (!g->hosts.empty()) op->bytes_inter_host = static_cast<size_t>(g->size - g->host_members) * w * sizeof(int64_t);
  const size_t me = static_cast<size_t>(g->rank);
  op->body = [g = g.get(), send, recv, w, me, in_handshake, o = op.get()] {
    if (in_handshake) {  // rank q's block for this rank: block me of its whole vector
      for (size_t q = 0; q < static_cast<size_t>(g->size); ++q)
        std::copy_n(o->gathered.begin() + static_cast<std::ptrdiff_t>((q * static_cast<size_t>(g->size) + me) * w), w,
                    recv.begin() + static_cast<std::ptrdiff_t>(q * w));
    } else {
      to_int(*o, w);
      g->transport->alltoall_counts(*o, send, recv);
    }
  };
  return op;
}
}  // namespace

void Group::exchange_counts(std::span<const int64_t> send, std::span<int64_t> recv) const {
  state_->runtime->run(exchange_counts_op(state_, send, recv));
}

void Group::alltoall(const Tensor& input, const Tensor& output) const { state_->runtime->run(alltoall_op(state_, input, output)); }
Work Group::alltoall_async(const Tensor& input, const Tensor& output) const {
  return state_->runtime->submit(alltoall_op(state_, input, output));
}
void Group::alltoallv(std::span<const std::vector<Tensor>> send, std::span<const std::vector<Tensor>> recv,
                      CountCheck check) const {
  auto op = alltoallv_pieces_op(state_, send, recv, check == CountCheck::kVerify);
  op->after_agreed = check == CountCheck::kExchanged;
  state_->runtime->run(std::move(op));
}
void Group::alltoallv(const Tensor& input, std::span<const size_t> send_counts, const Tensor& output,
                      std::span<const size_t> recv_counts, CountCheck check) const {
  auto op = alltoallv_op(state_, input, {send_counts.begin(), send_counts.end()}, output,
                         {recv_counts.begin(), recv_counts.end()}, true, check == CountCheck::kVerify);
  op->after_agreed = check == CountCheck::kExchanged;
  state_->runtime->run(std::move(op));
}
Work Group::alltoallv_async(const Tensor& input, std::span<const size_t> send_counts, const Tensor& output,
                            std::span<const size_t> recv_counts, CountCheck check) const {
  auto op = alltoallv_op(state_, input, {send_counts.begin(), send_counts.end()}, output,
                         {recv_counts.begin(), recv_counts.end()}, true, check == CountCheck::kVerify);
  op->after_agreed = check == CountCheck::kExchanged;
  return state_->runtime->submit(std::move(op));
}

// ---- barrier ----

namespace {
std::shared_ptr<Op> barrier_op(const std::shared_ptr<detail::GroupState>& g) {
  auto op = make_op(g, OpCode::kBarrier, DType::kI32, 0, 0, "no data");
  op->body = [] {};  // the handshake already waits for every rank (Note [Handshake])
  return op;
}
}  // namespace

void Group::barrier() const { state_->runtime->run(barrier_op(state_)); }
Work Group::barrier_async() const { return state_->runtime->submit(barrier_op(state_)); }

}  // namespace zs::comm
