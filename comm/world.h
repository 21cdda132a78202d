// World: the job's ranks, MPI's lifetime (RAII) and the comm worker thread.
//
//   int main(int argc, char** argv) {
//     try {
//       auto world = zs::comm::World::create(config.comm);         // mpirun, or a world of one
//       auto groups = world.split_groups(expert_parallel_size);    // {dp, ep, edp}
//       world.group().allreduce(grads, zs::comm::ReduceOp::kAverage);
//     } catch (const std::exception& e) {
//       zs::comm::World::abort(e.what(), 1);                       // ends every rank promptly
//     }
//   }
//
// Launch detection (World::create): under mpirun/srun/a PMIx launcher (OMPI_COMM_WORLD_SIZE,
// PMIX_RANK, PMI_RANK or PMI_SIZE set) MPI is initialised with MPI_THREAD_MULTIPLE; without a launcher
// the process is a world of one that never touches MPI (MPI's singleton init would start an orted
// daemon: slower, and it fails in some sandboxes). Both have the same API; a world of one moves no
// bytes. Only the tool edge reads the environment: library code takes a World or Group.
// One World per process (MPI starts once); it finalizes MPI when it and all its Groups are gone,
// except while an exception unwinds the stack: then MPI stays up so that World::abort in the catch
// can end every rank (MPI_Finalize would wait for ranks that are still in a collective).
#pragma once

#include <memory>
#include <string>

#include "comm/config.h"
#include "comm/group.h"

namespace zs::comm {

namespace detail {
class Runtime;
}

// DeepSpeed's layout for expert parallelism of size E on a world of W ranks (W % E == 0):
//   dp  = all ranks (data parallel for dense parameters)
//   ep  = consecutive ranks {k*E, ..., k*E + E-1}: the experts of one layer are spread over them
//   edp = ranks with the same index in their ep group {i, i+E, i+2E, ...}: data parallel for experts
struct ExpertGroups {
  Group dp;
  Group ep;
  Group edp;
};

class World {
 public:
  enum class Launch { kMpi, kLocal };

  // Detects the launcher from the environment (see above). For the tool edge.
  static World create(const CommConfig& config = {});
  // kMpi: initialises MPI (throws CommError if MPI is already initialised or unusable);
  // kLocal: a world of one without MPI. Throws ConfigError for timeout_s <= 0.
  explicit World(Launch launch, const CommConfig& config = {});
  World(World&&) noexcept = default;
  World& operator=(World&&) noexcept = default;
  World(const World&) = delete;
  World& operator=(const World&) = delete;
  ~World();  // waits for queued collectives; finalizes MPI once the last Group is gone

  int rank() const;
  int size() const;
  bool is_mpi() const;
  const CommConfig& config() const { return group_->config(); }
  // All ranks, named "world".
  const Group& group() const { return *group_; }

  // Collective: the DeepSpeed dp/ep/edp groups (ExpertGroups above), those of a comm::Topology with
  // tp = pp = 1 (comm/topology.h). Throws ConfigError when expert_parallel_size < 1 or does not
  // divide size().
  ExpertGroups split_groups(int expert_parallel_size) const;

  // Bytes sent and received by this rank over all groups (counting rule in comm/config.h).
  CommCounters counters() const;
  void reset_counters();
  // Blocks until every queued async collective of this World has finished (errors stay in their Works).
  void flush() const;

  // For the tool edge's top-level catch: prints "zeroshard: rank R: fatal: <message>" to stderr and
  // ends every rank of the job with MPI_Abort(MPI_COMM_WORLD, code) (or _Exit(code) without MPI).
  // Library code never calls it.
  [[noreturn]] static void abort(const std::string& message, int code = 1);

 private:
  std::shared_ptr<detail::Runtime> runtime_;
  std::unique_ptr<Group> group_;
};

}  // namespace zs::comm
