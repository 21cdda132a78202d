#include "comm/group.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <numeric>
#include <vector>

#include "comm/detail/runtime.h"
#include "comm/detail/shm.h"
#include "comm/detail/shm_direct.h"
#include "comm/detail/shm_reduce.h"
#include "comm/mpi_check.h"
#include "comm/native.h"
#include "memory/dtype.h"

namespace zs::comm {

using detail::Op;
using detail::OpCode;
using memory::DType;

namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kI32: return MPI_INT32_T;
    case DType::kBF16:
    case DType::kF16: return MPI_UINT16_T;  // moved as bits; reductions go through fp32
  }
  return MPI_BYTE;
}

[[noreturn]] void fail(const Op& op, const std::string& what) {
  throw CommError(fmt::format("{}: {}", op.describe(), what));
}

void check_tensor(const Op& op, const memory::Tensor& t, const char* role) {
  if (!t.defined()) fail(op, fmt::format("the {} tensor is undefined; pass a tensor with storage", role));
  if (!t.is_contiguous()) fail(op, fmt::format("the {} tensor is not contiguous; pass a contiguous view (flatten a copy)", role));
}

int to_int(const Op& op, size_t n) {
  if (n > static_cast<size_t>(INT_MAX)) fail(op, fmt::format("{} elements exceed MPI's int count; split the buffer into buckets", n));
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

void check_reduce(const Op& op, DType t, ReduceOp r) {
  if (t == DType::kI32 && r == ReduceOp::kAverage) fail(op, "int32 supports ReduceOp::kSum only; average in fp32");
}

void scale(float* p, size_t n, int size) {
  const float d = static_cast<float>(size);
  for (size_t i = 0; i < n; ++i) p[i] /= d;
}

struct Counts {
  std::vector<int> counts, displs;
  size_t total = 0;
};

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
    if (s.offset != next) fail(op, fmt::format("shard {} starts at element {} but the previous shard ends at {}; shards must tile the buffer in rank order (use memory::partition)", counts.size(), s.offset, next));
    counts.push_back(s.size);
    next = s.end();
  }
  return counts;
}

bool all_equal(std::span<const size_t> c) {
  return std::all_of(c.begin(), c.end(), [&](size_t x) { return x == c[0]; });
}

// Note [16-bit reductions]
// A bf16/fp16 reduction puts its 16-bit values on the wire (half the bytes of fp32: what
// communication_data_type bf16/fp16 is for) and still sums in fp32, rounding once. MPI's own
// reduce-scatter cannot: with MPI_FLOAT the wire carries fp32, and a user-defined MPI_Op on 16-bit
// values rounds every partial sum of its ring to 16 bits (N-1 roundings). So the MPI path is a direct
// reduce-scatter: one MPI_Alltoallv hands rank j every rank's block j (the bytes a ring moves, total -
// own), then rank j sums the N blocks in rank order in fp32 with the shared-memory path's kernels
// (comm/detail/shm_reduce.h) and rounds once; an allreduce follows it with an allgatherv of the
// 16-bit results. Both paths therefore give the same bits, on any number of ranks.
void reduce_scatter_16bit(const detail::GroupState& g, const Op& op, const char* in, char* out, DType t, const Counts& c,
                          ReduceOp r) {
  const size_t es = memory::dtype_size(t);
  const size_t me = static_cast<size_t>(g.rank), ranks = static_cast<size_t>(g.size);
  const int own = c.counts[me];
  // Every other rank's copy of this rank's block, in rank order (this rank's own is read in place).
  std::unique_ptr<char[]> recv(new char[static_cast<size_t>(own) * es * ranks]);
  std::vector<int> send_counts = c.counts, recv_counts(ranks, own), recv_displs(ranks);
  send_counts[me] = recv_counts[me] = 0;
  for (size_t j = 0; j < ranks; ++j) recv_displs[j] = static_cast<int>(j) * own;
  ZS_MPI_CHECK(MPI_Alltoallv(in, send_counts.data(), c.displs.data(), mpi_type(t), recv.get(), recv_counts.data(),
                             recv_displs.data(), mpi_type(t), g.comm),
               "{}", op.describe());
  std::vector<const void*> srcs(ranks);
  for (size_t j = 0; j < ranks; ++j) {
    srcs[j] = j == me ? static_cast<const void*>(in + static_cast<size_t>(c.displs[me]) * es)
                      : recv.get() + j * static_cast<size_t>(own) * es;
  }
  // out may be this rank's block of `in` (in place): reduce_sum reads each element before writing it.
  detail::reduce_sum(srcs, t, out, t, static_cast<size_t>(own), r == ReduceOp::kAverage ? static_cast<float>(g.size) : 1.0f);
}

