// Expert parallelism's data movement: token rows from the ranks of an expert-parallel (EP) group to
// the experts that live on them, and the experts' outputs back (DeepSpeed's two all-to-alls).
//
//   moe::ExchangePlan plan = moe::plan_exchange(ep, rows_per_expert, d);   // exchanges the counts
//   std::vector<Tensor> in = moe::to_experts(ctx, ep, plan, rows);         // one (n_l, d) per local expert
//   ... y_l = ctx.forward(expert_l, in[l]) ...
//   Tensor back = moe::from_experts(ctx, ep, plan, ys);                    // rows in `rows`' order
//
// Layout. E experts over an EP group of P ranks: rank p holds experts p*L .. p*L+L-1 (L = E / P),
// DeepSpeed's placement. This rank's `rows` (N, d) hold the rows for expert 0 first, then expert 1,
// ...: rows_per_expert[e] of them each (compact: no padding to capacity, so a dropped or missing token
// moves no bytes). Local expert l receives the rows of source rank 0 first, then rank 1, ...
//
// Counts first. plan_exchange exchanges the per-expert row counts (E per rank) before any data moves,
// so every rank knows how much it will receive: ranks that route different numbers of tokens, or none,
// never hang or mismatch (the alltoallvs then skip their own count check: the counts agree by
// construction). The counts ride on the collective handshake (Group::exchange_counts: one message
// round), and to_experts, called right after, skips its own handshake (CountCheck::kExchanged; Note
// [Counts in the handshake] in comm/detail/runtime.h). to_experts and from_experts each run one alltoallv over the
// EP group (with several local experts, its blocks given as pieces of the experts' own tensors: no
// regrouping copy where the transport writes them in place, comm/group.h) (the backward runs them again, with the same plan, for the gradients). Collective: every rank
// of the EP group calls these in the same order. ep == nullptr or a group of one moves rows locally; a
// simulated group (comm::Group::simulated, the memory estimator) plans as if every rank routed like this one.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "comm/group.h"
#include "memory/tensor.h"
#include "nn/context.h"

namespace zs::moe {

struct ExchangePlan {
  int ep_size = 1;
  int local_experts = 0;  // L
  int64_t features = 0;   // d
  std::vector<int64_t> send_rows;  // (E) rows this rank sends to each global expert
  std::vector<int64_t> recv_rows;  // (P * L) rows source rank q sends to local expert l, at q * L + l
  std::vector<size_t> send_counts;  // (P) elements sent to each rank (alltoallv)
  std::vector<size_t> recv_counts;  // (P) elements received from each rank
  int64_t rows_sent() const;
  int64_t rows_received() const;
  int64_t expert_rows(int l) const;  // rows local expert l processes
};

// Collective over `ep` (see above). rows_per_expert: E entries, E divisible by ep's size.
ExchangePlan plan_exchange(const comm::Group* ep, std::span<const int64_t> rows_per_expert, int64_t features);

// rows: (plan.rows_sent(), d) fp32, in global expert order. Returns L tensors (expert_rows(l), d),
// allocated from ctx as `use`.
std::vector<memory::Tensor> to_experts(nn::Context& ctx, const comm::Group* ep, const ExchangePlan& plan,
                                       const memory::Tensor& rows, nn::MemoryUse use);

// The inverse: L tensors (expert_rows(l), d) -> (plan.rows_sent(), d) in the order to_experts took them.
memory::Tensor from_experts(nn::Context& ctx, const comm::Group* ep, const ExchangePlan& plan,
                            std::span<const memory::Tensor> outputs, nn::MemoryUse use);

}  // namespace zs::moe
