// gtest main for MPI tests: see tests/support/CMakeLists.txt and mpi_test_env.h.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

#include "comm/world.h"
#include "memory/tensor.h"
#include "tests/support/kernel_flags.h"
#include "tests/support/mpi_test_env.h"

namespace zs::test {
namespace {

comm::World* g_world = nullptr;

// Printer for ranks other than 0: failures only, each line prefixed with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stdout, "[rank %d] %s:%d: Failure\n[rank %d] %s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), rank_, r.message());
    std::fflush(stdout);
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stdout, "[rank %d] [  FAILED  ] %s.%s\n", rank_, info.test_suite_name(), info.name());
      std::fflush(stdout);
    }
  }

 private:
  int rank_;
};

}  // namespace

comm::World& world() { return *g_world; }

}  // namespace zs::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // Before the World: a kernel variant this CPU cannot run ends every rank with the same code.
  if (const int code = zs::test::take_kernel_flags(argc, argv); code >= 0) return code;
  try {
    // --shm-node-ranks=K: the World treats blocks of K ranks as nodes (CommConfig::shared_memory_node_ranks),
    // so a test can run the shared-memory collectives' multi-node path on one machine.
    zs::comm::CommConfig config{.timeout_s = 60};
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg.rfind("--shm-node-ranks=", 0) == 0) config.shared_memory_node_ranks = std::stoi(arg.substr(17));
    }
    auto world = std::make_unique<zs::comm::World>(zs::comm::World::create(config));
    zs::test::g_world = world.get();
    if (world->rank() != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new zs::test::FailurePrinter(world->rank()));
    }
    int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
    // The job fails when any rank fails.
    auto flag = zs::memory::Tensor::empty({1}, zs::memory::DType::kI32);
    flag.data<int32_t>()[0] = failed;
    world->group().allreduce(flag);
    const int failed_ranks = flag.data<int32_t>()[0];
    if (failed_ranks > 0 && world->rank() == 0) {
      std::fprintf(stdout, "[==========] %d of %d ranks had failures\n", failed_ranks, world->size());
    }
    zs::test::g_world = nullptr;
    world.reset();
    return failed_ranks > 0 ? 1 : 0;
  } catch (const std::exception& e) {
    zs::comm::World::abort(std::string("MPI test main: ") + e.what(), 2);
  }
}