std::string reduce_name(ReduceOp r) { return r == ReduceOp::kSum ? "sum" : "average"; }

// Ring/pipeline byte counting (CommCounters in comm/config.h).
void count_block_bytes(Op& op, size_t total_elems, size_t own_elems, size_t wire_size) {
  op.bytes_sent = op.bytes_received = (total_elems - own_elems) * wire_size;
}

}  // namespace

Group::Group(std::shared_ptr<detail::GroupState> state) : state_(std::move(state)) {}
Group::~Group() = default;

Group Group::simulated(int rank, int size, const std::string& name) {
  ZS_ASSERT(size >= 1 && rank >= 0 && rank < size, "simulated group: rank {} of {}", rank, size);
  auto state = std::make_shared<detail::GroupState>();
  state->runtime = std::make_shared<detail::Runtime>(false);
  state->rank = rank;
  state->size = size;
  state->name = name;
  state->simulated = true;
  return Group(std::move(state));
}

int Group::rank() const { return state_->rank; }
int Group::size() const { return state_->size; }
const std::string& Group::name() const { return state_->name; }
const CommConfig& Group::config() const { return state_->config; }
CommCounters Group::counters() const { return state_->runtime->counters(); }
std::vector<OpStats> Group::op_stats() const { return state_->runtime->op_stats(); }
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
  auto child = std::make_shared<detail::GroupState>();
  child->runtime = state_->runtime;
  child->name = name;
  child->config = state_->config;
  auto op = make_op(state_, OpCode::kSplit, DType::kI32, 0, 0, fmt::format("color {}, key {}, into '{}'", color, key, name));
  if (color < 0) fail(*op, "color must be >= 0 on every rank");
  op->body = [g = state_.get(), child, color, key, o = op.get()] {
    if (g->local()) return;
    ZS_MPI_CHECK(MPI_Comm_split(g->comm, color, key, &child->comm), "{}", o->describe());
    child->owns_comm = true;
    MPI_Comm_rank(child->comm, &child->rank);
    MPI_Comm_size(child->comm, &child->size);
    child->init_handshake_comm();
  };
  state_->runtime->run(op);
  return Group(child);
}

Group Group::dup(const std::string& name, const CommConfig& config) const {
  if (!(config.timeout_s > 0)) throw ConfigError(fmt::format("comm.timeout_s: expected a positive number of seconds, got {}", config.timeout_s));
  Group g = split(0, rank(), name);
  g.state_->config = config;
  if (!g.state_->local()) detail::check_shm_config_agrees(g.state_->comm, config, g.state_->where());
  return g;
}

// ---- allreduce ----

