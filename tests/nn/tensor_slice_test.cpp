// nn::TensorSlice (Note [tensor slices] in nn/parameter.h): a tensor-parallel shard's elements map to
// the full tensor's, so its initial values are the tp = 1 tensor's at the same places.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/errors.h"
#include "nn/parameter.h"

namespace zs::nn {
namespace {

// The full tensor's element that local element `i` of `slice` of a tensor of `full` shape holds,
// computed by coordinates (independently of for_each_full_run's run arithmetic).
uint64_t full_index_by_coordinates(const memory::Shape& full, const TensorSlice& slice, uint64_t i) {
  memory::Shape local = full;
  local[slice.dim] /= slice.parts;
  std::vector<int64_t> coord(local.size());
  for (int d = static_cast<int>(local.size()) - 1; d >= 0; --d) {
    coord[d] = static_cast<int64_t>(i % static_cast<uint64_t>(local[d]));
    i /= static_cast<uint64_t>(local[d]);
  }
  const int64_t block = local[slice.dim] / slice.stride;  // local rows per block
  const int64_t j = coord[slice.dim];
  coord[slice.dim] = (j / block) * block * slice.parts + slice.index * block + j % block;
  uint64_t f = 0;
  for (size_t d = 0; d < full.size(); ++d) f = f * static_cast<uint64_t>(full[d]) + static_cast<uint64_t>(coord[d]);
  return f;
}

struct Case {
  memory::Shape full;
  TensorSlice slice;
};

TEST(TensorSliceTest, RunsAndInitialValuesAreTheFullTensorsAtTheSamePlaces) {
  const std::vector<Case> cases = {
      {{12, 5}, {.dim = 0, .parts = 2, .index = 1}},             // column-parallel weight
      {{12, 5}, {.dim = 0, .parts = 2, .index = 0, .stride = 3}},  // fused qkv
      {{24}, {.dim = 0, .parts = 4, .index = 3, .stride = 3}},     // fused qkv bias
      {{6, 8}, {.dim = 1, .parts = 4, .index = 2}},              // row-parallel weight
      {{3, 8, 4}, {.dim = 1, .parts = 2, .index = 1, .stride = 2}},
      {{7, 3}, {}},                                               // whole
  };
  const uint64_t seed = 99;
  for (const Case& c : cases) {
    memory::Shape local = c.full;
    local[c.slice.dim] /= c.slice.parts;
    Parameter full("w", c.full, Init::normal(0.0f, 1.0f));
    full.set_full_name("blocks.0.w");
    Parameter shard("w", local, Init::normal(0.0f, 1.0f));
    shard.set_full_name("blocks.0.w");
    shard.set_tensor_slice(c.slice);
    ASSERT_EQ(shard.full_shape(), c.full);
    ASSERT_EQ(shard.full_numel(), full.numel());

    std::vector<float> whole(static_cast<size_t>(full.numel()));
    full.init().fill(whole, 0, seed, full.full_name());
    const auto n = static_cast<uint64_t>(shard.numel());
    // Every sub-range [first, first + count): the runs tile it in order, each run maps element by
    // element to the coordinates' answer, and the initial values match the full tensor's.
    for (uint64_t first = 0; first < n; first += 3) {
      for (uint64_t count : {uint64_t{1}, uint64_t{4}, n - first}) {
        if (first + count > n) continue;
        uint64_t next = first;
        shard.for_each_full_run(first, count, [&](uint64_t l, uint64_t f, uint64_t len) {
          ASSERT_EQ(l, next);
          ASSERT_GT(len, 0u);
          for (uint64_t k = 0; k < len; ++k) ASSERT_EQ(f + k, full_index_by_coordinates(c.full, c.slice, l + k));
          next = l + len;
        });
        EXPECT_EQ(next, first + count);
        std::vector<float> values(count);
        shard.init_values(values, first, seed);
        for (uint64_t k = 0; k < count; ++k) {
          ASSERT_EQ(values[k], whole[full_index_by_coordinates(c.full, c.slice, first + k)])
              << memory::shape_string(c.full) << " element " << first + k;
        }
      }
    }
  }
}

TEST(TensorSliceTest, ASliceThatDoesNotFitIsAModelError) {
  Parameter p("w", {6, 4}, Init::zeros());
  EXPECT_THROW(p.set_tensor_slice({.dim = 2, .parts = 2}), ModelError);
  EXPECT_THROW(p.set_tensor_slice({.dim = 0, .parts = 2, .index = 2}), ModelError);
  EXPECT_THROW(p.set_tensor_slice({.dim = 0, .parts = 2, .stride = 4}), ModelError);
  p.set_tensor_slice({.dim = 0, .parts = 2, .stride = 3});
  EXPECT_EQ(p.full_shape(), (memory::Shape{12, 4}));
}

}  // namespace
}  // namespace zs::nn
