// Optimizer::step_parallel (optim/optimizer.h) on its own: how it cuts a chunk into pieces and how it
// advances each state pointer per StateSpec. A probe optimizer records the pieces it is handed (the
// real step_parallel, the real pool); every optimizer's own bit-for-bit agreement of step_parallel
// with step is tested beside its kernels (fused_adam_test, cadam_test).
#include "optim/optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <numeric>
#include <vector>

#include "core/errors.h"

namespace zs::optim {
namespace {

struct Piece {
  const float* master;
  size_t size;
  const float* grad;
  std::vector<void*> states;
  void* low;
};

class Probe final : public Optimizer {
 public:
  Probe(size_t alignment, std::vector<StateSpec> specs) : alignment_(alignment), specs_(std::move(specs)) {}
  std::string_view name() const override { return "Probe"; }
  std::span<const StateSpec> state_specs() const override { return specs_; }
  size_t alignment_elements() const override { return alignment_; }
  void step(const ParamChunk& chunk, const StepContext&) const override {
    std::lock_guard lock(mutex_);
    pieces_.push_back({chunk.master.data(), chunk.master.size(), chunk.grad.data(),
                       std::vector<void*>(chunk.states.begin(), chunk.states.end()), chunk.low_precision});
  }
  std::vector<Piece> pieces() const {
    std::vector<Piece> p = pieces_;
    std::sort(p.begin(), p.end(), [](const Piece& a, const Piece& b) { return a.master < b.master; });
    return p;
  }

 private:
  size_t alignment_;
  std::vector<StateSpec> specs_;
  mutable std::mutex mutex_;
  mutable std::vector<Piece> pieces_;
};

// Buffers of `elements` floats for master and grad, two state buffers and a 16-bit copy.
struct Chunk {
  std::vector<float> p, g;
  std::vector<char> s0, s1, low;
  void* states[2] = {};
  Chunk(size_t elements, size_t s0_bytes, size_t s1_bytes)
      : p(elements), g(elements), s0(s0_bytes), s1(s1_bytes), low(2 * elements) {}
  ParamChunk view(size_t skip, size_t n) {
    states[0] = s0.data();
    states[1] = s1.data();
    return {.master = std::span(p).subspan(skip, n), .grad = std::span<const float>(g).subspan(skip, n),
            .states = states, .low_precision = low.data()};
  }
};

// Pieces tile [0, n), each state pointer sits at the piece's offset converted by its spec.
void check_tiling(const Probe& probe, const ParamChunk& chunk, size_t expect_pieces, size_t cut_multiple,
                  size_t pad) {
  const std::vector<Piece> pieces = probe.pieces();
  ASSERT_EQ(pieces.size(), expect_pieces);
  size_t next = 0;
  for (const Piece& piece : pieces) {
    const auto off = static_cast<size_t>(piece.master - chunk.master.data());
    ASSERT_EQ(off, next) << "pieces must tile the chunk in order";
    if (off > 0) {
      ASSERT_EQ((off + pad) % cut_multiple, 0u) << "cut at " << off;
    }
    ASSERT_EQ(piece.grad, chunk.grad.data() + off);
    ASSERT_EQ(piece.low, static_cast<char*>(chunk.low_precision) + 2 * off);
    for (size_t k = 0; k < probe.state_specs().size(); ++k) {
      const StateSpec& spec = probe.state_specs()[k];
      ASSERT_EQ(piece.states[k], static_cast<char*>(chunk.states[k]) + off / spec.elements_per_value * spec.value_bytes)
          << "state " << spec.name << " of the piece at " << off;
    }
    next = off + piece.size;
  }
  EXPECT_EQ(next, chunk.master.size());
}

TEST(StepParallel, BlockStatesAreCutAtWholeBlocksFromTheChunkStart) {
  // lcm(16, 48) = 48: cuts are multiples of 48 elements from the chunk start even though master
  // starts one float past a cache line (alignment > 1 ignores master's lines).
  const size_t n = 100003;
  Chunk c(n + 1, n + 1, n);
  const ParamChunk chunk = c.view(1, n);
  for (int threads : {2, 3, 4}) {
    Probe probe(48, {{.name = "q", .value_bytes = 1}, {.name = "scale", .value_bytes = 4, .elements_per_value = 48}});
    probe.step_parallel(chunk, {}, threads);
    check_tiling(probe, chunk, static_cast<size_t>(threads), 48, 0);
  }
}

TEST(StepParallel, PerElementStatesAreCutAtMasterCacheLines) {
  const size_t n = 70001;
  Chunk c(n + 3, 4 * n, 2 * n);
  const ParamChunk chunk = c.view(3, n);
  const auto pad = (reinterpret_cast<uintptr_t>(chunk.master.data()) % 64) / sizeof(float);
  for (int threads : {2, 3}) {
    Probe probe(1, {{.name = "m"}, {.name = "h", .value_bytes = 2}});
    probe.step_parallel(chunk, {}, threads);
    check_tiling(probe, chunk, static_cast<size_t>(threads), 16, pad);
  }
}

TEST(StepParallel, SmallChunksAndOneThreadRunStepOnce) {
  Chunk c(1000, 1000, 128);
  const ParamChunk chunk = c.view(0, 1000);
  Probe probe(32, {{.name = "q", .value_bytes = 1}, {.name = "scale", .value_bytes = 4, .elements_per_value = 32}});
  probe.step_parallel(chunk, {}, 4);  // 1000 elements: below the grain
  probe.step_parallel(c.view(0, 0), {}, 4);
  EXPECT_EQ(probe.pieces().size(), 2u);
  EXPECT_EQ(probe.state_bytes(1000), 1000u + 32u * 4u);
  EXPECT_DOUBLE_EQ(probe.state_bytes_per_param(), 1.125);
}

TEST(StepParallel, BlockLargerThanAlignmentIsAnInternalError) {
  Chunk c(100, 100, 100);
  Probe probe(16, {{.name = "q", .value_bytes = 1}, {.name = "scale", .value_bytes = 4, .elements_per_value = 32}});
  EXPECT_THROW(probe.step_parallel(c.view(0, 100), {}, 2), InternalError);
}

}  // namespace
}  // namespace zs::optim