namespace {
std::shared_ptr<Op> allreduce_op(const std::shared_ptr<detail::GroupState>& g, const memory::Tensor& data, ReduceOp r) {
  const DType t = data.dtype();
  const size_t n = static_cast<size_t>(data.numel());
  auto op = make_op(g, OpCode::kAllreduce, t, static_cast<int64_t>(n), 0,
                    fmt::format("{}, {} elements, {}", memory::dtype_name(t), n, reduce_name(r)));
  check_tensor(*op, data, "data");
  check_reduce(*op, t, r);
  const int count = to_int(*op, n);
  const int size = g->size;
  const size_t wire = memory::dtype_size(t);  // 16-bit values travel as they are (Note [16-bit reductions])
  // Whole elements first, so the bytes scale exactly with the element size (bf16 = fp32 / 2).
  op->bytes_sent = op->bytes_received = 2 * static_cast<uint64_t>(size - 1) * n / static_cast<uint64_t>(size) * wire;
  op->arena = detail::arena_vote(*g, data, n * wire);  // Note [Direct collectives]
  op->body = [g = g.get(), data, r, t, n, count, size, o = op.get()] {
    if (g->local() || n == 0) return;  // a sum or average over one rank is the value itself
    if (detail::shm_allreduce(*g, *o, data, r)) return;  // ranks on one node: comm/detail/shm.h
    if (t == DType::kF32 || t == DType::kI32) {
      ZS_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data.raw(), count, mpi_type(t), MPI_SUM, g->comm), "{}", o->describe());
      if (r == ReduceOp::kAverage) scale(data.data<float>(), n, size);
      return;
    }
    // 16-bit: the values travel as they are, summed in fp32 per block (Note [16-bit reductions]).
    const auto shards = memory::partition(n, size);
    Counts c = int_counts(*o, counts_of(*o, shards));
    const size_t displ = static_cast<size_t>(c.displs[static_cast<size_t>(g->rank)]);
    char* base = static_cast<char*>(data.raw());
    reduce_scatter_16bit(*g, *o, base, base + displ * memory::dtype_size(t), t, c, r);
    ZS_MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, base, c.counts.data(), c.displs.data(), mpi_type(t),
                                g->comm),
                 "{}", o->describe());
  };
  return op;
}
}  // namespace

void Group::allreduce(const Tensor& data, ReduceOp op) const { state_->runtime->run(allreduce_op(state_, data, op)); }
Work Group::allreduce_async(const Tensor& data, ReduceOp op) const {
  return state_->runtime->submit(allreduce_op(state_, data, op));
}

// ---- reduce-scatter ----

namespace {
std::shared_ptr<Op> reduce_scatter_op(const std::shared_ptr<detail::GroupState>& g, const memory::Tensor& input,
                                      const memory::Tensor& output, std::vector<size_t> counts, ReduceOp r) {
  const DType t = input.dtype();
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  auto op = make_op(g, OpCode::kReduceScatter, t, static_cast<int64_t>(hash_counts(counts)), 0,
                    fmt::format("{}, {} elements, {} counts, {}", memory::dtype_name(t), input.numel(),
                                fmt::join(counts, "/"), reduce_name(r)));
  check_tensor(*op, input, "input");
  check_tensor(*op, output, "output");
  check_reduce(*op, t, r);
  if (counts.size() != static_cast<size_t>(g->size)) fail(*op, fmt::format("got {} counts for a group of {} ranks; pass one count per rank", counts.size(), g->size));
  if (total != static_cast<size_t>(input.numel())) fail(*op, fmt::format("the counts sum to {} but the input has {} elements", total, input.numel()));
  const size_t own = counts[static_cast<size_t>(g->rank)];
  if (static_cast<size_t>(output.numel()) != own) fail(*op, fmt::format("the output has {} elements but this rank's count is {}", output.numel(), own));
  if (output.dtype() != t) fail(*op, fmt::format("output dtype {} differs from input dtype {}", memory::dtype_name(output.dtype()), memory::dtype_name(t)));
  Counts c = int_counts(*op, counts);
  count_block_bytes(*op, total, own, memory::dtype_size(t));  // Note [16-bit reductions]
  op->arena = detail::arena_vote(*g, input, total * memory::dtype_size(t));  // Note [Direct collectives]
  op->body = [g = g.get(), input, output, r, t, own, c = std::move(c), equal = all_equal(counts), o = op.get()] {
    const size_t es = memory::dtype_size(t);
    const size_t displ = static_cast<size_t>(c.displs[static_cast<size_t>(g->rank)]);
    char* in = static_cast<char*>(input.raw());
    char* out = static_cast<char*>(output.raw());
    if (g->local()) {
      if (in != out && own > 0) std::memmove(out, in, own * es);
      return;
    }
    if (detail::shm_reduce_scatter(*g, *o, input, output, c.counts, c.displs, r)) return;  // comm/detail/shm.h
    auto reduce = [&](const void* send, void* recv, MPI_Datatype type) {
      if (equal) {
        ZS_MPI_CHECK(MPI_Reduce_scatter_block(send, recv, c.counts[0], type, MPI_SUM, g->comm), "{}", o->describe());
      } else {
        ZS_MPI_CHECK(MPI_Reduce_scatter(send, recv, c.counts.data(), type, MPI_SUM, g->comm), "{}", o->describe());
      }
    };
    if (t == DType::kF32 || t == DType::kI32) {
      if (out == in + displ * es) {  // in place: MPI leaves the result at the start of the buffer
        reduce(MPI_IN_PLACE, in, mpi_type(t));
        if (displ > 0 && own > 0) std::memmove(out, in, own * es);
      } else {
        reduce(in, out, mpi_type(t));
      }
      if (r == ReduceOp::kAverage) scale(output.data<float>(), own, g->size);
      return;
    }
    reduce_scatter_16bit(*g, *o, in, out, t, c, r);  // Note [16-bit reductions]
  };
  return op;
}
}  // namespace

