// comm::Topology: every group's members against Megatron-LM's formulas (parallel_state.py,
// initialize_model_parallel), written out here independently of comm/topology.cpp, for every
// factorisation of the world size; and the validation errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "comm/comm.h"
#include "tests/support/mpi_test_env.h"

using namespace zs;
using memory::DType;
using memory::Tensor;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The world ranks of `g`'s members in group-rank order, learnt by an allgather over `g` itself.
std::vector<int> members(const comm::Group& g) {
  Tensor mine = Tensor::empty({1}, DType::kI32), all = Tensor::empty({g.size()}, DType::kI32);
  mine.data<int32_t>()[0] = test::world().rank();
  g.allgather(mine, all);
  return {all.data<int32_t>(), all.data<int32_t>() + g.size()};
}

// Megatron's lists of rank groups; the one containing `rank`.
using Groups = std::vector<std::vector<int>>;
std::vector<int> containing(const Groups& groups, int rank) {
  for (const auto& g : groups) {
    if (std::find(g.begin(), g.end(), rank) != g.end()) return g;
  }
  return {};
}

struct Expected {
  Groups tp, dp, pp, mp, ep, edp;
};

Expected megatron(int world, int tp, int pp, int ep) {
  Expected x;
  const int dp = world / (tp * pp);
  const int num_pp_groups = world / pp;
  // Data parallel: for each pipeline stage i, for each j < tp: range(i*num_pp_groups + j, (i+1)*num_pp_groups, tp).
  for (int i = 0; i < pp; ++i) {
    for (int j = 0; j < tp; ++j) {
      std::vector<int> g;
      for (int r = i * num_pp_groups + j; r < (i + 1) * num_pp_groups; r += tp) g.push_back(r);
      x.dp.push_back(g);
      // Expert groups inside this data-parallel group: consecutive blocks of ep, and members ep apart.
      for (int k = 0; k < dp / ep; ++k) x.ep.emplace_back(g.begin() + k * ep, g.begin() + (k + 1) * ep);
      for (int k = 0; k < ep; ++k) {
        std::vector<int> e;
        for (size_t q = static_cast<size_t>(k); q < g.size(); q += static_cast<size_t>(ep)) e.push_back(g[q]);
        x.edp.push_back(e);
      }
    }
  }
  // Model parallel: for each data-parallel index i, the i-th member of every dp group, sorted.
  for (int i = 0; i < dp; ++i) {
    std::vector<int> g;
    for (const auto& d : x.dp) g.push_back(d[static_cast<size_t>(i)]);
    std::sort(g.begin(), g.end());
    x.mp.push_back(g);
  }
  // Tensor parallel: range(i*tp, (i+1)*tp). Pipeline: range(i, world, num_pp_groups).
  for (int i = 0; i < world / tp; ++i) {
    std::vector<int> g;
    for (int r = i * tp; r < (i + 1) * tp; ++r) g.push_back(r);
    x.tp.push_back(g);
  }
  for (int i = 0; i < num_pp_groups; ++i) {
    std::vector<int> g;
    for (int r = i; r < world; r += num_pp_groups) g.push_back(r);
    x.pp.push_back(g);
  }
  return x;
}

