#include "benchmarks/support/bench_group.h"

#include <algorithm>
#include <vector>

namespace zs::bench {

double slowest(const comm::Group& g, double v) {
  if (g.size() == 1) return v;
  // fp32 is plenty for seconds, and float is what every collective handles.
  std::vector<float> all(static_cast<size_t>(g.size()));
  float mine = static_cast<float>(v);
  g.allgather(memory::Tensor(&mine, memory::DType::kF32, {1}), memory::Tensor(all.data(), memory::DType::kF32, {g.size()}));
  return *std::max_element(all.begin(), all.end());
}

}  // namespace zs::bench