void Group::reduce_scatter(const Tensor& input, const Tensor& output, std::span<const size_t> counts, ReduceOp op) const {
  state_->runtime->run(reduce_scatter_op(state_, input, output, {counts.begin(), counts.end()}, op));
}
void Group::reduce_scatter(const Tensor& input, const Tensor& output, std::span<const ShardRange> shards, ReduceOp op) const {
  auto probe = make_op(state_, OpCode::kReduceScatter, input.dtype(), 0, 0, "shards");
  state_->runtime->run(reduce_scatter_op(state_, input, output, counts_of(*probe, shards), op));
}
Work Group::reduce_scatter_async(const Tensor& input, const Tensor& output, std::span<const size_t> counts, ReduceOp op) const {
  return state_->runtime->submit(reduce_scatter_op(state_, input, output, {counts.begin(), counts.end()}, op));
}
Work Group::reduce_scatter_async(const Tensor& input, const Tensor& output, std::span<const ShardRange> shards, ReduceOp op) const {
  auto probe = make_op(state_, OpCode::kReduceScatter, input.dtype(), 0, 0, "shards");
  return state_->runtime->submit(reduce_scatter_op(state_, input, output, counts_of(*probe, shards), op));
}

// ---- allgather(v) ----

namespace {
std::shared_ptr<Op> allgatherv_op(const std::shared_ptr<detail::GroupState>& g, const memory::Tensor& input,
                                  const memory::Tensor& output, std::vector<size_t> counts, bool uneven_api) {
  const DType t = input.dtype();
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  const OpCode code = uneven_api ? OpCode::kAllgatherv : OpCode::kAllgather;
  // allgather's counts are all input.numel(): its size, readable in a mismatch's message.
  auto op = make_op(g, code, t, uneven_api ? static_cast<int64_t>(hash_counts(counts)) : input.numel(), 0,
                    uneven_api ? fmt::format("{}, {} counts", memory::dtype_name(t), fmt::join(counts, "/"))
                               : fmt::format("{}, {} elements per rank", memory::dtype_name(t), input.numel()));
  check_tensor(*op, input, "input");
  check_tensor(*op, output, "output");
  if (counts.size() != static_cast<size_t>(g->size)) fail(*op, fmt::format("got {} counts for a group of {} ranks; pass one count per rank", counts.size(), g->size));
  const size_t own = counts[static_cast<size_t>(g->rank)];
  if (static_cast<size_t>(input.numel()) != own) fail(*op, fmt::format("the input has {} elements but this rank's count is {}", input.numel(), own));
  if (static_cast<size_t>(output.numel()) != total) fail(*op, fmt::format("the output has {} elements but the counts sum to {}", output.numel(), total));
  if (output.dtype() != t) fail(*op, fmt::format("output dtype {} differs from input dtype {}", memory::dtype_name(output.dtype()), memory::dtype_name(t)));
  Counts c = int_counts(*op, counts);
  count_block_bytes(*op, total, own, memory::dtype_size(t));
  {  // Note [Direct collectives]: an input overlapping the output other than exactly in place would be
     // moved while the peers read it, so that rank votes no arena (every rank then stages).
    const size_t es = memory::dtype_size(t);
    const auto* in = static_cast<const char*>(input.raw());
    const auto* own_out = static_cast<const char*>(output.raw()) + static_cast<size_t>(c.displs[static_cast<size_t>(g->rank)]) * es;
    const bool shifted = in != own_out && in < own_out + own * es && own_out < in + own * es;
    op->arena = shifted ? 0 : detail::arena_vote(*g, input, own * es);
  }
  op->body = [g = g.get(), input, output, t, own, c = std::move(c), equal = all_equal(counts), o = op.get()] {
    const size_t es = memory::dtype_size(t);
    const size_t displ = static_cast<size_t>(c.displs[static_cast<size_t>(g->rank)]);
    char* in = static_cast<char*>(input.raw());
    char* out = static_cast<char*>(output.raw());
    const bool in_place = in == out + displ * es;
    if (g->local()) {
      if (!in_place && own > 0) std::memmove(out, in, own * es);
      return;
    }
    if (detail::shm_allgatherv(*g, *o, input, output, c.counts, c.displs)) return;  // comm/detail/shm.h
    const void* send = in_place ? MPI_IN_PLACE : in;
    const MPI_Datatype type = mpi_type(t);
    if (equal) {
      ZS_MPI_CHECK(MPI_Allgather(send, c.counts[0], type, out, c.counts[0], type, g->comm), "{}", o->describe());
    } else {
      ZS_MPI_CHECK(MPI_Allgatherv(send, static_cast<int>(own), type, out, c.counts.data(), c.displs.data(), type, g->comm),
                   "{}", o->describe());
    }
  };
  return op;
}

std::vector<size_t> equal_counts(const memory::Tensor& input, int size) {
  return std::vector<size_t>(static_cast<size_t>(size), static_cast<size_t>(input.numel()));
}
}  // namespace