TEST(Topology, GroupsMatchMegatronForEveryFactorisation) {
  const auto& world = test::world().group();
  const int n = world.size(), r = world.rank();
  int checked = 0;
  for (int tp = 1; tp <= n; ++tp) {
    for (int pp = 1; tp * pp <= n; ++pp) {
      if (n % (tp * pp) != 0) continue;
      const int dp = n / (tp * pp);
      for (int ep = 1; ep <= dp; ++ep) {
        if (dp % ep != 0) continue;
        comm::Topology topo(world, {.tensor_parallel_size = tp, .pipeline_parallel_size = pp, .expert_parallel_size = ep});
        const Expected x = megatron(n, tp, pp, ep);
        SCOPED_TRACE(topo.describe());
        EXPECT_EQ(members(topo.tensor_parallel()), containing(x.tp, r));
        EXPECT_EQ(members(topo.data_parallel()), containing(x.dp, r));
        EXPECT_EQ(members(topo.pipeline_parallel()), containing(x.pp, r));
        EXPECT_EQ(members(topo.model_parallel()), containing(x.mp, r));
        EXPECT_EQ(members(topo.expert_parallel()), containing(x.ep, r));
        EXPECT_EQ(members(topo.expert_data_parallel()), containing(x.edp, r));
        // The engine's single split gives the same group.
        const comm::Group edp = comm::Topology::make_expert_data_parallel(
            world, {.tensor_parallel_size = tp, .pipeline_parallel_size = pp, .expert_parallel_size = ep});
        EXPECT_EQ(members(edp), containing(x.edp, r));
        EXPECT_EQ(edp.name(), "edp");
        EXPECT_EQ(topo.data_parallel_size(), dp);
        EXPECT_EQ(topo.tensor_parallel().rank(), topo.tensor_rank());
        EXPECT_EQ(topo.data_parallel().rank(), topo.data_rank());
        EXPECT_EQ(topo.pipeline_parallel().rank(), topo.pipeline_rank());
        EXPECT_EQ(topo.tensor_parallel().name(), "tp");
        EXPECT_EQ(topo.data_parallel().name(), "dp");
        EXPECT_EQ(topo.pipeline_parallel().name(), "pp");
        EXPECT_EQ(topo.model_parallel().name(), "mp");
        EXPECT_EQ(topo.expert_parallel().name(), "ep");
        EXPECT_EQ(topo.expert_data_parallel().name(), "edp");
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 1);
}

// With tp = pp = 1 the expert groups are DeepSpeed's (World::split_groups), which the engine used.
TEST(Topology, ExpertGroupsEqualSplitGroups) {
  const auto& world = test::world().group();
  for (int e = 1; e <= world.size(); ++e) {
    if (world.size() % e != 0) continue;
    comm::Topology topo(world, {.expert_parallel_size = e});
    comm::ExpertGroups old = test::world().split_groups(e);
    EXPECT_EQ(members(topo.data_parallel()), members(old.dp));
    EXPECT_EQ(members(topo.expert_parallel()), members(old.ep));
    EXPECT_EQ(members(topo.expert_data_parallel()), members(old.edp));
  }
}

void expect_config_error(const comm::TopologyConfig& d, int world, const std::vector<std::string>& parts) {
  try {
    comm::Topology::validate(d, world);
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    for (const std::string& p : parts) EXPECT_TRUE(contains(e.what(), p)) << "'" << p << "' in " << e.what();
  }
}

TEST(Topology, ValidationNamesTheKeysAndTheWorldSize) {
  expect_config_error({.tensor_parallel_size = 0}, 4, {"model.tensor_parallel_size", "positive"});
  expect_config_error({.pipeline_parallel_size = -1}, 4, {"model.pipeline_parallel_size"});
  expect_config_error({.expert_parallel_size = 0}, 4, {"model.moe.ep_size"});
  expect_config_error({.tensor_parallel_size = 3}, 4,
                      {"model.tensor_parallel_size (3)", "model.pipeline_parallel_size (1)", "number of ranks (4)"});
  expect_config_error({.tensor_parallel_size = 2, .pipeline_parallel_size = 2}, 6, {"= 4", "ranks (6)"});
  expect_config_error({.tensor_parallel_size = 2, .expert_parallel_size = 4}, 4,
                      {"model.moe.ep_size: 4", "data-parallel size 2", "ranks 4"});
  EXPECT_NO_THROW(comm::Topology::validate({.tensor_parallel_size = 2, .pipeline_parallel_size = 2, .expert_parallel_size = 2}, 8));
  // The constructor checks the same before any split, on every rank alike.
  const auto& world = test::world().group();
  EXPECT_THROW(comm::Topology(world, {.tensor_parallel_size = world.size() + 1}), ConfigError);
  world.barrier();
}

}  // namespace
