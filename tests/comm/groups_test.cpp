// Group splitting (DeepSpeed's dp/ep/edp layout) and collectives on the sub-groups.
#include <gtest/gtest.h>

#include "comm/comm.h"
#include "tests/support/mpi_test_env.h"

using namespace zs;
using memory::DType;
using memory::Tensor;

namespace {

int sum_of_world_ranks(const comm::Group& g) {
  Tensor x = Tensor::empty({1}, DType::kI32);
  x.data<int32_t>()[0] = test::world().rank();
  g.allreduce(x);
  return x.data<int32_t>()[0];
}

TEST(Groups, ExpertLayoutForEveryDivisor) {
  auto& world = test::world();
  const int n = world.size(), r = world.rank();
  for (int e = 1; e <= n; ++e) {
    if (n % e != 0) {
      EXPECT_THROW(world.split_groups(e), ConfigError);
      continue;
    }
    auto groups = world.split_groups(e);
    EXPECT_EQ(groups.dp.size(), n);
    EXPECT_EQ(groups.dp.rank(), r);
    EXPECT_EQ(groups.ep.size(), e);
    EXPECT_EQ(groups.ep.rank(), r % e);
    EXPECT_EQ(groups.edp.size(), n / e);
    EXPECT_EQ(groups.edp.rank(), r / e);
    EXPECT_EQ(groups.ep.name(), "ep");
    // ep = {k*e .. k*e+e-1}; edp = {i, i+e, ...}
    const int k = r / e, i = r % e;
    int ep_sum = 0, edp_sum = 0;
    for (int j = 0; j < e; ++j) ep_sum += k * e + j;
    for (int j = i; j < n; j += e) edp_sum += j;
    EXPECT_EQ(sum_of_world_ranks(groups.ep), ep_sum) << "e=" << e;
    EXPECT_EQ(sum_of_world_ranks(groups.edp), edp_sum) << "e=" << e;
    EXPECT_EQ(sum_of_world_ranks(groups.dp), n * (n - 1) / 2);
  }
  EXPECT_THROW(world.split_groups(0), ConfigError);
}

TEST(Groups, SplitOddEvenAndAsyncOnTwoGroups) {
  auto& world = test::world();
  const auto& g = world.group();
  comm::Group parity = g.split(g.rank() % 2, g.rank(), "parity");
  EXPECT_EQ(parity.size(), (g.size() + 1 - g.rank() % 2) / 2);
  Tensor a = Tensor::empty({1000}, DType::kF32);
  Tensor b = Tensor::empty({1000}, DType::kF32);
  for (int i = 0; i < 1000; ++i) a.data<float>()[i] = b.data<float>()[i] = 1.0f;
  comm::Work wa = parity.allreduce_async(a);
  comm::Work wb = g.allreduce_async(b);
  wb.wait();
  wa.wait();
  EXPECT_EQ(a.data<float>()[999], static_cast<float>(parity.size()));
  EXPECT_EQ(b.data<float>()[999], static_cast<float>(g.size()));
}

TEST(Groups, DupHasItsOwnConfig) {
  const auto& g = test::world().group();
  comm::Group d = g.dup("quick", comm::CommConfig{.timeout_s = 3});
  EXPECT_EQ(d.config().timeout_s, 3);
  EXPECT_EQ(d.size(), g.size());
  EXPECT_EQ(d.rank(), g.rank());
  EXPECT_THROW(g.dup("bad", comm::CommConfig{.timeout_s = 0}), ConfigError);
  d.barrier();
}

// Group::start_trace (comms_logger.trace_file): every collective of the World from then on, with its
// group, the thread it ran on, its bytes, in the order and at the times it ran.
TEST(Groups, TraceRecordsEachCollectiveWithItsGroupThreadAndBytes) {
  auto& world = test::world();
  world.flush();  // nothing queued: the synchronous call runs on this thread
  world.group().start_trace();
  auto groups = world.split_groups(1);
  const size_t start = world.group().trace().size();
  Tensor x = Tensor::empty({256}, DType::kF32);
  for (int i = 0; i < 256; ++i) x.data<float>()[i] = static_cast<float>(i);
  groups.dp.allreduce(x);
  comm::Work w = groups.dp.allreduce_async(x);
  w.wait();
  const std::vector<comm::TraceEvent> t = world.group().trace();
  ASSERT_EQ(t.size(), start + 2);
  const comm::TraceEvent& sync = t[start];
  const comm::TraceEvent& async = t[start + 1];
  for (const comm::TraceEvent* e : {&sync, &async}) {
    EXPECT_EQ(e->name, "allreduce");
    EXPECT_EQ(e->group, "dp");
    EXPECT_GE(e->seconds, 0.0);
    // A group of one moves nothing (CommCounters' rule); otherwise the same call's bytes each time.
    EXPECT_EQ(e->bytes_sent, world.size() > 1 ? w.bytes_sent() : 0u);
    EXPECT_EQ(e->bytes_inter_host, 0u);  // one host
  }
  EXPECT_FALSE(sync.on_worker);
  EXPECT_TRUE(async.on_worker);
  EXPECT_GE(async.start_s, sync.start_s + sync.seconds - 1e-6);  // after it, on the same clock
  if (world.size() > 1) {
    EXPECT_GT(sync.bytes_sent, 0u);
  }
}

}  // namespace