void Group::allgather(const Tensor& input, const Tensor& output) const {
  state_->runtime->run(allgatherv_op(state_, input, output, equal_counts(input, size()), false));
}
Work Group::allgather_async(const Tensor& input, const Tensor& output) const {
  return state_->runtime->submit(allgatherv_op(state_, input, output, equal_counts(input, size()), false));
}
void Group::allgatherv(const Tensor& input, const Tensor& output, std::span<const size_t> counts) const {
  state_->runtime->run(allgatherv_op(state_, input, output, {counts.begin(), counts.end()}, true));
}
void Group::allgatherv(const Tensor& input, const Tensor& output, std::span<const ShardRange> shards) const {
  auto probe = make_op(state_, OpCode::kAllgatherv, input.dtype(), 0, 0, "shards");
  state_->runtime->run(allgatherv_op(state_, input, output, counts_of(*probe, shards), true));
}
Work Group::allgatherv_async(const Tensor& input, const Tensor& output, std::span<const size_t> counts) const {
  return state_->runtime->submit(allgatherv_op(state_, input, output, {counts.begin(), counts.end()}, true));
}
Work Group::allgatherv_async(const Tensor& input, const Tensor& output, std::span<const ShardRange> shards) const {
  auto probe = make_op(state_, OpCode::kAllgatherv, input.dtype(), 0, 0, "shards");
  return state_->runtime->submit(allgatherv_op(state_, input, output, counts_of(*probe, shards), true));
}

