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
    Tensor send = Tensor::empty({E}, DType::kI32);
    Tensor recv = Tensor::empty({E}, DType::kI32);
    for (int e = 0; e < E; ++e) send.data<int32_t>()[e] = static_cast<int32_t>(rows_per_expert[static_cast<size_t>(e)]);
    ep->alltoall(send, recv);
    plan.recv_rows.resize(static_cast<size_t>(E));
    for (int i = 0; i < E; ++i) plan.recv_rows[static_cast<size_t>(i)] = recv.data<int32_t>()[i];
    if (!ep->is_mpi()) {
      // A simulated group (the memory estimator) receives nothing valid: assume every rank sends this
      // rank's experts what this rank sends them, the balanced case.
      for (int q = 0; q < P; ++q)
        for (int l = 0; l < L; ++l)
          plan.recv_rows[static_cast<size_t>(q * L + l)] = plan.send_rows[static_cast<size_t>(ep->rank() * L + l)];
    }
  }
  // Send order: local slot l major, then destination rank p (dispatch.h).
  plan.send_offset.assign(static_cast<size_t>(E), 0);
  int64_t at = 0;
  for (int l = 0; l < L; ++l) {
    for (int p = 0; p < P; ++p) {
      plan.send_offset[static_cast<size_t>(p * L + l)] = at;
      at += plan.send_rows[static_cast<size_t>(p * L + l)];
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

// Note [one exchange per local expert]
// With L experts per rank, one alltoallv would deliver each source's rows for all L experts as one
// block, and the rows of expert l would then be copied out of P blocks into its own input (and the
// outputs packed back the same way): a copy of every byte received and sent, which costs more than
// the exchange's fixed cost from about 1 MiB (benchmarks/moe_alltoall_bench, --experts-per-rank 2).
// Instead the send order is slot-major (dispatch.h) and slot l's rows go in an alltoallv of their
// own, straight into expert l's input; the outputs return the same way into slot l's rows. The
// price is L - 1 more collectives (a handshake and a round each) per exchange, which only matters
// for many local experts with little data each.

namespace {
// Element counts of local slot l to (or from) every rank.
std::vector<size_t> slot_counts(const std::vector<int64_t>& rows, int P, int L, int l, int64_t d) {
  std::vector<size_t> c(static_cast<size_t>(P));
  for (int p = 0; p < P; ++p) c[static_cast<size_t>(p)] = static_cast<size_t>(rows[static_cast<size_t>(p * L + l)] * d);
  return c;
}
int64_t slot_rows(const ExchangePlan& plan, int l) {
  int64_t n = 0;
  for (int p = 0; p < plan.ep_size; ++p) n += plan.send_rows[static_cast<size_t>(p * plan.local_experts + l)];
  return n;
}
}  // namespace

std::vector<Tensor> to_experts(nn::Context& ctx, const comm::Group* ep, const ExchangePlan& plan, const Tensor& rows,
                               nn::MemoryUse use) {
  const int P = plan.ep_size, L = plan.local_experts;
  const int64_t d = plan.features;
  ZS_ASSERT(rows.numel() == plan.rows_sent() * d, "to_experts: {} elements for {} rows of {}", rows.numel(),
            plan.rows_sent(), d);
  std::vector<Tensor> out;
  const Tensor all = rows.view({plan.rows_sent(), d});
  int64_t at = 0;
  for (int l = 0; l < L; ++l) {
    const int64_t n = slot_rows(plan, l);
    const Tensor send = all.slice(0, at, at + n);
    at += n;
    if (P == 1) {  // rows are already grouped by expert: views, no copy
      out.push_back(send);
      continue;
    }
    Tensor in = ctx.allocate({plan.expert_rows(l), d}, DType::kF32, use);
    ep->alltoallv(send.flatten(), slot_counts(plan.send_rows, P, L, l, d), in.flatten(),
                  slot_counts(plan.recv_rows, P, L, l, d), comm::Group::CountCheck::kSkip);
    out.push_back(std::move(in));
  }
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
  if (P == 1 && L == 1) return outputs[0];  // already the rows in send order
  Tensor back = ctx.allocate({plan.rows_sent(), d}, DType::kF32, use);
  int64_t at = 0;
  for (int l = 0; l < L; ++l) {
    const int64_t n = slot_rows(plan, l);
    const Tensor dst = back.slice(0, at, at + n);
    at += n;
    const Tensor& y = outputs[static_cast<size_t>(l)];
    if (P == 1) {
      if (n > 0) std::memcpy(dst.data<float>(), y.data<float>(), static_cast<size_t>(n * d) * sizeof(float));
      continue;
    }
    ep->alltoallv(y.flatten(), slot_counts(plan.recv_rows, P, L, l, d), dst.flatten(),
                  slot_counts(plan.send_rows, P, L, l, d), comm::Group::CountCheck::kSkip);
  }
  return back;
}

}  // namespace zs::moe
