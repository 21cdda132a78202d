#include "moe/dispatch.h"

#include <cstring>
#include <numeric>

#include "core/errors.h"

namespace zs::moe {

using memory::DType;
using memory::Tensor;

int64_t ExchangePlan::rows_sent() const { return std::accumulate(send_rows.begin(), send_rows.end(), int64_t{0}); }
int64_t ExchangePlan::rows_received() const {
  return std::accumulate(recv_rows.begin(), recv_rows.end(), int64_t{0});
}
int64_t ExchangePlan::expert_rows(int l) const {
  int64_t n = 0;
  for (int q = 0; q < ep_size; ++q) n += recv_rows[static_cast<size_t>(q * local_experts + l)];
  return n;
}

namespace {
bool exchanges(const comm::Group* ep) { return ep != nullptr && ep->size() > 1; }
}  // namespace

ExchangePlan plan_exchange(const comm::Group* ep, std::span<const int64_t> rows_per_expert, int64_t features) {
  ExchangePlan plan;
  const int E = static_cast<int>(rows_per_expert.size());
  plan.ep_size = exchanges(ep) ? ep->size() : 1;
  ZS_ASSERT(E % plan.ep_size == 0, "{} experts over an expert-parallel group of {}", E, plan.ep_size);
  plan.local_experts = E / plan.ep_size;
  plan.features = features;
  plan.send_rows.assign(rows_per_expert.begin(), rows_per_expert.end());
  const int P = plan.ep_size, L = plan.local_experts;
  if (P == 1) {
    plan.recv_rows = plan.send_rows;
  } else {
    // Counts first (see the header): rank q's block p of E/P counts lands as block q on rank p.
    // The counts ride on the handshake (Group::exchange_counts): one message round before the data.
    plan.recv_rows.assign(static_cast<size_t>(E), 0);
    ep->exchange_counts(plan.send_rows, plan.recv_rows);
    if (!ep->is_mpi()) {
      // A simulated group (the memory estimator) receives nothing valid: assume every rank sends this
      // rank's experts what this rank sends them, the balanced case.
      for (int q = 0; q < P; ++q)
        for (int l = 0; l < L; ++l)
          plan.recv_rows[static_cast<size_t>(q * L + l)] = plan.send_rows[static_cast<size_t>(ep->rank() * L + l)];
    }
  }
  plan.send_counts.assign(static_cast<size_t>(P), 0);
  plan.recv_counts.assign(static_cast<size_t>(P), 0);
  for (int p = 0; p < P; ++p) {
    for (int l = 0; l < L; ++l) {
      plan.send_counts[static_cast<size_t>(p)] += static_cast<size_t>(plan.send_rows[static_cast<size_t>(p * L + l)] * features);
      plan.recv_counts[static_cast<size_t>(p)] += static_cast<size_t>(plan.recv_rows[static_cast<size_t>(p * L + l)] * features);
    }
  }
  return plan;
}

std::vector<Tensor> to_experts(nn::Context& ctx, const comm::Group* ep, const ExchangePlan& plan, const Tensor& rows,
                               nn::MemoryUse use) {
  const int P = plan.ep_size, L = plan.local_experts;
  const int64_t d = plan.features;
  ZS_ASSERT(rows.numel() == plan.rows_sent() * d, "to_experts: {} elements for {} rows of {}", rows.numel(),
            plan.rows_sent(), d);
  std::vector<Tensor> out;
  if (P == 1) {  // rows are already grouped by expert: views, no copy
    int64_t at = 0;
    for (int l = 0; l < L; ++l) {
      const int64_t n = plan.expert_rows(l);
      out.push_back(rows.view({plan.rows_sent(), d}).slice(0, at, at + n));
      at += n;
    }
    return out;
  }
  // Right after plan_exchange's count exchange (the MoE layer allocates and nothing else in between):
  // no handshake of its own (Group::CountCheck::kExchanged).
  if (L == 1) {  // one local expert: the received rows are its input as they are
    Tensor received = ctx.allocate({plan.rows_received(), d}, DType::kF32, use);
    ep->alltoallv(rows.flatten(), plan.send_counts, received.flatten(), plan.recv_counts,
                  comm::Group::CountCheck::kExchanged);
    return {received};
  }
  // Several: the rows from rank q for expert l land straight in expert l's input, after those of ranks
  // < q (Group::alltoallv with pieces: no regrouping copy on the shared-memory path).
  std::vector<std::vector<Tensor>> send(static_cast<size_t>(P)), recv(static_cast<size_t>(P));
  const Tensor flat = rows.flatten();
  for (int64_t q = 0, at = 0; q < P; ++q) {
    const int64_t n = static_cast<int64_t>(plan.send_counts[static_cast<size_t>(q)]);
    send[static_cast<size_t>(q)].push_back(flat.slice(0, at, at + n));
    at += n;
  }
  for (int l = 0; l < L; ++l) {
    out.push_back(ctx.allocate({plan.expert_rows(l), d}, DType::kF32, use));
    const Tensor into = out.back().flatten();
    for (int64_t q = 0, at = 0; q < P; ++q) {
      const int64_t n = plan.recv_rows[static_cast<size_t>(q * L + l)] * d;
      if (n > 0) recv[static_cast<size_t>(q)].push_back(into.slice(0, at, at + n));
      at += n;
    }
  }
  ep->alltoallv(send, recv, comm::Group::CountCheck::kExchanged);
  return out;
}

Tensor from_experts(nn::Context& ctx, const comm::Group* ep, const ExchangePlan& plan, std::span<const Tensor> outputs,
                    nn::MemoryUse use) {
  const int P = plan.ep_size, L = plan.local_experts;
  const int64_t d = plan.features;
  ZS_ASSERT(static_cast<int>(outputs.size()) == L, "from_experts: {} outputs for {} local experts", outputs.size(), L);
  for (int l = 0; l < L; ++l) {
    const Tensor& y = outputs[static_cast<size_t>(l)];
    ZS_MODEL_CHECK(y.numel() == plan.expert_rows(l) * d && y.dtype() == DType::kF32 && y.is_contiguous(),
                   "an MoE expert must map (n, {}) fp32 rows to (n, {}) contiguous fp32 rows; expert {} returned a {} "
                   "tensor {}",
                   d, d, l, memory::dtype_name(y.dtype()), memory::shape_string(y.shape()));
  }
  if (P == 1) {
    if (L == 1) return outputs[0];  // already in [q] order
    Tensor packed = ctx.allocate({plan.rows_received(), d}, DType::kF32, use);
    for (int64_t l = 0, at = 0; l < L; ++l) {
      const int64_t n = outputs[static_cast<size_t>(l)].numel();
      if (n > 0) std::memcpy(packed.data<float>() + at, outputs[static_cast<size_t>(l)].data<float>(), static_cast<size_t>(n) * sizeof(float));
      at += n;
    }
    return packed;
  }
  Tensor back = ctx.allocate({plan.rows_sent(), d}, DType::kF32, use);
  if (L == 1) {
    ep->alltoallv(outputs[0].flatten(), plan.recv_counts, back.flatten(), plan.send_counts, comm::Group::CountCheck::kSkip);
    return back;
  }
  // Rank q's block is expert 0's rows from q, then expert 1's, ...: pieces of the outputs, sent in
  // place (Group::alltoallv with pieces), into `back` in the order to_experts took them.
  std::vector<std::vector<Tensor>> send(static_cast<size_t>(P)), recv(static_cast<size_t>(P));
  std::vector<int64_t> taken(static_cast<size_t>(L), 0);
  for (int q = 0; q < P; ++q) {
    for (int l = 0; l < L; ++l) {
      const int64_t n = plan.recv_rows[static_cast<size_t>(q * L + l)] * d;
      const int64_t t0 = taken[static_cast<size_t>(l)];
      if (n > 0) send[static_cast<size_t>(q)].push_back(outputs[static_cast<size_t>(l)].flatten().slice(0, t0, t0 + n));
      taken[static_cast<size_t>(l)] += n;
    }
  }
  const Tensor flat = back.flatten();
  for (int64_t q = 0, at = 0; q < P; ++q) {
    const int64_t n = static_cast<int64_t>(plan.send_counts[static_cast<size_t>(q)]);
    recv[static_cast<size_t>(q)].push_back(flat.slice(0, at, at + n));
    at += n;
  }
  ep->alltoallv(send, recv, comm::Group::CountCheck::kSkip);
  return back;
}

}  // namespace zs::moe