// ---- broadcast ----

namespace {
std::shared_ptr<Op> broadcast_op(const std::shared_ptr<detail::GroupState>& g, const memory::Tensor& data, int root) {
  const DType t = data.dtype();
  const size_t n = static_cast<size_t>(data.numel());
  auto op = make_op(g, OpCode::kBroadcast, t, static_cast<int64_t>(n), root,
                    fmt::format("{}, {} elements, root {}", memory::dtype_name(t), n, root));
  check_tensor(*op, data, "data");
  if (root < 0 || root >= g->size) fail(*op, fmt::format("root {} is outside the group of {} ranks", root, g->size));
  const int count = to_int(*op, n);
  const uint64_t bytes = n * memory::dtype_size(t);
  const int chain_pos = (g->rank - root + g->size) % g->size;  // position in the pipeline chain from root
  op->bytes_sent = chain_pos < g->size - 1 ? bytes : 0;
  op->bytes_received = chain_pos > 0 ? bytes : 0;
  op->body = [g = g.get(), data, t, count, root, o = op.get()] {
    if (g->local() || count == 0) return;
    ZS_MPI_CHECK(MPI_Bcast(data.raw(), count, mpi_type(t), root, g->comm), "{}", o->describe());
  };
  return op;
}
}  // namespace

void Group::broadcast(const Tensor& data, int root) const { state_->runtime->run(broadcast_op(state_, data, root)); }
Work Group::broadcast_async(const Tensor& data, int root) const {
  return state_->runtime->submit(broadcast_op(state_, data, root));
}

// ---- all-to-all(v) ----

namespace {
// Note [alltoallv counts]: MPI_Alltoallv reports a receive count smaller than the matching send count
// as a truncation error on the receiving rank only, and a larger one not at all (the tail of the
// output is left as it was). So before the data moves, every rank gathers every rank's send and receive
// counts (2 * size int32 each, one MPI_Allgather after the handshake, so it cannot hang) and checks the
// whole matrix: every rank reaches the same verdict and a mismatch throws CommError on all of them,
// naming the first pair, with no data moved.
void check_alltoallv_counts(const Op& op, MPI_Comm comm, int rank, int size, const std::vector<int>& send,
                            const std::vector<int>& recv) {
  const size_t n = static_cast<size_t>(size);
  std::vector<int32_t> mine(2 * n), all(2 * n * n);
  std::copy(send.begin(), send.end(), mine.begin());
  std::copy(recv.begin(), recv.end(), mine.begin() + static_cast<std::ptrdiff_t>(n));
  ZS_MPI_CHECK(MPI_Allgather(mine.data(), 2 * size, MPI_INT32_T, all.data(), 2 * size, MPI_INT32_T, comm),
               "{}: exchanging the counts", op.describe());
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      const int32_t sent = all[i * 2 * n + j], expected = all[j * 2 * n + n + i];
      if (sent != expected) {
        fail(op, fmt::format("mismatched counts: rank {} sends {} elements to rank {}, which expects {} from it "
                             "(this is rank {}); recv_counts[i] on rank j must equal send_counts[j] on rank i "
                             "(exchange the counts first, e.g. with alltoall)",
                             i, sent, j, expected, rank));
      }
    }
  }
}

