#include "optim/optimizer.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <numeric>

#include "core/errors.h"
#include "core/parallel.h"

namespace zs::optim {
namespace {

constexpr size_t kMaxStates = 8;
constexpr int64_t kLineFloats = 64 / sizeof(float);
// Below about 16K elements per thread a wake-up costs more than the work it shares.
constexpr int64_t kGrainElements = 1024 * kLineFloats;

}  // namespace

size_t Optimizer::state_bytes(size_t elements) const {
  size_t total = 0;
  for (const StateSpec& spec : state_specs()) total += spec.bytes_for(elements);
  return total;
}

double Optimizer::state_bytes_per_param() const {
  constexpr size_t kElements = size_t{1} << 20;
  return static_cast<double>(state_bytes(kElements)) / static_cast<double>(kElements);
}

void Optimizer::accumulate_tensor_sums(const ParamChunk&, const StepContext&, std::span<double>) const {
  ZS_ASSERT(false, "{} is elementwise: call step(), not accumulate_tensor_sums()", name());
}

void Optimizer::apply_tensor_sums(const ParamChunk&, const StepContext&, std::span<const double>) const {
  ZS_ASSERT(false, "{} is elementwise: call step(), not apply_tensor_sums()", name());
}

void Optimizer::step_parallel(const ParamChunk& chunk, const StepContext& ctx, int threads) const {
  const int64_t n = static_cast<int64_t>(chunk.master.size());
  const std::span<const StateSpec> specs = state_specs();
  ZS_ASSERT(tensor_sums() == 0, "{} needs whole-tensor sums: pieces of a chunk cannot step alone", name());
  ZS_ASSERT(chunk.grad.size() == chunk.master.size() && chunk.states.size() == specs.size() &&
                specs.size() <= kMaxStates,
            "{} step_parallel chunk: {} params, {} grads, {} states ({} specs, at most {})", name(), n,
            chunk.grad.size(), chunk.states.size(), specs.size(), kMaxStates);
  const size_t align = alignment_elements();
  for (const StateSpec& spec : specs) {
    ZS_ASSERT(align >= 1 && spec.elements_per_value >= 1 && align % spec.elements_per_value == 0,
              "{}: state {} has {} elements per value, which does not divide alignment_elements() = {}", name(),
              spec.name, spec.elements_per_value, align);
  }
  // alignment 1: pieces start on master's cache lines, so two threads never write the same line of
  // master or of a state allocated with the same alignment; `pad` is how far master's first line
  // starts before element 0, and cuts are multiples of 16 in the index space shifted by it.
  // alignment > 1: cuts must keep blocks whole, and block boundaries are fixed relative to the chunk
  // start (which the engine aligns), so cuts are multiples of lcm(16, alignment) from element 0.
  int64_t unit = kLineFloats;
  int64_t pad = 0;
  if (align == 1) {
    const auto addr = reinterpret_cast<uintptr_t>(chunk.master.data());
    pad = static_cast<int64_t>((addr % 64) / sizeof(float));
  } else {
    unit = std::lcm(kLineFloats, static_cast<int64_t>(align));
  }
  const int64_t units = (n + pad + unit - 1) / unit;
  const int64_t grain = std::max<int64_t>(1, kGrainElements / unit);
  if (threads <= 1 || parallel_chunks(threads, units, grain) <= 1) {
    step(chunk, ctx);
    return;
  }
  const size_t low_size = memory::dtype_size(chunk.low_precision_dtype);
  parallel_for_threads(threads, units, grain, [&](int64_t u0, int64_t u1, int) {
    const int64_t b = std::max<int64_t>(0, u0 * unit - pad);
    const int64_t e = std::min<int64_t>(n, u1 * unit - pad);
    if (e <= b) return;
    const auto off = static_cast<size_t>(b), len = static_cast<size_t>(e - b);
    std::array<void*, kMaxStates> states{};
    for (size_t k = 0; k < specs.size(); ++k) {
      states[k] = static_cast<char*>(chunk.states[k]) + off / specs[k].elements_per_value * specs[k].value_bytes;
    }
    ParamChunk piece{.master = chunk.master.subspan(off, len),
                     .grad = chunk.grad.subspan(off, len),
                     .states = std::span<void* const>(states.data(), specs.size()),
                     .low_precision = chunk.low_precision == nullptr
                                          ? nullptr
                                          : static_cast<char*>(chunk.low_precision) + off * low_size,
                     .low_precision_dtype = chunk.low_precision_dtype,
                     .apply_weight_decay = chunk.apply_weight_decay};
    step(piece, ctx);
  });
}

}  // namespace zs::optim
