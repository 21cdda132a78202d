#include "nn/flops.h"

#include <atomic>

namespace zs::nn {
namespace {
std::atomic<uint64_t> g_flops{0};
}  // namespace

uint64_t flops_performed() { return g_flops.load(std::memory_order_relaxed); }

void add_flops(uint64_t flops) { g_flops.fetch_add(flops, std::memory_order_relaxed); }

}  // namespace zs::nn
