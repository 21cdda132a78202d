// A world of one started without mpirun: same API, no MPI, collectives are local copies.
#include <gtest/gtest.h>

#include "comm/comm.h"
#include "memory/tensor.h"

using namespace zs;
using memory::DType;
using memory::Tensor;

TEST(LocalWorld, CreateWithoutLauncherIsAWorldOfOne) {
  auto world = comm::World::create(comm::CommConfig{.timeout_s = 2});
  EXPECT_FALSE(world.is_mpi());
  EXPECT_EQ(world.size(), 1);
  EXPECT_EQ(world.rank(), 0);
  const auto& g = world.group();
  Tensor x = Tensor::empty({5}, DType::kBF16);
  for (int i = 0; i < 5; ++i) x.data<uint16_t>()[i] = memory::f32_to_bf16(1.5f * i);
  g.allreduce(x, comm::ReduceOp::kAverage);
  g.allreduce_async(x).wait();
  for (int i = 0; i < 5; ++i) EXPECT_EQ(memory::bf16_to_f32(x.data<uint16_t>()[i]), 1.5f * i);

  Tensor in = Tensor::empty({3}, DType::kF32);
  for (int i = 0; i < 3; ++i) in.data<float>()[i] = static_cast<float>(i + 1);
  Tensor out = Tensor::empty({3}, DType::kF32);
  std::vector<size_t> counts{3};
  g.reduce_scatter(in, out, counts);
  EXPECT_EQ(out.data<float>()[2], 3.0f);
  Tensor gathered = Tensor::empty({3}, DType::kF32);
  g.allgather(in, gathered);
  EXPECT_EQ(gathered.data<float>()[1], 2.0f);
  g.alltoall(in, out);
  g.broadcast(in, 0);
  g.barrier();
  EXPECT_THROW(g.broadcast(in, 1), CommError);

  auto groups = world.split_groups(1);
  EXPECT_EQ(groups.ep.size(), 1);
  EXPECT_FALSE(groups.edp.is_mpi());
  EXPECT_THROW(world.split_groups(2), ConfigError);
  // Point-to-point needs another rank: a group of one has none (comm/group.h).
  EXPECT_THROW(g.send(in, 0), CommError);
  EXPECT_THROW(g.recv_async(out, 0), CommError);
  EXPECT_THROW(g.sendrecv(in, 0, out, 0), CommError);
  comm::Topology topo(g, {});
  EXPECT_EQ(topo.data_parallel().size(), 1);
  EXPECT_EQ(topo.pipeline_parallel().name(), "pp");
  EXPECT_THROW(comm::Topology(g, {.pipeline_parallel_size = 2}), ConfigError);
  EXPECT_EQ(world.counters().bytes_sent, 0u);
  EXPECT_GT(world.counters().collectives, 0u);
}

TEST(LocalWorld, RejectsNonPositiveTimeout) {
  EXPECT_THROW(comm::World(comm::World::Launch::kLocal, comm::CommConfig{.timeout_s = 0}), ConfigError);
}