// One side of an alltoallv: a contiguous tensor with per-rank counts (`whole` defined), or per-rank
// piece lists (Group::alltoallv with pieces). `keep` holds the tensors alive until the op has run.
struct Side {
  memory::Tensor whole;
  std::vector<detail::Block> blocks;
  std::vector<memory::Tensor> keep;
};

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
    fail(*op, fmt::format("got {} send and {} receive counts for a group of {} ranks; pass one count per rank", send.size(), recv.size(), g->size));
  Counts s = int_counts(*op, send);
  Counts r = int_counts(*op, recv);
  const size_t es = memory::dtype_size(t);
  if (in.whole.defined()) in = contiguous_side(in.whole, s, es);
  if (out.whole.defined()) out = contiguous_side(out.whole, r, es);
  const size_t me = static_cast<size_t>(g->rank);
  op->bytes_sent = (s.total - send[me]) * es;
  op->bytes_received = (r.total - recv[me]) * es;
  op->body = [g = g.get(), t, es, s = std::move(s), r = std::move(r), in = std::move(in), out = std::move(out), uneven_api,
              check_counts, o = op.get()] {
    const size_t me = static_cast<size_t>(g->rank);
    if (g->local()) {
      // memmove: the contiguous form may pass one tensor as input and output.
      detail::copy_block(in.blocks[me], out.blocks[me], static_cast<size_t>(s.counts[me]) * es,
                         [](void* d, const void* from, size_t n) { std::memmove(d, from, n); });
      return;
    }
    if (uneven_api && check_counts) check_alltoallv_counts(*o, g->comm, g->rank, g->size, s.counts, r.counts);
    if (detail::shm_alltoallv(*g, *o, in.blocks, out.blocks, r.total * es >= detail::kShmStreamMinBytes)) return;  // comm/detail/shm.h
    // MPI's: pieces packed into (and unpacked from) a contiguous buffer; the contiguous form as it is.
    std::vector<unsigned char> packed_in, packed_out;
    const void* send_buf = in.whole.defined() ? in.whole.raw() : nullptr;
    void* recv_buf = out.whole.defined() ? out.whole.raw() : nullptr;
    if (send_buf == nullptr) {
      packed_in.resize(s.total * es);
      for (size_t j = 0; j < in.blocks.size(); ++j)
        detail::copy_from_block(in.blocks[j], 0, static_cast<size_t>(s.counts[j]) * es, packed_in.data() + static_cast<size_t>(s.displs[j]) * es);
      send_buf = packed_in.data();
    }
    if (recv_buf == nullptr) {
      packed_out.resize(r.total * es);
      recv_buf = packed_out.data();
    }
    const MPI_Datatype type = mpi_type(t);
    if (!uneven_api) {
      ZS_MPI_CHECK(MPI_Alltoall(send_buf, s.counts[0], type, recv_buf, r.counts[0], type, g->comm), "{}", o->describe());
    } else {
      ZS_MPI_CHECK(MPI_Alltoallv(send_buf, s.counts.data(), s.displs.data(), type, recv_buf, r.counts.data(),
                                 r.displs.data(), type, g->comm),
                   "{}", o->describe());
    }
    if (!packed_out.empty()) {
      for (size_t j = 0; j < out.blocks.size(); ++j)
        detail::copy_to_block(out.blocks[j], 0, static_cast<size_t>(r.counts[j]) * es, packed_out.data() + static_cast<size_t>(r.displs[j]) * es);
    }
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
  if (output.dtype() != t) fail(*probe, fmt::format("output dtype {} differs from input dtype {}", memory::dtype_name(output.dtype()), memory::dtype_name(t)));
  const size_t ns = std::accumulate(send.begin(), send.end(), size_t{0});
  const size_t nr = std::accumulate(recv.begin(), recv.end(), size_t{0});
  if (ns != static_cast<size_t>(input.numel())) fail(*probe, fmt::format("the send counts sum to {} but the input has {} elements", ns, input.numel()));
  if (nr != static_cast<size_t>(output.numel())) fail(*probe, fmt::format("the receive counts sum to {} but the output has {} elements", nr, output.numel()));
  return alltoallv_op(g, t, Side{input, {}, {}}, std::move(send), Side{output, {}, {}}, std::move(recv), uneven_api,
                      check_counts);
}

