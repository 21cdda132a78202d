// A deliberately broken job for the expected-failure tests (tests/comm/CMakeLists.txt). Modes:
//   mismatch: rank 0 calls allreduce, the others allgather -> CommError on every rank -> abort
//   timeout:  rank 0 calls allreduce, the others never do   -> CommError (timeout) on rank 0 -> abort
//   small_timeout: the same with a small bf16 allreduce (comm/detail/small.h's exchange at any size)
//   abort:    rank 1 throws; the others wait in a barrier   -> rank 1 aborts, every rank ends at once
//   groups:   rank 0 allgathers on the world, the others on a duplicate 'dp' (timeout 120 s)
//             -> CommError naming both at once (Note [Waits across groups]) -> abort
//   p2p_stop: rank 1 stops itself (SIGSTOP) before its send; rank 0's recv times out -> abort
//   p2p_kill: rank 1 kills itself (SIGKILL) before its send; rank 0's recv times out -> abort (run
//             with mpirun --enable-recovery, so that mpirun leaves rank 0 running to say so)
//   shards_stop / shards_kill: rank 1 stops (kills) itself between begin_write and end_write of a
//             comm::SharedShards; rank 0's one-sided gather times out naming it -> abort
// Like the tool edge, main catches every error and calls World::abort.
#include <signal.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "memory/shared_mapping.h"
#include "memory/tensor.h"

using namespace zs;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "mismatch";
  try {
    const bool shards = mode == "shards_stop" || mode == "shards_kill";
    const double timeout_s = mode == "abort" ? 60.0 : mode == "groups" ? 120.0 : shards ? 1.0 : 2.0;  // small_timeout: 2 s
    auto world = comm::World::create(comm::CommConfig{.timeout_s = timeout_s});
    const auto& g = world.group();
    auto data = memory::Tensor::empty({1000}, memory::DType::kF32);
    auto gathered = memory::Tensor::empty({1000 * g.size()}, memory::DType::kF32);
    if (mode == "mismatch") {
      if (g.rank() == 0) {
        g.allreduce(data);
      } else {
        g.allgather(data, gathered);
      }
    } else if (mode == "timeout" || mode == "small_timeout") {
      if (g.rank() == 0) {
        g.allreduce(mode == "timeout" ? data : memory::Tensor::empty({64}, memory::DType::kBF16));
      } else {
        std::this_thread::sleep_for(std::chrono::seconds(40));  // a stuck rank: killed by rank 0's abort
      }
    } else if (mode == "groups") {
      // zeroshard train's shape: its error agreement on the world against the engine's set-up on 'dp'.
      const comm::Group dp = g.dup("dp", world.config());
      auto one = memory::Tensor::empty({g.rank() == 0 ? 1 : 8}, memory::DType::kI32);
      auto all = memory::Tensor::empty({one.numel() * g.size()}, memory::DType::kI32);
      (g.rank() == 0 ? g : dp).allgather(one, all);
    } else if (mode == "p2p_stop" || mode == "p2p_kill") {
      if (g.rank() == 0) {
        g.recv(data, 1);
      } else if (g.rank() == 1) {
        raise(mode == "p2p_stop" ? SIGSTOP : SIGKILL);
        g.send(data, 0);
      } else {
        std::this_thread::sleep_for(std::chrono::seconds(40));  // bystanders: ended by rank 0's abort
      }
    } else if (shards) {
      // A one-sided gather (comm/shared_shards.h) from a peer that stopped or died in its "optimizer
      // step", before publishing its shard's next version.
      memory::SharedMapping mem = memory::SharedMapping::create(size_t{1} << 20);
      comm::SharedArena arena(g, &mem);
      comm::SharedShards shards(g, mem.data(), data.numel() * sizeof(float));
      if (!shards.active()) throw CommError("one-sided gathers inactive: " + shards.inactive_reason());
      shards.begin_write();
      if (g.rank() == 1) raise(mode == "shards_stop" ? SIGSTOP : SIGKILL);
      shards.end_write();
      if (g.rank() == 0) {
        const std::vector<size_t> counts(static_cast<size_t>(g.size()), 1000), offsets(static_cast<size_t>(g.size()), 0);
        shards.allgatherv(offsets, gathered, counts);
      } else {
        std::this_thread::sleep_for(std::chrono::seconds(40));  // bystanders: ended by rank 0's abort
      }
    } else if (mode == "abort") {
      if (g.rank() == 1) throw CommError("deliberate failure on rank 1 (tests/comm/mismatch_main.cpp)");
      g.barrier();
    }
    return 0;
  } catch (const std::exception& e) {
    comm::World::abort(e.what(), 3);
  }
}
