#include "tools/moe_report.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "memory/tensor.h"

namespace zs::tools {

MoeRouting gather_routing(const moe::GptMoeModel& model, const comm::Group& dp) {
  const int experts = model.config().moe.num_experts;
  // [0, E): tokens routed to each expert; E: dropped; E + 1: routed choices; E + 2: l_aux. Sums of
  // counts are exact in fp32 below 2^24 per step, far above a step's tokens.
  std::vector<float> v(static_cast<size_t>(experts) + 3, 0.0f);
  for (const moe::MoE* layer : model.moe_layers()) {
    const moe::MoEStats& s = layer->stats();
    for (size_t e = 0; e < s.expert_counts.size() && e < static_cast<size_t>(experts); ++e) {
      v[e] += static_cast<float>(s.expert_counts[e]);
    }
    v[static_cast<size_t>(experts)] += static_cast<float>(s.dropped);
    v[static_cast<size_t>(experts) + 1] += static_cast<float>(s.tokens * layer->options().k);
    v[static_cast<size_t>(experts) + 2] += s.l_aux;
  }
  dp.allreduce(memory::Tensor::of(v), comm::ReduceOp::kSum);
  MoeRouting r;
  const auto counts = std::span<const float>(v).first(static_cast<size_t>(experts));
  r.expert_min = static_cast<int64_t>(*std::min_element(counts.begin(), counts.end()));
  r.expert_max = static_cast<int64_t>(*std::max_element(counts.begin(), counts.end()));
  const float routed = v[static_cast<size_t>(experts) + 1];
  r.dropped_fraction = routed > 0 ? v[static_cast<size_t>(experts)] / routed : 0.0;
  r.l_aux = v[static_cast<size_t>(experts) + 2] / dp.size();
  for (const comm::OpStats& op : dp.op_stats()) {
    if (op.name == "alltoall" || op.name == "alltoallv") r.alltoall_bytes += op.bytes_sent;
  }
  return r;
}

std::string routing_line(const MoeRouting& r) {
  return fmt::format("l_aux {:.4f} | dropped {:.1f}% | expert tokens min {} max {} | all-to-all {:.1f} MiB (rank 0)", r.l_aux,
                     100.0 * r.dropped_fraction, r.expert_min, r.expert_max,
                     static_cast<double>(r.alltoall_bytes) / (1024.0 * 1024.0));
}

void MoeSummary::record(const MoeRouting& r) {
  if (steps_ == 0) {
    min_ = r.expert_min;
    max_ = r.expert_max;
  }
  ++steps_;
  l_aux_sum_ += r.l_aux;
  dropped_sum_ += r.dropped_fraction;
  min_ = std::min(min_, r.expert_min);
  max_ = std::max(max_, r.expert_max);
  bytes_ = r.alltoall_bytes;
}

boost::json::object MoeSummary::json() const {
  boost::json::object o;
  const double n = steps_ > 0 ? static_cast<double>(steps_) : 1.0;
  o["steps_sampled"] = steps_;
  o["l_aux_mean"] = l_aux_sum_ / n;
  o["dropped_fraction_mean"] = dropped_sum_ / n;
  o["expert_tokens_min"] = min_;
  o["expert_tokens_max"] = max_;
  o["alltoall_bytes_rank0"] = bytes_;
  return o;
}

}  // namespace zs::tools