// The piece form: per-rank lists of contiguous tensors of one dtype.
std::shared_ptr<Op> alltoallv_pieces_op(const std::shared_ptr<detail::GroupState>& g,
                                        std::span<const std::vector<memory::Tensor>> send,
                                        std::span<const std::vector<memory::Tensor>> recv, bool check_counts) {
  auto probe = make_op(g, OpCode::kAlltoallv, DType::kF32, 0, 0, "pieces");
  if (send.size() != static_cast<size_t>(g->size) || recv.size() != static_cast<size_t>(g->size))
    fail(*probe, fmt::format("got {} send and {} receive blocks for a group of {} ranks; pass one piece list per rank", send.size(), recv.size(), g->size));
  DType t = DType::kF32;
  bool typed = false;
  auto side = [&](std::span<const std::vector<memory::Tensor>> lists, std::vector<size_t>& counts, const char* role) {
    Side sd;
    for (const auto& list : lists) {
      detail::Block block;
      size_t n = 0;
      for (const memory::Tensor& p : list) {
        check_tensor(*probe, p, role);
        if (typed && p.dtype() != t) fail(*probe, fmt::format("a {} piece is {} but another is {}; pass one dtype", role, memory::dtype_name(p.dtype()), memory::dtype_name(t)));
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
    fail(*probe, fmt::format("input and output need the same numel, divisible by the group size {}; use alltoallv for uneven blocks", size));
  }
  std::vector<size_t> blocks(size, n / size);
  return alltoallv_op(g, input, blocks, output, blocks, false);
}

// Note [Counts in the handshake] (comm/detail/runtime.h): every rank's whole send vector rides on the
// handshake (an allgather of size * w values each), and each rank keeps its column. Past kMaxGathered
// values per rank the allgather would outgrow an alltoall, so the body runs MPI_Alltoall instead.
// Root -1 marks it apart from a plain alltoall of the same size.
constexpr size_t kMaxGathered = 1024;

std::shared_ptr<Op> exchange_counts_op(const std::shared_ptr<detail::GroupState>& g, std::span<const int64_t> send,
                                       std::span<int64_t> recv) {
  const size_t size = static_cast<size_t>(g->size), w = send.size() / size;
  auto op = make_op(g, OpCode::kAlltoall, DType::kI32, static_cast<int64_t>(w), -1,
                    fmt::format("counts, {} int64 per rank", w));
  if (send.size() != w * size || recv.size() != send.size())
    fail(*op, fmt::format("send ({}) and recv ({}) need size() = {} blocks of the same width", send.size(), recv.size(), size));
  const bool in_handshake = send.size() <= kMaxGathered;
  if (in_handshake && !g->local()) op->gather.assign(send.begin(), send.end());
  op->agrees_next = true;
  op->bytes_sent = op->bytes_received = (size - 1) * w * sizeof(int64_t);
  const size_t me = static_cast<size_t>(g->rank);
  op->body = [g = g.get(), send, recv, w, me, in_handshake, o = op.get()] {
    if (g->local()) {
      std::copy(send.begin(), send.end(), recv.begin());
    } else if (in_handshake) {  // rank q's block for this rank: block me of its whole vector
      for (size_t q = 0; q < static_cast<size_t>(g->size); ++q)
        std::copy_n(o->gathered.begin() + static_cast<std::ptrdiff_t>((q * static_cast<size_t>(g->size) + me) * w), w,
                    recv.begin() + static_cast<std::ptrdiff_t>(q * w));
    } else {
      ZS_MPI_CHECK(MPI_Alltoall(send.data(), to_int(*o, w), MPI_INT64_T, recv.data(), to_int(*o, w), MPI_INT64_T,
                                g->comm),
                   "{}", o->describe());
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
